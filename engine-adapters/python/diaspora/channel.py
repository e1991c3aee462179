"""The channel between a task's code, running in an engine's worker process (or thread),
and the adapter that holds the plugin handle: small JSON datagrams over a UNIX datagram
socket in the abstract namespace (no file, gone with the process).

    adapter process                                worker process
    Listener("@diaspora-<pid>-<rand>") <────────── report(address, {"k": "hb", ...})
          │                                        (task wrapper, diaspora.task.step(), ...)
          └──▶ Sender.send(worker_address, {"k": "stop"}) ──▶ the attempt's own Listener

Same host only (a UNIX socket): workers on other hosts report nothing through it, and the
adapters then fall back to what the engine itself says (docs/adapters.md). A datagram
that is not valid JSON, too large or without a task id is dropped and counted.
Thread safety: a Listener's handler runs on its own thread; send() may be called from
any thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from typing import Callable

log = logging.getLogger("diaspora.channel")

MAX_DATAGRAM = 8192


def _sockaddr(address: str) -> str | bytes:
    """'@name' is the abstract name \\0name; anything else a filesystem path."""
    return b"\0" + address[1:].encode() if address.startswith("@") else address


def new_address(tag: str) -> str:
    return f"@diaspora-{tag}-{os.getpid()}-{secrets.token_hex(6)}"


class Listener:
    """Receives datagrams on `address` (a fresh abstract one by default) and calls
    handler(message: dict) on its own thread for each valid one."""

    def __init__(self, handler: Callable[[dict], None], address: str | None = None, tag: str = "ch"):
        self.address = address or new_address(tag)
        self.dropped = 0
        self._handler = handler
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(_sockaddr(self.address))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diaspora-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(MAX_DATAGRAM + 1)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                msg = json.loads(data) if len(data) <= MAX_DATAGRAM else None
            except ValueError:
                msg = None
            if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
                self.dropped += 1
                continue
            try:
                self._handler(msg)
            except Exception:
                log.exception("channel handler failed on %r", msg)

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            Sender.send(self.address, {})  # wakes the receiving thread at once
            self._thread.join(timeout=2)
        self._sock.close()


class Sender:
    """One unbound datagram socket per process (re-created after a fork)."""

    _lock = threading.Lock()
    _sock: socket.socket | None = None
    _pid = -1

    @classmethod
    def send(cls, address: str, msg: dict) -> bool:
        """Sends one message; False when nobody listens there (the adapter is gone) or the
        receiver's queue is full. Never raises for those."""
        data = json.dumps(msg, separators=(",", ":")).encode()
        with cls._lock:
            if cls._sock is None or cls._pid != os.getpid():
                cls._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                cls._sock.setblocking(False)
                cls._pid = os.getpid()
            try:
                cls._sock.sendto(data, _sockaddr(address))
                return True
            except OSError:
                return False
