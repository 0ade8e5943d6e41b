"""The crypto experiment: the format against raw AES-GCM, random reads, streaming RSS.

Cases, all interleaved (A B C A B C ...), each run in a fresh worker:

- ``seq-encrypt`` / ``seq-decrypt``, one thread and one thread per core:
  ``cryptography``'s AES-GCM on 64 KiB buffers (``raw AES-GCM``) against
  :class:`~cryptdisk.format.SealedWriter` / :class:`~cryptdisk.format.SealedReader`
  on ciphertext in memory (``format (memory)``, fed 256 KiB writes, and with
  64 KiB writes, the chunk ``shutil.copyfileobj`` uses) and on a page-cached file
  through :func:`cryptdisk.open` (``format (file)``).
- ``random-read 4 KiB`` / ``64 KiB``: ``pread`` per second, plain ``os.pread`` vs
  ``cryptdisk.open(...).pread``.
- ``stream encrypt/decrypt/verify``: a whole file of ``--size`` bytes through the
  public API; the figure that matters is the worker's peak RSS (target < 100 MB).

Target (issue 2): format >= 80% of raw AES-GCM on one thread, scaling with threads.
"""

from __future__ import annotations

import os
import shutil
import statistics

from ._model import BenchOptions, Measurement, Progress, Recorder
from ._stats import ratio_of
from ._suite import Strategy, ensure_cleanup, interleave

__all__ = ["NOTES", "run"]

NOTES: list[str] = []
_B = "cryptdisk.bench._bodies_crypto:"
MiB = 1 << 20


def _write_files(workdir: str, key_hex: str, size: int, progress: Progress) -> tuple[str, str]:
    """A plain file and its sealed copy, both ``size`` bytes of plaintext."""
    import cryptdisk
    from cryptdisk.keys import Keyring

    plain, sealed = os.path.join(workdir, "plain.bin"), os.path.join(workdir, "sealed.cd")
    block = bytearray(os.urandom(MiB))
    keyring = Keyring.single(bytes.fromhex(key_hex))
    with open(plain, "wb") as fp, cryptdisk.open(sealed, "wb", keyring=keyring) as fc:
        for i in range(size // MiB):
            block[:8] = i.to_bytes(8, "little")
            fp.write(block)
            fc.write(block)
            if i % 64 == 0:
                progress("crypto: writing test files", i, size // MiB)
    return plain, sealed


def _throughput(options: BenchOptions, key_hex: str, plain: str, sealed: str,
                total: int) -> list[Strategy]:
    threads = options.threads or os.cpu_count() or 1
    wd = str(options.workdir)
    raw, b = "raw AES-GCM", _B
    out: list[Strategy] = []
    for n in sorted({1, threads}):
        enc, dec = f"seq-encrypt threads={n}", f"seq-decrypt threads={n}"
        common = dict(total=total, threads=n)
        out += [
            Strategy(raw, b + "raw_aesgcm", dict(common, direction="encrypt", case=enc)),
            Strategy("format (memory)", b + "format_encrypt",
                     dict(common, key_hex=key_hex, sink="memory", workdir=wd, case=enc), None, raw),
            Strategy("plain (file)", b + "plain_file",
                     dict(common, path=f"{wd}/w", direction="encrypt", case=enc), None, raw),
            Strategy("format (memory, 64 KiB writes)", b + "format_encrypt",
                     dict(common, key_hex=key_hex, sink="memory", workdir=wd, case=enc,
                          chunk_size=64 * 1024), None, raw),
            Strategy("format (file)", b + "format_encrypt",
                     dict(common, key_hex=key_hex, sink="file", workdir=wd, case=enc), None,
                     "plain (file)"),
            Strategy(raw, b + "raw_aesgcm", dict(common, direction="decrypt", case=dec)),
            Strategy("raw AES-GCM (memory)", b + "raw_aesgcm",
                     dict(common, direction="decrypt", case=dec, stream=True), None, raw),
            Strategy("format (memory)", b + "format_decrypt",
                     dict(path=sealed, threads=n, key_hex=key_hex, source="memory", case=dec),
                     None, "raw AES-GCM (memory)"),
            Strategy("plain (file)", b + "plain_file",
                     dict(common, path=plain, direction="decrypt", case=dec), None, raw),
            Strategy("format (file)", b + "format_decrypt",
                     dict(path=sealed, threads=n, key_hex=key_hex, source="file", case=dec),
                     None, "plain (file)"),
        ]
    return out


def _random(key_hex: str, plain: str, sealed: str, duration: float) -> list[Strategy]:
    out = []
    for block in (4096, 65536):
        case = f"random-read {block // 1024} KiB"
        out += [Strategy("plain", _B + "random_reads",
                         dict(path=plain, key_hex=None, block=block, duration=duration, case=case)),
                Strategy("cryptdisk", _B + "random_reads",
                         dict(path=sealed, key_hex=key_hex, block=block, duration=duration,
                              case=case))]
    return out


def _stream(options: BenchOptions, key_hex: str, size: int, progress: Progress) -> list[Strategy]:
    wd = options.workdir / "stream"
    wd.mkdir(exist_ok=True)
    src = str(wd / "big.bin")
    block = os.urandom(MiB)
    with open(src, "wb") as f:
        for i in range(size // MiB):
            f.write(block)
            if i % 256 == 0:
                progress(f"crypto: writing a {size / 1e9:.1f} GB file", i, size // MiB)
    enc, dec = str(wd / "big.cd"), str(wd / "big.out")
    label = f"stream {{}} {size / MiB:,.0f} MiB"
    return [
        Strategy("interpreter baseline", _B + "noop", dict(case="import cryptdisk only")),
        Strategy("cryptdisk", _B + "stream_op",
                 dict(op="encrypt", src=src, dst=enc, key_hex=key_hex,
                      case=label.format("encrypt"))),
        Strategy("cryptdisk", _B + "stream_op",
                 dict(op="verify", src=enc, dst="", key_hex=key_hex,
                      case=label.format("verify"))),
        Strategy("cryptdisk", _B + "stream_op",
                 dict(op="decrypt", src=enc, dst=dec, key_hex=key_hex,
                      case=label.format("decrypt"))),
    ]


def _judge(ms: list[Measurement]) -> list[str]:
    """The issue's target, stated from the measurements."""
    by = {(m.case, m.strategy): m for m in ms}
    notes = []
    for case, base in (("seq-encrypt threads=1", "raw AES-GCM"),
                       ("seq-decrypt threads=1", "raw AES-GCM (memory)")):
        raw, fmt = by.get((case, base)), by.get((case, "format (memory)"))
        if raw and fmt:
            r = ratio_of(fmt, raw)
            assert r is not None
            verdict = "meets" if r.median >= 0.8 else "MISSES"
            notes.append(f"{case}: format (memory) reaches {r.median:.1%} of {base} "
                         f"(paired runs, {r.low:.0%}-{r.high:.0%}; {verdict} the 80% target).")
    for m in ms:
        if m.case.startswith("stream") and m.unit == "MB/s" and m.peak_rss_mb is not None:
            ok = "under" if m.peak_rss_mb < 100 else "OVER"
            notes.append(f"{m.case}: peak RSS {m.peak_rss_mb:.0f} MiB ({ok} the 100 MB target).")
    for strategy in ("raw AES-GCM", "format (memory)"):
        one = by.get(("seq-encrypt threads=1", strategy))
        many = [m for m in ms if m.strategy == strategy and m.case.startswith("seq-encrypt")
                and m is not one]
        if one and many:
            scale = statistics.median(many[0].values) / statistics.median(one.values)
            notes.append(f"Scaling, {strategy} encrypt: {many[0].case} is {scale:.2f}x one thread "
                         "(on a shared machine the second core may be busy: see the load "
                         "average above).")
    return notes


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Run the crypto experiment (see the module docstring)."""
    ensure_cleanup(options)
    NOTES.clear()
    key_hex = os.urandom(32).hex()
    repeats = options.pick(5, 7, options.repeats)
    total = options.pick(256 * MiB, 2048 * MiB)
    duration = options.pick(0.5, 3.0, options.duration)
    size = options.pick(128 * MiB, 4096 * MiB, options.size)
    size = max(MiB, size // MiB * MiB)
    seen: list[Measurement] = []

    def keep(item: object) -> None:
        if isinstance(item, Measurement):
            seen.append(item)
        record(item)  # type: ignore[arg-type]

    try:
        plain, sealed = _write_files(str(options.workdir), key_hex, total, progress)
        interleave(options, "crypto", _throughput(options, key_hex, plain, sealed, total), keep,
                   progress, "crypto: sequential encrypt/decrypt", repeats)
        interleave(options, "crypto", _random(key_hex, plain, sealed, duration), keep,
                   progress, "crypto: random reads", repeats)
        for name in (plain, sealed):
            os.unlink(name)
        interleave(options, "crypto", _stream(options, key_hex, size, progress), keep,
                   progress, "crypto: streaming a large file (peak RSS)", 1)
    finally:
        shutil.rmtree(options.workdir / "stream", ignore_errors=True)
    NOTES.extend(_judge(seen))
    NOTES.append(f"Sequential runs move {total / MiB:.0f} MiB each; random reads run "
                 f"{duration:g} s each; the streaming file is {size / MiB:.0f} MiB. Peak RSS is "
                 "VmHWM of the worker process that ran the case (a fresh interpreter). "
                 "'format (memory)' decrypt and 'raw AES-GCM (memory)' hold the whole "
                 "ciphertext in memory by design; cryptdisk.open() reads files with preadv "
                 "into reused buffers (never mapped).")
