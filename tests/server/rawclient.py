"""A bare-bytes PostgreSQL client for sending what real clients never would."""

from __future__ import annotations

import socket
import struct


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


class Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def startup(self, user: str = "u") -> list[tuple[bytes, bytes]]:
        body = struct.pack("!i", 196608) + cstr("user") + cstr(user) + b"\0"
        self.send(struct.pack("!i", len(body) + 4) + body)
        return self.until(b"Z")

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def read(self) -> tuple[bytes, bytes] | None:
        """The next message, or None when the server closed the connection."""
        if not self._fill(5):
            return None
        kind, length = self.buf[:1], struct.unpack("!i", self.buf[1:5])[0]
        if not self._fill(1 + length):
            return None
        body, self.buf = self.buf[5:1 + length], self.buf[1 + length:]
        return kind, body

    def until(self, kind: bytes) -> list[tuple[bytes, bytes]]:
        out = []
        while True:
            m = self.read()
            if m is None:
                return out
            out.append(m)
            if m[0] == kind:
                return out

    def rest(self) -> list[tuple[bytes, bytes]]:
        """Every message until the server closes the connection."""
        out = []
        while (m := self.read()) is not None:
            out.append(m)
        self.close()
        return out

    def close(self) -> None:
        self.sock.close()


def sqlstate(body: bytes) -> str:
    for field in body.split(b"\0"):
        if field[:1] == b"C":
            return field[1:].decode()
    return ""
