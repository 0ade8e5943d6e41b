"""The file commands end to end, run as a user runs them (subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "cryptdisk"]


def run(*args: str, input: bytes | None = None, env: dict | None = None, cwd: Path | None = None):
    full_env = {**os.environ, **(env or {})}
    full_env.pop("CRYPTDISK_KEYRING", None)
    return subprocess.run([*CLI, *args], input=input, capture_output=True, env=full_env, cwd=cwd,
                          timeout=120)


@pytest.fixture
def keyfile(tmp_path):
    path = tmp_path / "k.hex"
    r = run("keygen", "-o", str(path))
    assert r.returncode == 0, r.stderr
    assert b"0600" in r.stderr and oct(path.stat().st_mode & 0o777) == "0o600"
    return path


def _no_traceback(r):
    assert b"Traceback" not in r.stderr


def test_encrypt_inspect_verify_decrypt(tmp_path, keyfile):
    plain = tmp_path / "p.bin"
    plain.write_bytes(os.urandom(200_000))
    enc, out = tmp_path / "e.cd", tmp_path / "out.bin"
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    r = run("inspect", str(enc), "--json")
    info = json.loads(r.stdout)
    assert info["format"] == "cryptdisk" and info["plaintext_size"] == 200_000
    assert info["key_id"] == 1 and info["algorithm"] == "aes-256-gcm"
    assert keyfile.read_text().split()[-1] not in r.stdout.decode()
    r = run("verify", str(enc), "--key-file", str(keyfile))
    assert r.returncode == 0 and b"OK" in r.stdout
    assert run("decrypt", str(enc), str(out), "--key-file", str(keyfile)).returncode == 0
    assert out.read_bytes() == plain.read_bytes()


def test_stdin_stdout_pipes(tmp_path, keyfile):
    data = os.urandom(150_000)
    enc = run("encrypt", "-", "-", "--key-file", str(keyfile), input=data)
    assert enc.returncode == 0 and enc.stdout[:8] == b"CRYPTDSK"
    dec = run("decrypt", "-", "-", "--key-file", str(keyfile), input=enc.stdout)
    assert dec.returncode == 0 and dec.stdout == data
    cat = run("cat", "-", "--key-file", str(keyfile), input=enc.stdout)
    assert cat.stdout == data
    truncated = run("decrypt", "-", "-", "--key-file", str(keyfile), input=enc.stdout[:-100])
    assert truncated.returncode == 1 and b"cryptdisk: error:" in truncated.stderr
    _no_traceback(truncated)


def _encrypted_and_tampered(tmp_path, keyfile, offset: int, bit: int):
    """A 300,000-byte random file encrypted, and a copy with ``bit`` flipped at ``offset``."""
    plain = tmp_path / "p"
    plain.write_bytes(os.urandom(300_000))
    good, bad = tmp_path / "good.cd", tmp_path / "bad.cd"
    run("encrypt", str(plain), str(good), "--key-file", str(keyfile))
    raw = bytearray(good.read_bytes())
    raw[offset] ^= bit
    bad.write_bytes(raw)
    return good, bad


def test_verify_names_file_and_offset_on_tamper(tmp_path, keyfile):
    good, bad = _encrypted_and_tampered(tmp_path, keyfile, 100_000, 4)
    r = run("verify", str(good), str(bad), "--key-file", str(keyfile))
    assert r.returncode == 1
    assert b"OK  " + str(good).encode() in r.stdout
    err = r.stderr.decode()
    assert str(bad) in err and "segment 1 at offset 65680" in err
    assert err.startswith("cryptdisk: error:")
    _no_traceback(r)


def test_decrypt_of_tampered_file_leaves_no_output(tmp_path, keyfile):
    _, enc = _encrypted_and_tampered(tmp_path, keyfile, 200_000, 1)
    out = tmp_path / "out"
    r = run("decrypt", str(enc), str(out), "--key-file", str(keyfile))
    assert r.returncode == 1 and not out.exists()
    assert not list(tmp_path.glob(".*cdtmp"))


@pytest.mark.parametrize("args, message", [
    (["--key-env", "CD_NOT_SET_ANYWHERE"], "CD_NOT_SET_ANYWHERE is not set"),
    (["--key-hex", "abcd"], "hex digits"),
    (["--key-file", "/nonexistent/k.hex"], "does not exist"),
    ([], "no key given"),
    (["--key-hex", "00" * 32], "not the key this file was encrypted with"),
])
def test_key_errors_are_one_line(tmp_path, keyfile, args, message):
    enc = tmp_path / "e.cd"
    run("encrypt", "-", str(enc), "--key-file", str(keyfile), input=b"hello")
    r = run("decrypt", str(enc), "-", *args)
    assert r.returncode == 1
    first = r.stderr.decode().splitlines()
    assert any(line.startswith("cryptdisk: error:") and message in line for line in first), first
    _no_traceback(r)


def test_not_a_cryptdisk_file(tmp_path, keyfile):
    p = tmp_path / "plain.txt"
    p.write_text("hello world, this is plaintext")
    r = run("inspect", str(p))
    assert r.returncode == 1 and b"not an encrypted file" in r.stderr
    r = run("verify", str(p), "--key-file", str(keyfile))
    assert r.returncode == 1 and b"not an encrypted file" in r.stderr
    _no_traceback(r)


def test_key_hex_warns_about_process_listings(tmp_path):
    r = run("encrypt", "-", str(tmp_path / "e"), "--key-hex", "11" * 32, input=b"x")
    assert r.returncode == 0 and b"process listings" in r.stderr


def test_keyring_config_and_rewrap(tmp_path):
    k1, k2 = tmp_path / "k1.hex", tmp_path / "k2.hex"
    run("keygen", "-o", str(k1), "--id", "1")
    run("keygen", "-o", str(k2), "--id", "2")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\nfile = "{k1}"\n')
    d = tmp_path / "d"
    d.mkdir()
    for i in range(5):
        run("encrypt", "-", str(d / f"{i}.cd"), "--keyring", str(cfg), input=b"row %d" % i)
    cfg.write_text(f'[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 1\nfile = "{k1}"\n'
                   f'[[keyring.keys]]\nid = 2\nfile = "{k2}"\n')
    r = run("rewrap", str(d), "--keyring", str(cfg))
    assert r.returncode == 0 and b"rewrapped 5 file(s) under key 2" in r.stdout
    for i in range(5):
        out = run("cat", str(d / f"{i}.cd"), "--key-file", str(k2), "--key-id", "2")
        assert out.stdout == b"row %d" % i
        assert json.loads(run("inspect", str(d / f"{i}.cd"), "--json").stdout)["key_id"] == 2


def test_a_key_file_keeps_the_id_keygen_gave_it(tmp_path):
    """keygen --id 2 notes the id in the file and its config snippet says id = 2: files
    encrypted with --key-file are under key 2, so that config reads them."""
    key = tmp_path / "k2.hex"
    assert run("keygen", "-o", str(key), "--id", "2").returncode == 0
    plain = tmp_path / "p.txt"
    plain.write_bytes(b"hello")
    r = run("encrypt", str(plain), str(tmp_path / "p.cd"), "--key-file", str(key))
    assert r.returncode == 0, r.stderr
    assert b"key id          2\n" in run("inspect", str(tmp_path / "p.cd")).stdout
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 2\nfile = "{key}"\n')
    r = run("cat", str(tmp_path / "p.cd"), "--keyring", str(cfg))
    assert r.returncode == 0 and r.stdout == b"hello", r.stderr
    # --key-id may name the id a file notes, never another one
    ok = run("verify", str(tmp_path / "p.cd"), "--key-file", str(key), "--key-id", "2")
    assert ok.returncode == 0, ok.stderr
    bad = run("verify", str(tmp_path / "p.cd"), "--key-file", str(key), "--key-id", "1")
    assert bad.returncode == 1
    first = bad.stderr.decode().splitlines()[0]
    assert first.startswith("cryptdisk: error: ")
    assert first.endswith(f"--key-id 1: the key file {key} is key 2")
    _no_traceback(bad)


def test_a_directory_where_a_file_goes_is_named(tmp_path, keyfile):
    """Every file command given a directory says which path is one, never a temporary's
    name or a bare 'Is a directory'."""
    plain, enc, folder = tmp_path / "p.txt", tmp_path / "p.cd", tmp_path / "a dir"
    plain.write_bytes(b"hello")
    folder.mkdir()
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    for argv in (("encrypt", str(plain), str(folder)), ("decrypt", str(enc), str(folder)),
                 ("encrypt", str(folder), str(tmp_path / "x.cd")), ("cat", str(folder)),
                 ("decrypt", str(folder), str(tmp_path / "x.txt"))):
        r = run(*argv, "--key-file", str(keyfile))
        assert r.returncode == 1, argv
        assert r.stderr.decode() == f"cryptdisk: error: {folder}: Is a directory\n", argv
    assert sorted(os.listdir(tmp_path)) == ["a dir", "k.hex", "p.cd", "p.txt"]
    assert os.listdir(folder) == []


def test_keygen_prints_hex():
    r = run("keygen", "--print")
    assert r.returncode == 0 and len(bytes.fromhex(r.stdout.decode().strip())) == 32


def test_demo_runs():
    r = run("demo", "--files", "--rows", "2000")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "plaintext found in the encrypted file: False" in out
    assert "SegmentAuthenticationError" in out and "only the new key: True" in out


def test_clickhouse_files_through_an_xml_config(tmp_path):
    """decrypt/cat/inspect/verify recognise ClickHouse's ENC header and find the key by
    fingerprint in a ClickHouse storage_configuration given with --config."""
    from cryptdisk.format.clickhouse import CHAlgorithm, open_clickhouse

    key_hex = "00112233445566778899aabbccddeeff"
    xml = tmp_path / "storage.xml"
    xml.write_text(f"""<clickhouse><storage_configuration><disks>
<local_disk><path>{tmp_path}/d/</path></local_disk>
<enc><type>encrypted</type><disk>local_disk</disk><path>enc/</path>
<key_hex id="7">{key_hex}</key_hex><current_key_id>7</current_key_id>
<algorithm>AES_128_CTR</algorithm></enc>
</disks></storage_configuration></clickhouse>""")
    data = os.urandom(70_000)
    path = tmp_path / "data.bin"
    with open_clickhouse(path, "wb", key=bytes.fromhex(key_hex),
                         algorithm=CHAlgorithm.AES_128_CTR) as f:
        f.write(data)
    info = json.loads(run("inspect", str(path), "--json").stdout)
    assert info["format"] == "clickhouse" and info["key_fingerprint"] == \
        "75264928bd0f327f80f1af4b93f2cd69"
    assert run("cat", str(path), "--config", str(xml)).stdout == data
    out = tmp_path / "out"
    assert run("decrypt", str(path), str(out), "--config", str(xml)).returncode == 0
    assert out.read_bytes() == data
    r = run("verify", str(path), "--config", str(xml))
    assert r.returncode == 0 and b"no authentication" in r.stdout
    other = tmp_path / "other.xml"
    other.write_text(xml.read_text().replace(key_hex, "ff" * 16))
    r = run("cat", str(path), "--config", str(other))
    assert r.returncode == 1 and b"75264928bd0f327f80f1af4b93f2cd69" in r.stderr
    assert key_hex.encode() not in r.stderr and b"ff" * 16 not in r.stderr
    _no_traceback(r)


def _unblock_sigpipe() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGPIPE})


def test_cat_into_a_closed_pipe_ends_quietly_like_cat(tmp_path, keyfile):
    """`cryptdisk cat big.cd | head`: no message, and the status `cat` gets (SIGPIPE)."""
    plain = tmp_path / "big"
    plain.write_bytes(os.urandom(4 << 20))
    enc = tmp_path / "big.cd"
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "CRYPTDISK_KEYRING"}
    for argv in ([*CLI, "cat", str(enc), "--key-file", str(keyfile)], ["cat", str(plain)]):
        # A library loaded by an earlier test (chdb's threads) may have blocked SIGPIPE in
        # this process, and children inherit the mask: `cat` would then see EPIPE instead.
        # cryptdisk unblocks it itself (the next test); start both with a clean mask here.
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                preexec_fn=_unblock_sigpipe)
        assert len(proc.stdout.read(10)) == 10
        proc.stdout.close()  # what `head` does once it has its lines
        stderr = proc.stderr.read()
        proc.stderr.close()
        assert proc.wait(timeout=60) == -signal.SIGPIPE, argv
        assert stderr == b"", stderr


def test_cat_into_a_closed_pipe_ends_by_sigpipe_even_when_the_parent_blocked_it(tmp_path, keyfile):
    """A blocked SIGPIPE is inherited across exec; cryptdisk unblocks it to end like `cat`."""
    plain = tmp_path / "big"
    plain.write_bytes(os.urandom(4 << 20))
    enc = tmp_path / "big.cd"
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "CRYPTDISK_KEYRING"}
    proc = subprocess.Popen(
        [*CLI, "cat", str(enc), "--key-file", str(keyfile)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE}))
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == -signal.SIGPIPE
    assert stderr == b"", stderr


def test_encrypt_and_decrypt_into_a_missing_directory_name_the_output(tmp_path, keyfile):
    plain = tmp_path / "data.csv"
    plain.write_text("a,b\n1,2\n")
    enc = tmp_path / "data.cd"
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    out = tmp_path / "nope" / "out.cd"
    for args in (("encrypt", str(plain), str(out)), ("decrypt", str(enc), str(out))):
        r = run(*args, "--key-file", str(keyfile))
        assert r.returncode == 1
        assert r.stderr.decode() == f"cryptdisk: error: {out}: No such file or directory\n"


@pytest.mark.parametrize("cut", [1, 5000, 65536 + 16])
def test_a_truncated_file_is_called_truncated(tmp_path, keyfile, cut):
    plain = tmp_path / "p.bin"
    plain.write_bytes(os.urandom(300_000))
    enc = tmp_path / "e.cd"
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    data = enc.read_bytes()
    short = tmp_path / "short.cd"
    short.write_bytes(data[:-cut])
    r = run("inspect", str(short), "--key-file", str(keyfile))
    assert r.returncode == 1 and b"truncated" in r.stderr, r.stdout
    _no_traceback(r)
    for args in (("decrypt", str(short), str(tmp_path / "out")), ("cat", str(short)),
                 ("verify", str(short))):
        r = run(*args, "--key-file", str(keyfile))
        assert r.returncode == 1 and b"truncated" in r.stderr, (args, r.stderr)
    r = run("decrypt", "-", "-", "--key-file", str(keyfile), input=data[:-cut])
    assert r.returncode == 1 and b"truncated" in r.stderr
    assert not (tmp_path / "out").exists()
    whole = json.loads(run("inspect", str(enc), "--json", "--key-file", str(keyfile)).stdout)
    assert whole["last_segment"] == "authenticated" and whole["plaintext_size"] == 300_000
    keyless = json.loads(run("inspect", str(enc), "--json").stdout)
    assert keyless["last_segment"] == "not checked (no key given)"


def test_an_edit_inside_a_one_segment_file_is_not_called_truncation(tmp_path, keyfile):
    """A bit flipped in the middle of a small file's only (so last) segment: its length still
    fits the header, so the error names an edit, a cut and a wrong key, and claims none."""
    plain = tmp_path / "p.txt"
    plain.write_bytes(b"x" * 1000)
    enc = tmp_path / "e.cd"
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    data = bytearray(enc.read_bytes())
    data[128 + 500] ^= 0x04
    enc.write_bytes(bytes(data))
    for args in (("verify", str(enc)), ("cat", str(enc)), ("inspect", str(enc)),
                 ("decrypt", str(enc), str(tmp_path / "out"))):
        r = run(*args, "--key-file", str(keyfile))
        err = r.stderr.decode()
        assert r.returncode == 1 and "segment 0 at offset 128" in err, (args, err)
        assert "the file is truncated" not in err and "its bytes were altered" in err, err
        assert "sealed with a different key" in err, err
        _no_traceback(r)
    assert not (tmp_path / "out").exists()


def test_keygen_and_inspect_explain_themselves():
    for command, words in (("keygen", "losing it loses the data"),
                           ("inspect", "authenticates the last segment")):
        r = run(command, "--help")
        assert r.returncode == 0 and words in " ".join(r.stdout.decode().split())


@pytest.mark.parametrize("command", ["encrypt", "decrypt"])
def test_an_existing_output_is_refused_without_force(tmp_path, keyfile, command):
    """Like `cryptdisk sqlite encrypt`: an existing OUTPUT is kept, and the message says
    how to replace it; --force replaces it."""
    plain, enc = tmp_path / "p.txt", tmp_path / "p.cd"
    plain.write_bytes(b"hello")
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    src = plain if command == "encrypt" else enc
    out = tmp_path / "existing"
    out.write_bytes(b"keep me")
    r = run(command, str(src), str(out), "--key-file", str(keyfile))
    assert r.returncode == 1
    assert r.stderr.decode() == (f"cryptdisk: error: {out} already exists; refusing to "
                                 "overwrite it\ncryptdisk: hint: choose another output, or "
                                 "pass --force to replace it\n")
    assert out.read_bytes() == b"keep me"
    r = run(command, "-", str(out), "--key-file", str(keyfile), input=src.read_bytes())
    assert r.returncode == 1 and b"already exists" in r.stderr
    assert out.read_bytes() == b"keep me"
    assert sorted(os.listdir(tmp_path)) == ["existing", "k.hex", "p.cd", "p.txt"]
    r = run(command, str(src), str(out), "--key-file", str(keyfile), "--force")
    assert r.returncode == 0, r.stderr
    dec = run("cat", str(out if command == "encrypt" else enc), "--key-file", str(keyfile))
    assert dec.stdout == b"hello"
    if command == "decrypt":
        assert out.read_bytes() == b"hello"


def test_in_place_needs_force_and_round_trips(tmp_path, keyfile):
    """OUTPUT = INPUT is refused as the input, not merely as an existing file; with --force
    encrypt and decrypt convert the file in place, leaving no temporary behind."""
    plain = tmp_path / "p.bin"
    data = os.urandom(200_000)
    plain.write_bytes(data)
    for command in ("encrypt", "decrypt"):
        r = run(command, str(plain), str(plain), "--key-file", str(keyfile))
        assert r.returncode == 1
        assert r.stderr.decode() == (f"cryptdisk: error: {plain} is the input file; refusing "
                                     f"to replace it\ncryptdisk: hint: pass --force to "
                                     f"{command} it in place\n")
        assert plain.read_bytes()[:8] != b"CRYPTDSK" or command == "decrypt"
        assert run(command, str(plain), str(plain), "--key-file", str(keyfile),
                   "--force").returncode == 0
        if command == "encrypt":
            assert plain.read_bytes()[:8] == b"CRYPTDSK"
            assert run("cat", str(plain), "--key-file", str(keyfile)).stdout == data
    assert plain.read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["k.hex", "p.bin"]


def test_in_place_encrypt_interrupted_leaves_the_input(tmp_path, keyfile):
    """Killed mid-write, an in-place encrypt leaves the file whole: the plaintext as it was,
    or (killed after the rename) the whole ciphertext; the output goes to a temporary file
    renamed over the input only once complete."""
    plain = tmp_path / "big.bin"
    data = os.urandom(64 << 20)
    plain.write_bytes(data)
    env = {k: v for k, v in os.environ.items() if k != "CRYPTDISK_KEYRING"}
    proc = subprocess.Popen([*CLI, "encrypt", str(plain), str(plain), "--force", "--key-file",
                             str(keyfile)], env=env, stderr=subprocess.PIPE)
    while not any(n.endswith(".cdtmp") for n in os.listdir(tmp_path)):
        assert proc.poll() is None, proc.stderr.read()
    proc.kill()
    proc.wait(timeout=60)
    proc.stderr.close()
    after = plain.read_bytes()
    if after != data:  # the kill came after the rename
        assert run("cat", str(plain), "--key-file", str(keyfile)).stdout == data


@pytest.mark.parametrize("command", ["encrypt", "decrypt"])
def test_an_output_that_is_a_symlink_is_written_through(tmp_path, keyfile, command):
    """`encrypt --force LINK LINK` converts the file the link names (the link stays a link),
    never replaces the link with the ciphertext while the plaintext stays where it was; a
    link to nothing is refused."""
    plain, enc = tmp_path / "p.bin", tmp_path / "p.cd"
    data = os.urandom(50_000)
    plain.write_bytes(data)
    assert run("encrypt", str(plain), str(enc), "--key-file", str(keyfile)).returncode == 0
    target = plain if command == "encrypt" else enc
    link = tmp_path / "link"
    link.symlink_to(target.name)
    r = run(command, str(link), str(link), "--key-file", str(keyfile))
    assert r.returncode == 1 and b"is the input file" in r.stderr
    r = run(command, str(link), str(link), "--key-file", str(keyfile), "--force")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == target.name
    if command == "encrypt":
        assert plain.read_bytes()[:8] == b"CRYPTDSK"
        assert run("cat", str(plain), "--key-file", str(keyfile)).stdout == data
    else:
        assert enc.read_bytes() == data
    dangling = tmp_path / "dangling"
    dangling.symlink_to("nowhere")
    r = run(command, str(plain if command == "decrypt" else enc), str(dangling),
            "--key-file", str(keyfile), "--force")
    _no_traceback(r)
    assert r.returncode == 1 and b"is a symbolic link to" in r.stderr
    assert not (tmp_path / "nowhere").exists() and dangling.is_symlink()


@pytest.mark.parametrize("command", ["decrypt", "encrypt"])
def test_replacing_a_log_in_place_removes_its_saved_last_segment(tmp_path, keyfile, command):
    """`decrypt LOG LOG --force` (and `encrypt --force` over a log) leaves no LOG-cdlogtail:
    the saved last segment of the encrypted log describes a file that is gone."""
    from cryptdisk import Key, Keyring
    from cryptdisk.format import open_log
    from cryptdisk.keys import key_from_file

    log = tmp_path / "access.log"
    with open_log(log, keys=Keyring([Key(1, key_from_file(str(keyfile)))])) as f:
        for i in range(300):
            f.write(b"line %d\n" % i)
    expected = b"".join(b"line %d\n" % i for i in range(300))
    tail = tmp_path / "access.log-cdlogtail"
    assert tail.exists()
    if command == "decrypt":
        r = run("decrypt", str(log), str(log), "--force", "--key-file", str(keyfile))
        assert r.returncode == 0, r.stderr
        assert log.read_bytes() == expected
    else:
        plain = tmp_path / "p.txt"
        plain.write_bytes(b"new\n")
        r = run("encrypt", str(plain), str(log), "--force", "--key-file", str(keyfile))
        assert r.returncode == 0, r.stderr
        assert run("cat", str(log), "--key-file", str(keyfile)).stdout == b"new\n"
    assert not tail.exists()


def test_decrypt_refuses_an_encrypted_sqlite_database_whose_commits_are_in_its_wal(
        tmp_path, keyfile):
    """`decrypt app.db out.db` (and `cat app.db > out.db`) of an encrypted SQLite database in
    WAL mode decrypted the database file alone and exited 0: every commit not yet
    checkpointed (here, the table itself) was missing from out.db. It now refuses,
    pointing to `cryptdisk sqlite decrypt`, and writes nothing; with an empty WAL (all
    checkpointed) it decrypts."""
    import shutil
    import sqlite3

    import cryptdisk.sqlite as csql
    from cryptdisk import Key, Keyring
    from cryptdisk.keys import key_from_file

    live, db = tmp_path / "live", tmp_path / "app.db"
    live.mkdir()
    conn = csql.connect(str(live / "app.db"), keyring=Keyring([Key(1, key_from_file(
        str(keyfile)))]))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(v)")
    conn.execute("INSERT INTO t VALUES ('committed')")
    for suffix in ("", "-wal"):  # as a crash would leave them
        shutil.copy(str(live / "app.db") + suffix, str(db) + suffix)
    conn.close()
    out = tmp_path / "out.db"
    r = run("decrypt", str(db), str(out), "--key-file", str(keyfile))
    _no_traceback(r)
    assert r.returncode == 1 and not out.exists()
    assert r.stderr.decode().splitlines()[0] == (
        f"cryptdisk: error: {db} has a wal beside it ({db}-wal): an encrypted SQLite "
        "database whose latest changes are there, which decrypting the file alone would "
        "leave out")
    assert b"cryptdisk sqlite decrypt" in r.stderr
    r = run("cat", str(db), "--key-file", str(keyfile), "--force")  # `cat app.db > out.db`
    assert r.returncode == 1 and r.stdout == b"" and b"has a wal beside it" in r.stderr
    r = run("sqlite", "decrypt", str(db), str(out), "--key-file", str(keyfile))
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(out) as plain:
        assert plain.execute("SELECT v FROM t").fetchall() == [("committed",)]
    os.truncate(str(db) + "-wal", 0)  # nothing left in it
    r = run("decrypt", str(db), str(tmp_path / "whole.db"), "--key-file", str(keyfile))
    assert r.returncode == 0, r.stderr


def test_decrypt_takes_a_persist_mode_database_whose_journal_sqlite_has_finished_with(
        tmp_path, keyfile):
    """An encrypted SQLite database in journal_mode=PERSIST keeps a non-empty -journal
    after every commit, its header zeroed: decrypt and cat refused such a database, closed
    and fully committed, saying its latest changes were in the journal. A journal holding
    a transaction to roll back (a hot journal, as a crash leaves it) is still refused."""
    import shutil
    import sqlite3

    import cryptdisk.sqlite as csql
    from cryptdisk import Key, Keyring
    from cryptdisk.keys import key_from_file

    keyring = Keyring([Key(1, key_from_file(str(keyfile)))])
    db = tmp_path / "app.db"
    conn = csql.connect(str(db), keyring=keyring)
    conn.execute("PRAGMA journal_mode=PERSIST")
    conn.execute("CREATE TABLE t(v)")
    conn.execute("INSERT INTO t VALUES ('committed')")
    conn.close()
    assert os.path.getsize(str(db) + "-journal") > 0
    out = tmp_path / "out.db"
    r = run("decrypt", str(db), str(out), "--key-file", str(keyfile))
    assert r.returncode == 0, r.stderr  # 1 before: "has a journal beside it"
    with sqlite3.connect(out) as plain:
        assert plain.execute("SELECT v FROM t").fetchall() == [("committed",)]
    r = run("cat", str(db), "--key-file", str(keyfile), "--force")
    assert r.returncode == 0, r.stderr
    # a transaction under way that wrote to the database: its journal starts with the
    # magic, as a crash leaves it
    live, hot = tmp_path / "live", tmp_path / "hot.db"
    live.mkdir()
    conn = csql.connect(str(live / "app.db"), keyring=keyring)
    conn.execute("PRAGMA journal_mode=PERSIST")
    conn.execute("CREATE TABLE t(v)")
    conn.execute("INSERT INTO t VALUES ('committed')")
    conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) "
                 "INSERT INTO t SELECT zeroblob(500) FROM n")
    conn.execute("PRAGMA cache_size=2")  # the transaction spills pages into the database
    conn.execute("BEGIN")  # (its journal synced first, magic and all)
    conn.execute("UPDATE t SET v = zeroblob(600)")
    for suffix in ("", "-journal"):
        shutil.copy(str(live / "app.db") + suffix, str(hot) + suffix)
    conn.execute("ROLLBACK")
    conn.close()
    r = run("decrypt", str(hot), str(tmp_path / "hot-out.db"), "--key-file", str(keyfile))
    _no_traceback(r)
    assert r.returncode == 1 and b"has a journal beside it" in r.stderr
    assert not (tmp_path / "hot-out.db").exists()


def test_decrypt_takes_a_database_whose_journal_is_shorter_than_its_magic(tmp_path, keyfile):
    """A rollback journal shorter than SQLite's 8-byte magic holds nothing to roll back
    (SQLite deletes it): decrypt refused such a database, saying its latest changes were
    in the journal, where convert took it. Both now ask
    cryptdisk._sqlitefiles.journal_holds_rollback."""
    import sqlite3

    import apsw

    import cryptdisk.sqlite as csql
    from cryptdisk import Key, Keyring
    from cryptdisk.keys import key_from_file

    keyring = Keyring([Key(1, key_from_file(str(keyfile)))])
    db = tmp_path / "app.db"
    conn = csql.connect(str(db), keyring=keyring)
    conn.execute("CREATE TABLE t(v)")
    conn.execute("INSERT INTO t VALUES ('committed')")
    conn.close()
    f = apsw.VFSFile(csql.vfs_for(keyring).vfs_name, str(db) + "-journal",
                     [apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
                      | apsw.SQLITE_OPEN_MAIN_JOURNAL, 0])
    f.xWrite(b"\xd9\xd5\x05", 0)  # a journal torn inside its first bytes
    f.xClose()
    assert os.path.getsize(str(db) + "-journal") > 0
    out = tmp_path / "out.db"
    r = run("decrypt", str(db), str(out), "--key-file", str(keyfile))
    _no_traceback(r)
    assert r.returncode == 0, r.stderr  # 1 before: "has a journal beside it"
    with sqlite3.connect(out) as plain:
        assert plain.execute("SELECT v FROM t").fetchall() == [("committed",)]
    with csql.connect(str(db), keyring=keyring) as again:  # SQLite agrees: nothing undone
        assert again.execute("SELECT v FROM t").fetchall() == [("committed",)]
