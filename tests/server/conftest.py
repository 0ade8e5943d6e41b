"""A server running in a background thread's event loop, for real clients in the test."""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from cryptdisk.keys import Key, Keyring
from cryptdisk.server import AnalyticalEngine, Server, SQLiteEngine


class ServerThread:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.stop_event = asyncio.Event()
        try:
            self.loop.run_until_complete(
                self.server.serve(self.stop_event, ready=lambda a: self.ready.set()))
        except BaseException as exc:
            self.error = exc
            self.ready.set()
        finally:
            self.loop.close()

    def start(self) -> ServerThread:
        self.thread.start()
        self.ready.wait(60)
        if self.error:
            raise self.error
        return self

    @property
    def port(self) -> int:
        assert self.server.address is not None
        return self.server.address[1]

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self.thread.join(60)


@pytest.fixture
def keyring() -> Keyring:
    return Keyring([Key(1, bytes(range(32)))])


@pytest.fixture
def analytical(tmp_path: Any) -> AnalyticalEngine:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        return AnalyticalEngine(tmp_path / "a.db")


@pytest.fixture
def sqlite_engine(tmp_path: Any, keyring: Keyring) -> SQLiteEngine:
    return SQLiteEngine(tmp_path / "s.db", keyring)


@pytest.fixture
def start_server() -> Iterator[Any]:
    started: list[ServerThread] = []

    def start(engine: Any, **options: Any) -> ServerThread:
        options.setdefault("port", 0)
        if "ssl_context" not in options:
            options.setdefault("plaintext_loopback", True)
        t = ServerThread(Server(engine, **options)).start()
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()
