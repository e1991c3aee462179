"""The channel between a task's code, running in an engine's worker process (or thread),
and the adapter that holds the plugin handle: small JSON datagrams.

    adapter process                                worker process
    Listener("@diaspora-<pid>-<rand>") <────────── report(address, {"k": "hb", ...})
          │                                        (task wrapper, diaspora.task.step(), ...)
          └──▶ Sender.send(worker_address, {"k": "stop"}) ──▶ the attempt's own Listener

Two transports, told apart by the address:
  "@name" (or a path)      a UNIX datagram socket (abstract namespace: no file, gone with the
                           process): workers on the same host only.
  "udp://HOST:PORT/KEY"    UDP to HOST:PORT, each datagram signed with HMAC-SHA256 under KEY
                           (64 hex digits, a secret the adapter makes and hands to its workers
                           inside the task wrapper): workers on other hosts. A datagram whose
                           signature does not verify is dropped and counted. Replays of a
                           signed datagram by someone on the path are not detected (a report
                           is counted again, a "stop" repeated); use a network you trust or
                           the engine's own encryption for the task wrapper (the key travels
                           in it).
A datagram that is not valid JSON, too large or without a task id is dropped and counted.
Thread safety: a Listener's handler runs on its own thread; send() may be called from
any thread.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
from typing import Callable

log = logging.getLogger("diaspora.channel")

MAX_DATAGRAM = 8192
_MAC = 32  # bytes of HMAC-SHA256 before a UDP datagram's JSON


def _sockaddr(address: str) -> str | bytes:
    """'@name' is the abstract name \\0name; anything else a filesystem path."""
    return b"\0" + address[1:].encode() if address.startswith("@") else address


@functools.lru_cache(maxsize=256)
def parse_udp(address: str) -> tuple[str, int, bytes]:
    """'udp://HOST:PORT/KEY' → (host, port, key bytes). Raises ValueError, naming what is wrong."""
    rest = address[len("udp://"):]
    hostport, sep, key = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"channel address {address.split('/', 3)[0] + '//' + hostport!r}: expected "
                         "udp://HOST:PORT/KEY")
    try:
        k = bytes.fromhex(key)
    except ValueError:
        k = b""
    if len(k) < 16:
        raise ValueError("channel address: the key after udp://HOST:PORT/ must be at least 32 hex digits")
    return host, int(port), k


def host_name() -> str:
    """The name this host reports as: $DIASPORA_HOST, else its host name. An adapter treats a
    worker that reports another name as remote (no process control over it)."""
    return os.environ.get("DIASPORA_HOST") or socket.gethostname()


def new_address(tag: str) -> str:
    return f"@diaspora-{tag}-{os.getpid()}-{secrets.token_hex(6)}"


def new_udp_address(host: str, port: int = 0, key: str | None = None) -> str:
    """A UDP address on `host` (a name or IPv4 address of this machine that the other side can
    reach) with a fresh key (or `key`); port 0: any free port (the Listener fills it in)."""
    return f"udp://{host}:{port}/{key or secrets.token_hex(32)}"


def route_to(address: str) -> str:
    """The IPv4 address of this machine's interface that reaches a udp:// `address`."""
    host, port, _ = parse_udp(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port or 9))  # no packet is sent: only the route is looked up
        return s.getsockname()[0]


class Listener:
    """Receives datagrams on `address` (a fresh abstract one by default; "udp://HOST:0/KEY"
    binds a free UDP port on HOST, "udp://HOST[:PORT]" the same with a fresh key, and
    `address` then names it) and calls handler(message: dict) on its own thread for each
    valid one."""

    def __init__(self, handler: Callable[[dict], None], address: str | None = None, tag: str = "ch"):
        if address and address.startswith("udp://") and address.count("/") < 3:
            host, _, port = address[len("udp://"):].partition(":")
            address = new_udp_address(host, int(port or 0))
        self.address = address or new_address(tag)
        self.dropped = 0
        self._handler = handler
        self._key: bytes | None = None
        if self.address.startswith("udp://"):
            host, port, self._key = parse_udp(self.address)
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sock.bind((host, port))
            self.address = f"udp://{host}:{self._sock.getsockname()[1]}/{self._key.hex()}"
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.bind(_sockaddr(self.address))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="diaspora-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(MAX_DATAGRAM + _MAC + 1)
            except socket.timeout:
                continue
            except OSError:
                return
            if self._key is not None:
                mac, data = data[:_MAC], data[_MAC:]
                if not hmac.compare_digest(mac, hmac.new(self._key, data, hashlib.sha256).digest()):
                    self.dropped += 1
                    continue
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
    """One unbound datagram socket per transport and process (re-created after a fork)."""

    _lock = threading.Lock()
    _sock: socket.socket | None = None
    _udp: socket.socket | None = None
    _pid = -1

    @classmethod
    def send(cls, address: str, msg: dict) -> bool:
        """Sends one message; False when nobody listens there (the adapter is gone), the
        receiver's queue is full or the address is not valid. Never raises for those."""
        data = json.dumps(msg, separators=(",", ":")).encode()
        udp = address.startswith("udp://")
        if udp:
            try:
                host, port, key = parse_udp(address)
            except ValueError:
                return False
            data = hmac.new(key, data, hashlib.sha256).digest() + data
        with cls._lock:
            if cls._pid != os.getpid():
                cls._sock = cls._udp = None
                cls._pid = os.getpid()
            try:
                if udp:
                    if cls._udp is None:
                        cls._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        cls._udp.setblocking(False)
                    cls._udp.sendto(data, (host, port))
                else:
                    if cls._sock is None:
                        cls._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                        cls._sock.setblocking(False)
                    cls._sock.sendto(data, _sockaddr(address))
                return True
            except OSError:
                return False
