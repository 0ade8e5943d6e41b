"""Client sockets on the event loop, TLS through an :class:`ssl.SSLObject`.

A connection is a non-blocking socket the loop watches with ``add_reader``/``add_writer``.
After ``start_tls`` its bytes pass through an :class:`ssl.SSLObject` on two memory BIOs:
one ``recv`` takes whatever the client sent (whole TLS records, often several), one
``read`` of the SSL object decrypts a record, one ``write`` encrypts a whole response
and one ``send`` puts it on the socket. An :class:`ssl.SSLSocket` would read each record
with two system calls (its 5-byte header, then the rest: Python's ``ssl`` cannot turn on
OpenSSL's read-ahead) and write a large response in one system call per 16 KiB record.
asyncio's streams use memory BIOs too, but pump them with a dozen Python calls per
message each way (``sslproto``). :class:`Listener` accepts connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from ._openfiles import Throttled, out_of_files

__all__ = ["Connection", "Listener"]


#: bytes read ahead of what the session consumed before reading pauses
READ_LIMIT = 1 << 17
_RECV = 1 << 16
#: drain() waits while more than this is queued for sending ...
_HIGH = 1 << 16
#: ... until it is below this
_LOW = 1 << 14
#: seconds a worker leaves a connection to a less busy worker before taking it itself
_DEFER = 0.005
_WOULD_BLOCK = (BlockingIOError, InterruptedError)


def _lost(exc: BaseException) -> ConnectionError:
    """A socket or TLS error as the ConnectionError a session ends on quietly."""
    if isinstance(exc, ConnectionError):
        return exc
    err = ConnectionResetError(f"connection lost: {exc}")
    err.__cause__ = exc
    return err


def _no_tls(_n: int) -> bytes:
    raise AssertionError("no TLS on this connection")


def _settle(waiter: asyncio.Future[None] | None) -> None:
    """Wake whoever awaits ``waiter`` (if anyone still does)."""
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class Connection:
    """One client: buffered reads (:meth:`readexactly`), queued writes (:meth:`write`,
    :meth:`drain`), :meth:`start_tls` in place, :meth:`close` and :meth:`abort`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop = loop
        self.sock: socket.socket = sock
        self.fd = sock.fileno()
        try:
            self.peername: Any = sock.getpeername()
        except OSError:
            self.peername = None
        self.buffer = bytearray()
        self.eof = False
        self.error: ConnectionError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reading = False
        self._out: collections.deque[bytes] = collections.deque()
        self._out_size = 0
        self._writing = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closing = False
        self._closed: asyncio.Future[None] = loop.create_future()
        self.tls: ssl.SSLObject | None = None
        #: TLS: ciphertext received and not yet decrypted, and encrypted, not yet sent
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        #: TLS: the SSL object's own read and write, without ssl.SSLObject's Python
        #: wrappers around them
        self._decrypt: Callable[[int], bytes] = _no_tls
        self._encrypt: Callable[[bytes], int] | None = None
        self._on_readable: Callable[[], None] = self._read_plain
        #: called (on the loop) when the client is found gone: end of stream or an error
        self.on_lost: Callable[[], None] | None = None
        #: accepted on the listener's spare descriptor: the process has none left
        self.spare = False
        self._resume_reading()

    # -- reading ----------------------------------------------------------------------------

    def _resume_reading(self) -> None:
        if not self._reading and not self.eof and self.error is None and not self._closing:
            self._reading = True
            self.loop.add_reader(self.fd, self._on_readable)
            if self.tls is not None and self._incoming.pending:
                # records received but not decrypted when reading paused: epoll will not
                # report them
                self.loop.call_soon(self._on_readable)

    def _pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self.loop.remove_reader(self.fd)

    def _read_plain(self) -> None:
        if not self._reading:
            return
        recv = self.sock.recv
        try:
            while True:
                chunk = recv(_RECV)
                if not chunk:
                    self.eof = True
                    break
                self.buffer += chunk
                if len(self.buffer) >= READ_LIMIT or len(chunk) < _RECV:
                    break
        except _WOULD_BLOCK:
            pass
        except OSError as exc:
            self.error = _lost(exc)
        if self.eof or self.error is not None or len(self.buffer) >= READ_LIMIT:
            self._pause_reading()
        self._wake()

    def _read_tls(self) -> None:
        """Decrypt the records already received, then ``recv`` more: one system call
        brings what the client sent, whole records or parts of them."""
        if not self._reading:
            return
        buf, incoming, decrypt = self.buffer, self._incoming, self._decrypt
        more = True  # the socket may hold more (the last recv filled its buffer)
        try:
            while True:  # at least one record, even past READ_LIMIT: readexactly needs it
                if incoming.pending:
                    try:  # one record: _RECV is more than a record holds, so none is left
                        chunk = decrypt(_RECV)  # half read in the SSL object
                    except ssl.SSLWantReadError:  # the rest of a record is on its way
                        chunk = None
                    if chunk:
                        buf += chunk
                        if len(buf) >= READ_LIMIT:
                            break
                        continue
                    if chunk is not None:  # the client's close_notify
                        self.eof = True
                        break
                if not more:
                    break
                data = self.sock.recv(_RECV)
                if not data:  # without close_notify: an end, as SSLSocket has it
                    self.eof = True
                    break
                incoming.write(data)
                more = len(data) == _RECV
        except _WOULD_BLOCK:
            pass
        except OSError as exc:  # ssl.SSLError too: a record that does not authenticate
            self.error = _lost(exc)
        if self._outgoing.pending and self.error is None and not self._closing:
            self._send_raw(self._outgoing.read())  # TLS 1.3 KeyUpdate's answer
        if self.eof or self.error is not None or len(self.buffer) >= READ_LIMIT:
            self._pause_reading()
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        _settle(waiter)
        if (self.eof or self.error is not None) and self.on_lost is not None:
            self.on_lost()

    @property
    def lost(self) -> bool:
        """Whether the client is gone (end of stream read, or the socket failed)."""
        return self.eof or self.error is not None

    async def fill(self, n: int) -> None:
        """Wait until the buffer holds at least ``n`` bytes (:meth:`readexactly`'s wait,
        taking nothing)."""
        buf = self.buffer
        while len(buf) < n:
            if self.error is not None:
                raise self.error
            if self.eof or self._closing:
                raise asyncio.IncompleteReadError(bytes(buf), n)
            self._resume_reading()
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes; :class:`asyncio.IncompleteReadError` at end of stream."""
        buf = self.buffer
        if len(buf) < n:
            await self.fill(n)
        data = bytes(buf[:n])
        del buf[:n]
        if not self._reading and len(buf) < READ_LIMIT:
            self._resume_reading()
        return data

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes, which the buffer holds (the caller checked)."""
        buf = self.buffer
        data = bytes(buf[:n])
        del buf[:n]
        if not self._reading and len(buf) < READ_LIMIT:
            self._resume_reading()
        return data

    # -- writing ----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send ``data`` now if the socket takes it, else queue it (see :meth:`drain`).
        TLS: encrypted now, all of it (a memory BIO never refuses bytes), then sent."""
        if self._closing or self.error is not None or not data:
            return
        if self._encrypt is not None:
            try:
                self._encrypt(data)
            except (ssl.SSLError, ValueError) as exc:
                self._fail(exc)
                return
            data = self._outgoing.read()
        self._send_raw(data)

    def _send_raw(self, data: bytes) -> None:
        """Send bytes as they go on the wire (ciphertext under TLS), or queue them."""
        if not self._out:
            try:
                n = self.sock.send(data)
            except _WOULD_BLOCK:
                n = 0
            except OSError as exc:
                self._fail(exc)
                return
            if n == len(data):
                return
            data = data[n:]
        self._out.append(data)
        self._out_size += len(data)
        if not self._writing:
            self._writing = True
            self.loop.add_writer(self.fd, self._on_writable)

    def _on_writable(self) -> None:
        send = self.sock.send
        out = self._out
        try:
            while out:
                data = out[0]
                n = send(data)
                if n < len(data):
                    out[0] = data[n:]
                    self._out_size -= n
                    break
                out.popleft()
                self._out_size -= len(data)
        except _WOULD_BLOCK:
            pass
        except OSError as exc:
            self._fail(exc)
            return
        if not out:
            self._writing = False
            self.loop.remove_writer(self.fd)
            if self._closing:
                self._finish_close()
        if self._out_size <= _LOW:
            self._wake_drain()

    @property
    def backed_up(self) -> bool:
        """Whether :meth:`drain` would wait (or raise the connection's error)."""
        return self._out_size > _HIGH or self.error is not None

    async def drain(self) -> None:
        """Wait while much is queued for sending; the connection's error if it failed."""
        if self.error is not None:
            raise self.error
        while self._out_size > _HIGH:
            self._drain_waiter = self.loop.create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None
            if self.error is not None:
                raise self.error

    def _fail(self, exc: BaseException) -> None:
        """A send failed: drop the socket; readers and drainers get the error."""
        self.error = _lost(exc)
        self._out.clear()
        self._out_size = 0
        self._wake_drain()
        self.abort()

    def _wake_drain(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        _settle(waiter)

    # -- TLS --------------------------------------------------------------------------------

    def get_extra_info(self, name: str) -> Any:
        if name == "peername":
            return self.peername
        if name == "peercert":
            return self.tls.getpeercert() if self.tls is not None else None
        if name == "ssl_object":
            return self.tls
        return None

    async def _ready(self, write: bool) -> None:
        """Wait until the socket is writable (``write``) or readable."""
        future: asyncio.Future[None] = self.loop.create_future()

        def ready() -> None:
            if not future.done():
                future.set_result(None)

        (self.loop.add_writer if write else self.loop.add_reader)(self.fd, ready)
        try:
            await future
        finally:
            (self.loop.remove_writer if write else self.loop.remove_reader)(self.fd)

    async def _sent(self) -> None:
        """Wait until everything queued has gone to the socket."""
        while self._out and self.error is None:
            self._drain_waiter = self.loop.create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None
        if self.error is not None:
            raise self.error

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """The TLS handshake (server side) on this socket; later reads and writes go
        through it. Nothing may be buffered or queued when it starts."""
        assert not self.buffer and self.tls is None
        await self._sent()  # the plaintext reply first (b"S")
        self._pause_reading()
        incoming, outgoing = self._incoming, self._outgoing
        tls = self.tls = context.wrap_bio(incoming, outgoing, server_side=True)
        try:
            while True:
                try:
                    tls.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                except ssl.SSLError:
                    with contextlib.suppress(OSError):  # the alert, if the socket takes it
                        self.sock.send(outgoing.read())
                    raise
                if outgoing.pending:
                    self._send_raw(outgoing.read())
                    await self._sent()
                if done:
                    break
                await self._ready(write=False)
                try:
                    data = self.sock.recv(_RECV)
                except _WOULD_BLOCK:
                    continue
                if not data:
                    raise ConnectionResetError("the client closed the connection during "
                                               "the TLS handshake")
                incoming.write(data)
        except BaseException:
            self.abort()
            raise
        obj = getattr(tls, "_sslobj", None)  # CPython's _ssl._SSLSocket under the wrapper
        self._decrypt = obj.read if obj is not None else tls.read
        self._encrypt = obj.write if obj is not None else tls.write
        self._on_readable = self._read_tls
        self._resume_reading()

    # -- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close once what is queued has been sent (TLS: with a close_notify)."""
        if self._closing:
            return
        self._closing = True
        self._pause_reading()
        self._wake()
        if not self._out:
            self._finish_close()

    def _finish_close(self) -> None:
        if self.tls is not None and self.error is None:
            with contextlib.suppress(OSError, ValueError):  # close_notify, without waiting
                self.tls.unwrap()                           # for the client's
            with contextlib.suppress(OSError):
                self.sock.send(self._outgoing.read())
        self.abort()

    def abort(self) -> None:
        """Close the socket now, dropping whatever is queued."""
        self._closing = True
        if self._reading:
            self._reading = False
            self.loop.remove_reader(self.fd)
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.fd)
        self._out.clear()
        self._out_size = 0
        self._wake()
        self._wake_drain()
        if not self._closed.done():
            self.sock.close()
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)


class Listener:
    """Listening sockets for ``host``:``port``; each accepted client goes to ``serve``."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 serve: Callable[[Connection], Coroutine[Any, Any, None]],
                 balance: Any = None) -> None:
        self.loop = loop
        self.serve = serve
        self.sockets: list[socket.socket] = []
        self.tasks: set[asyncio.Task[None]] = set()
        #: with worker processes accepting on the same sockets (:class:`._workers.Workers`):
        #: ``may_accept()``, ``defer()`` and ``connected(delta)`` spread connections evenly
        self.balance = balance
        #: a descriptor held in reserve: closed to accept one client when the process has
        #: none left (that client is refused, 53000: see :mod:`._openfiles`), opened again
        #: once it is gone
        self._spare: int | None = None
        self._closed = False
        self._keep_spare()
        #: a storm of clients at the limit logs a line every few seconds, not one each
        self._refused = Throttled("accepting a connection: no file descriptor left, the "
                                  "client is refused (53000)", loop.call_later)
        self._paused = Throttled("accepting connections paused for 1 s (clients wait in "
                                 "the queue)", loop.call_later)

    def adopt(self, sockets: list[socket.socket]) -> None:
        """Accept on listening sockets bound elsewhere (the supervisor of worker processes)."""
        self.sockets = list(sockets)
        for sock in self.sockets:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    async def listen(self, host: str, port: int, backlog: int = 128) -> None:
        infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                            flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _, address in infos:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self.sockets) > 1:  # one port for every address
                    address = (address[0], self.sockets[0].getsockname()[1], *address[2:])
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
        except BaseException:
            self.close()
            raise
        for sock in self.sockets:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        balance = self.balance
        for _ in range(64):
            if balance is not None and not balance.may_accept():
                # another worker has fewer connections: leave this one to it for a moment
                balance.defer()
                self.loop.remove_reader(sock.fileno())
                self.loop.call_later(_DEFER, self._resume, sock)
                return
            spare = False
            try:
                conn, _addr = sock.accept()
            except _WOULD_BLOCK:
                return
            except OSError as exc:  # out of file descriptors and the like
                got = self._accept_on_spare(sock) if out_of_files(exc) else None
                if got is None:  # (the spare in use too): pause a moment
                    self._paused.warn(exc)
                    self.loop.remove_reader(sock.fileno())
                    self.loop.call_later(1.0, self._resume, sock)
                    return
                conn, spare = got, True
                self._refused.warn(exc)
            try:
                connection = Connection(self.loop, conn)
            except OSError:
                conn.close()
                if spare:
                    self._keep_spare()
                continue
            connection.spare = spare
            task = self.loop.create_task(self.serve(connection))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            if spare:
                task.add_done_callback(lambda _t: self._keep_spare())
            if balance is not None:
                balance.connected(1)
                task.add_done_callback(lambda _t: balance.connected(-1))
                return  # one at a time: the others get their turn

    def _accept_on_spare(self, sock: socket.socket) -> socket.socket | None:
        """The next client, accepted on the spare descriptor (closed for it), or None."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        os.close(spare)
        try:
            conn, _addr = sock.accept()
        except OSError:  # (no client after all, or another thread took the descriptor)
            self._keep_spare()
            return None
        return conn

    def _keep_spare(self) -> None:
        """Hold a spare descriptor (when none is held, and one is free)."""
        if self._spare is None and not self._closed:
            with contextlib.suppress(OSError):
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def _resume(self, sock: socket.socket) -> None:
        if sock in self.sockets and sock.fileno() >= 0:
            self._keep_spare()
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting (connections already accepted go on)."""
        self._closed = True
        sockets, self.sockets = self.sockets, []
        for sock in sockets:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
                sock.close()
        spare, self._spare = self._spare, None
        if spare is not None:
            os.close(spare)
