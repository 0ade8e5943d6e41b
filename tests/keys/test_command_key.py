"""``command = [...]`` keys: what an operator is told when the command fails, and what never."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cryptdisk.errors import InvalidKeyError, KeyCommandError
from cryptdisk.keys import key_from_command

KEY = "00112233445566778899aabbccddeeff" * 2
B64 = "q2Vx9QmT4r7bZ0pLw3yN8sJd6fKc1hGa5uYiOe4R"  # a base64 password-like token
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _script(tmp_path: Path, body: str, name: str = "keytool") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o700)
    return str(path)


def test_a_failing_command_is_named_with_its_status_and_its_last_stderr_lines(tmp_path):
    tool = _script(tmp_path, "echo 'pass: cryptdisk/k4 is not in the password store.' >&2\n"
                   "echo 'hint: run pass init' >&2\nexit 1\n")
    with pytest.raises(KeyCommandError) as info:
        key_from_command([tool, "show", "cryptdisk/k4"])
    text = str(info.value)
    assert "key command 'keytool' exited with status 1" in text
    assert "pass: cryptdisk/k4 is not in the password store. | hint: run pass init" in text
    assert "show" not in text  # the arguments are not quoted (they may name secrets)


def test_its_stdout_and_key_like_runs_in_its_stderr_never_show(tmp_path):
    tool = _script(tmp_path, f"echo {KEY}\necho 'partial-secret-xyz'\n"
                   f"echo 'error: key {KEY} expired' >&2\n"
                   f"echo 'password {B64} refused' >&2\n"
                   "echo 'also partial-secret-xyz leaked' >&2\n"
                   f"echo 'dek {KEY[:40].upper()}' >&2\nexit 3\n")
    with pytest.raises(KeyCommandError) as info:
        key_from_command([tool])
    text = str(info.value)
    assert "exited with status 3" in text
    assert KEY not in text and KEY[:32] not in text and KEY[:40].upper() not in text
    assert B64 not in text and "partial-secret-xyz" not in text
    assert "error: key [redacted] expired" in text and "password [redacted] refused" in text
    assert "also [redacted] leaked" in text
    # paths and ordinary words stay readable
    from cryptdisk.keys._sources import stderr_excerpt

    assert stderr_excerpt(b"open /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so failed\n") \
        == "open /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so failed"


def test_the_excerpt_is_bounded_to_the_last_lines(tmp_path):
    tool = _script(tmp_path, "i=0\nwhile [ $i -lt 100 ]; do echo \"line $i $(printf 'x%.0s' "
                   "$(seq 1 150))\" >&2; i=$((i+1)); done\nexit 2\n")
    with pytest.raises(KeyCommandError) as info:
        key_from_command([tool])
    text = str(info.value)
    assert "line 99" in text and "line 94" not in text
    assert len(text) < 520


def test_a_command_killed_by_a_signal_says_so(tmp_path):
    tool = _script(tmp_path, "echo 'about to die' >&2\nkill -9 $$\n")
    with pytest.raises(KeyCommandError, match=r"was killed by signal 9 \(SIGKILL\); its stderr: "
                       "about to die"):
        key_from_command([tool])


def test_a_command_that_cannot_be_run_is_a_key_command_error(tmp_path):
    tool = tmp_path / "not-executable"
    tool.write_text("#!/bin/sh\necho key\n")
    tool.chmod(0o600)
    with pytest.raises(KeyCommandError, match="'not-executable' cannot be run: permission "
                       "denied"):
        key_from_command([str(tool)])


def test_bad_output_shows_the_stderr_but_not_the_output(tmp_path):
    tool = _script(tmp_path, "echo 'not-a-key-but-secret'\necho 'warning: agent locked' >&2\n")
    with pytest.raises(InvalidKeyError) as info:
        key_from_command([tool])
    text = str(info.value)
    assert "not valid hex" in text and "its stderr: warning: agent locked" in text
    assert "not-a-key-but-secret" not in text


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_command_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    pidfile = tmp_path / "child.pid"
    tool = _script(tmp_path, f"sleep 300 &\necho $! > {pidfile}\n"
                   "echo 'waiting for the agent' >&2\nwait\n")
    with pytest.raises(KeyCommandError, match=r"did not finish in 1 s and was killed; its "
                       "stderr: waiting for the agent"):
        key_from_command([tool], timeout=1)
    child = int(pidfile.read_text())
    for _ in range(100):  # SIGKILL is delivered asynchronously: wait for it to land
        if not _alive(child):
            break
        time.sleep(0.05)
    alive = _alive(child)
    if alive:
        os.kill(child, 9)
    assert not alive, "the command's child outlived the timeout"


def test_the_cli_tells_the_operator_status_and_stderr_never_the_key(tmp_path):
    tool = _script(tmp_path, f"echo {KEY}\necho 'gpg: decryption failed: No secret key' >&2\n"
                   "exit 2\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[keyring]\n[[keyring.keys]]\nid = 1\ncommand = ["{tool}"]\n')
    cfg.chmod(0o600)
    (tmp_path / "plain").write_bytes(b"x")
    done = subprocess.run([sys.executable, "-m", "cryptdisk", "encrypt", str(tmp_path / "plain"),
                           str(tmp_path / "out"), "-c", str(cfg)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=SRC), timeout=60)
    assert done.returncode == 1
    assert ("key command 'keytool' exited with status 2; its stderr: gpg: decryption failed: "
            "No secret key") in done.stderr
    assert KEY not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_a_command_may_prompt_on_the_terminal(tmp_path):
    """A key command that reads its passphrase from /dev/tty (age, a passphrase helper) runs
    on cryptdisk's terminal, in its foreground process group. Run under a pseudo-terminal."""
    import pty

    tool = _script(tmp_path, "exec 3</dev/tty || exit 9\nread -r pw <&3\n"
                   f"[ \"$pw\" = open-sesame ] && echo {KEY}\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from cryptdisk.keys import "
            "key_from_command; print('KEY', key_from_command([sys.argv[2]]).hex(), flush=True)")
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty
        os.execv(sys.executable, [sys.executable, "-c", code, SRC, tool])
    out = b""
    try:
        os.write(fd, b"open-sesame\n")
        while True:  # until the child ends (EIO on the pty's master)
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert f"KEY {KEY}".encode() in out, out
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_key_in_its_stderr_in_another_spelling_never_shows() -> None:
    import base64

    from cryptdisk.keys._sources import stderr_excerpt

    raw = bytes.fromhex(KEY)
    spellings = {
        "colons": ":".join(f"{b:02x}" for b in raw),
        "upper spaces": " ".join(f"{b:02X}" for b in raw),
        "C array": ", ".join(f"0x{b:02x}" for b in raw),
        "xxd columns": " ".join(KEY[i:i + 4] for i in range(0, 64, 4)),
        "lines": "\n".join(KEY[i:i + 16] for i in range(0, 64, 16)),
        "half": KEY[:24],
        "after a hex word": "bad " + " ".join(f"{b:02x}" for b in raw),
        "base64 of a 16-byte key": base64.b64encode(raw[:16]).decode(),
        "base64 split": base64.b64encode(raw).decode()[:22] + "\n"
                        + base64.b64encode(raw).decode()[22:],
    }
    for what, spelled in spellings.items():
        text = stderr_excerpt(f"error: bad key {spelled} given\n".encode())
        assert "[redacted]" in text, what
        flat = "".join(c for c in text.lower() if c in "0123456789abcdef")
        assert KEY[8:20] not in flat and KEY[40:52] not in flat, (what, text)
        for part in base64.b64encode(raw).decode(), base64.b64encode(raw[:16]).decode():
            assert part[:12] not in text and part[-14:-2] not in text, (what, text)
    # dates, versions, MAC addresses, UUIDs and words stay readable
    for kept in ("2026-12-05 11:16:34.123456 ERROR: token expired",
                 "openssl 3.0.13 on 52:54:00:12:34:56",
                 "request 123e4567-e89b-12d3-a456-426614174000 failed",
                 "a bad decade faded; cafe added", "/usr/lib/x86_64-linux-gnu/pkcs11"):
        assert stderr_excerpt(kept.encode()) == kept, kept
