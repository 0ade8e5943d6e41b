"""The loopback key servers the keys benchmark and the provider tests share."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from cryptdisk.bench.key_servers import kmip_server, wait_accepting
from cryptdisk.keys.providers import kmip_client


def _processes_with(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
    return found


def test_a_stopped_kmip_server_leaves_no_process_behind(tmp_path: Path) -> None:
    """PyKMIP's server forks a process per connection: stopping it kills those too."""
    root = tmp_path / "kmip"
    root.mkdir()
    with kmip_server(root) as port:
        wait_accepting(port)
        client = kmip_client("127.0.0.1", port, cert=str(root / "client.pem"),
                             key=str(root / "client.key"), ca=str(root / "ca.pem"))
        with contextlib.closing(client):
            assert client.locate() == []  # a mutual-TLS request answered
            assert len(_processes_with(str(root))) >= 2  # the server and a connection's
    assert _processes_with(str(root)) == []
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", port))
