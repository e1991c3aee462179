"""Helpers for tests that run real `diaspora-relay` processes on 127.0.0.1 with real TLS.

Written from docs/protocol.md with Python's `websockets` (asyncio), not from the relay's
code. Every network wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import ssl
import struct
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import websockets

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DIASPORA_BIN_DIR", REPO / "build" / "bin"))
DIASPORA = BIN / "diaspora"
RELAY = BIN / "diaspora-relay"
TIMEOUT = 20.0  # seconds, any single network wait


def sh(*args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


NATS = shutil.which("nats-server") or "/usr/sbin/nats-server"


class NatsServer:
    """One nats-server with JetStream (its store under `root`) on 127.0.0.1, or on `host` in
    the network namespace `netns`; optionally a node of a cluster (`routes`: the other
    nodes' cluster ports), with a JetStream `domain`, taking leaf nodes on `leaf_port`, or
    a leaf node of the servers at `leaf_remotes` (nats-leaf:// URLs)."""

    def __init__(self, root: Path, name: str = "n1", cluster_port: int = 0, routes: list[int] | None = None, *,
                 host: str = "127.0.0.1", netns: str | None = None, domain: str | None = None,
                 leaf_port: int = 0, leaf_remotes: list[str] | None = None):
        self.root, self.name = root, name
        self.host, self.netns = host, netns
        self.port = free_port()
        self.cluster_port, self.routes = cluster_port, routes or []
        self.domain, self.leaf_port, self.leaf_remotes = domain, leaf_port, leaf_remotes or []
        self.proc: subprocess.Popen | None = None
        self.log = root / f"{name}.log"

    def start(self) -> "NatsServer":
        self.root.mkdir(parents=True, exist_ok=True)
        args = [NATS, "-a", self.host, "-p", str(self.port), "-js", "-sd", str(self.root / self.name), "-n", self.name]
        if self.cluster_port:
            args += ["--cluster_name", "diaspora", "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)]
        if self.domain or self.leaf_port or self.leaf_remotes:  # what only a configuration file says
            conf: dict = {"jetstream": {"domain": self.domain}} if self.domain else {}
            leaf: dict = {}
            if self.leaf_port:
                leaf["listen"] = f"{self.host}:{self.leaf_port}"
            if self.leaf_remotes:
                leaf["remotes"] = [{"url": u} for u in self.leaf_remotes]
            if leaf:
                conf["leafnodes"] = leaf
            conf_file = self.root / f"{self.name}.conf"
            conf_file.write_text(json.dumps(conf))  # nats-server reads JSON as its configuration
            args += ["-c", str(conf_file)]
        if self.netns:
            args = ["ip", "netns", "exec", self.netns] + args  # ip execs the server: the pid is the server's
        # Killed with the test's process, should it die first (a crash must not leave servers behind).
        self.proc = subprocess.Popen(args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL))  # PR_SET_PDEATHSIG
        wait_until(lambda: "Server is ready" in self.log.read_text(errors="replace") or self.proc.poll() is not None,
                   20, f"nats-server {self.name}")
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"


class Credentials:
    """Certificates, a signing secret and tokens in a directory."""

    def __init__(self, root: Path):
        self.root = root
        self.certs = root / "certs"
        sh(DIASPORA, "certs", "init", self.certs)
        self.secret_file = root / "auth-secret"
        sh(DIASPORA, "token", "secret", self.secret_file)
        self.secret = self.secret_file.read_text().strip().encode()
        self.ca = self.certs / "ca.pem"

    def token(self, *scopes: str, subject: str = "tester", ttl: str = "1h") -> str:
        args = [DIASPORA, "token", "issue", "--secret-file", self.secret_file, "--subject", subject, "--ttl", ttl]
        for s in scopes:
            args += ["--scope", s]
        return sh(*args).stdout.strip()

    def forge(self, claims: dict, header: dict | None = None, secret: bytes | None = None) -> str:
        """A token signed here (for expired / not-yet-valid / wrong-key cases)."""
        enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
        signing = f"{enc(header or {'alg': 'HS256', 'typ': 'JWT'})}.{enc(claims)}"
        sig = hmac.new(secret or self.secret, signing.encode(), hashlib.sha256).digest()
        return f"{signing}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"

    def renew_server_cert(self, valid_s: float, key_of: Path | None = None, ips: tuple[str, ...] = ()) -> float:
        """Writes a new server certificate (127.0.0.1, `ips` and localhost, signed by the CA) valid
        from a minute ago for `valid_s` seconds, with a new key (or the key in `key_of`, to
        write one that does not match), over server.pem and server-key.pem; returns its
        notAfter (Unix seconds, whole). What a certificate renewal, or one that runs out
        soon, leaves on disk."""
        import datetime
        import ipaddress
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
        ca_cert = x509.load_pem_x509_certificate((self.certs / "ca.pem").read_bytes())
        ca_key = serialization.load_pem_private_key((self.certs / "ca-key.pem").read_bytes(), None)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        not_after = now + datetime.timedelta(seconds=valid_s)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(not_after)
                .add_extension(x509.SubjectAlternativeName(
                    [x509.DNSName("localhost")] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", *ips)]),
                    False)
                .sign(ca_key, hashes.SHA256()))
        (self.certs / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if key_of is None:
            (self.certs / "server-key.pem").write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        else:
            (self.certs / "server-key.pem").write_bytes(key_of.read_bytes())
        return not_after.timestamp()

    def client_ssl(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            ctx.load_cert_chain(str(self.certs / "client.pem"), str(self.certs / "client-key.pem"))
        return ctx


SANITIZER_REPORT = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:")


def project_env() -> dict:
    """The environment for a Diaspora binary the test starts. The sanitized pass runs the
    Python interpreter of test_plugin and test_adapters_python with the ASan runtime preloaded
    and leak detection off (the interpreter's own allocations would be reported at exit); a
    Diaspora binary links the runtime itself and must keep leak detection on: both are
    undone here. Elsewhere the environment is the test's own."""
    env = dict(os.environ)
    if "LD_PRELOAD" in env and "libasan" in env["LD_PRELOAD"]:
        del env["LD_PRELOAD"]
    opts = [o for o in env.get("ASAN_OPTIONS", "").split(":") if o and not o.startswith("detect_leaks=")]
    if opts:
        env["ASAN_OPTIONS"] = ":".join(opts)
    else:
        env.pop("ASAN_OPTIONS", None)
    return env


FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")  # Debian's libfaketime


def clock_env(stamp_file: Path) -> dict:
    """The environment that runs a process on a wall clock the test steps: libfaketime reads
    the offset from `stamp_file` ("+0", "-1h", ...) at every call; the monotonic clock is
    left alone, as an NTP step leaves it."""
    env = {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME_TIMESTAMP_FILE": str(stamp_file), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    if os.environ.get("DIASPORA_SANITIZED"):  # the sanitizer's runtime need not come first then
        env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""), "verify_asan_link_order=0"]))
    return env


class Netns:
    """A network namespace for the relay, joined to this one by a veth pair the test makes
    (host end 10.213.K.1/30, namespace end 10.213.K.2/30): a partition takes the namespace's
    end down, so nothing passes either way and nobody is told (a cable pulled, not a
    reset); healing brings it up, and the TCP connections that lived through it go on if
    their retransmissions have not given up. Removed at close()."""

    def __init__(self, tag: str = "c"):
        k = os.getpid() % 100000  # with `tag` (one letter), one namespace of this process among others
        self.name, self.host_if, self.ns_if = f"d{tag}chaos{k}", f"d{tag}{k}h", f"d{tag}{k}n"
        net = (k + ord(tag) * 7) % 250
        self.host_ip, self.ns_ip = f"10.213.{net}.1", f"10.213.{net}.2"
        self.close()  # what a killed earlier run of this pid left
        for cmd in (["ip", "netns", "add", self.name],
                    ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
                    ["ip", "link", "set", self.ns_if, "netns", self.name],
                    ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if],
                    ["ip", "link", "set", self.host_if, "up"],
                    self.inside("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if),
                    self.inside("ip", "link", "set", self.ns_if, "up"),
                    self.inside("ip", "link", "set", "lo", "up")):
            subprocess.run(cmd, check=True, capture_output=True)

    def inside(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def link(self, up: bool) -> None:
        subprocess.run(self.inside("ip", "link", "set", self.ns_if, "up" if up else "down"), check=True)
        if up:  # neighbours the cut left unresolved: a new connection would get "no route to host" for a while
            subprocess.run(["ip", "neigh", "flush", "dev", self.host_if], capture_output=True)
            subprocess.run(self.inside("ip", "neigh", "flush", "dev", self.ns_if), capture_output=True)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)  # its peer goes with it
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


class RelayProcess:
    """A diaspora-relay child process; restartable on the same data directory."""

    def __init__(self, creds: Credentials, data_dir: Path, config: dict | None = None, mtls: bool = False,
                 fsync: str = "always", port: int = 0, host: str = "127.0.0.1", netns: str | None = None):
        self.creds = creds
        self.host = host  # the address it listens on (and clients connect to)
        self.netns = netns  # a network namespace to run it in (ip netns exec), or None
        self.env: dict = {}  # more environment (clock_env(), for a relay on a stepped clock)
        self.listen_port = port  # 0: a free port on each start; else the same one every time
        self.data_dir = data_dir
        self.config = config
        self.mtls = mtls
        self.fsync = fsync
        self.proc: subprocess.Popen | None = None
        self.killed = False
        self.port = 0
        self.log = data_dir.parent / f"{data_dir.name}.relay.log"

    def start(self) -> "RelayProcess":
        port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        if port_file.exists():
            port_file.unlink()
        args = [RELAY, "--listen", f"{self.host}:{self.listen_port}", "--data-dir", self.data_dir,
                "--tls-cert", self.creds.certs / "server.pem", "--tls-key", self.creds.certs / "server-key.pem",
                "--auth-secret-file", self.creds.secret_file, "--port-file", port_file, "--fsync", self.fsync]
        if self.mtls:
            args += ["--client-ca", self.creds.ca]
        if self.config is not None:
            cfg = self.data_dir.parent / f"{self.data_dir.name}.relay.yaml"
            cfg.write_text(json.dumps(self.config))  # JSON is YAML
            args += ["--config", cfg]
        if self.netns:
            args = ["ip", "netns", "exec", self.netns] + args  # ip execs the relay: the pid is the relay's
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen([str(a) for a in args], stdout=logf, stderr=logf, env={**project_env(), **self.env})
        self.killed = False  # set by kill(): the exit status that follows is the test's doing
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text())
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"relay exited with {self.proc.returncode}:\n{self.log.read_text()}")
            time.sleep(0.02)
        raise AssertionError("relay did not start in time")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=TIMEOUT)
            self.killed = True

    def stop(self) -> int:
        """SIGTERM, and its exit status. A relay that has not exited within TIMEOUT seconds
        is killed (no stray relay left behind) and AssertionError says where its threads
        were: their stacks (gdb, when installed) or their states, and its log's tail."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            where = thread_stacks(self.proc.pid)
            self.kill()
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise AssertionError(f"the relay did not stop within {TIMEOUT:.0f} s of SIGTERM; its threads:\n{where}\n"
                                 f"its log's tail:\n{text[-3000:]}") from None

    def reload(self) -> None:
        """SIGHUP: the relay loads its certificate and key again."""
        self.proc.send_signal(signal.SIGHUP)

    def stop_cleanly(self) -> None:
        """stop(), then fails (AssertionError with the log's tail) when the relay exited with a
        non-zero status that no kill() of the test caused, or when its log holds a sanitizer
        report (ASan, LSan, TSan, UBSan's "runtime error:")."""
        rc = self.stop()
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        report = SANITIZER_REPORT.search(text)
        assert report is None, f"the relay's log holds a sanitizer report:\n{text[max(0, report.start() - 200):][:4000]}"
        assert rc == 0 or self.killed, f"the relay exited with status {rc} at stop:\n{text[-3000:]}"

    @property
    def url(self) -> str:
        return f"wss://{self.host}:{self.port}"


_WAIT_FRAMES = ("futex", "pthread_cond", "lll_", "start_thread", "clone3", "posix_thread", "thread_function",
                "conditionally_enabled", "posix_event", "pthread_clockjoin", "__GI___poll", "epoll_wait")


def thread_stacks(pid: int) -> str:
    """Where the threads of process `pid` are: every thread's stack by gdb when it is
    installed, else each thread's name, state and kernel wait channel from /proc."""
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"],
                               capture_output=True, text=True, timeout=60)
            # Each thread's own frames, the waits' libc and scheduler frames left out, at most
            # 8 a thread: every thread fits (the one a join waits for is rarely the last).
            out, kept = [], 0
            for ln in r.stdout.splitlines():
                if ln.startswith("Thread "):
                    out.append(ln[:120])
                    kept = 0
                elif ln.startswith("#") and kept < 8 and not any(w in ln for w in _WAIT_FRAMES):
                    out.append("  " + ln[:220])
                    kept += 1
            if out:
                return "\n".join(out)
        except (OSError, subprocess.TimeoutExpired):
            pass  # (no ptrace here, say): the states below
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
        def field(name: str) -> str:
            try:
                return (task / name).read_text(errors="replace").strip()
            except OSError:
                return "?"
        state = field("stat").rsplit(")", 1)[-1].split()[:1]
        out.append(f"{task.name} {field('comm')} {state[0] if state else '?'} {field('wchan')}")
    return "\n".join(out)


def stop_all(relays: list[RelayProcess], nodes: list[NatsServer]) -> None:
    """Stops every relay (checking its log and exit) and every node, all of them even when one
    check fails; then raises the first failure."""
    failures = []
    for r in relays:
        try:
            r.stop_cleanly()
        except AssertionError as e:
            failures.append(e)
            r.kill()
    for n in nodes:
        n.stop()
    if failures:
        raise failures[0]


async def connect(relay: RelayProcess, token: str | None = None, path: str = "/v1",
                  subprotocol: str = "diaspora.v1", header_token: bool = True, ssl_ctx=None, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token and header_token else {}
    ws = await asyncio.wait_for(websockets.connect(
        relay.url + path, ssl=ssl_ctx or relay.creds.client_ssl(), subprotocols=[subprotocol],
        extra_headers=headers, max_size=64 * 2**20, open_timeout=TIMEOUT, close_timeout=2, **kw), TIMEOUT)
    _open.append(ws)
    return ws


async def request(ws, msg: dict) -> dict:
    await ws.send(json.dumps(msg))
    return await recv(ws)


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def session(relay: RelayProcess, token: str, producer_id: str | None = None, **kw):
    """A diaspora.v1 connection after hello/welcome."""
    ws = await connect(relay, token, **kw)
    hello = {"op": "hello", "client_id": "pytest"}
    if producer_id:
        hello["producer_id"] = producer_id
    welcome = await request(ws, hello)
    assert welcome["op"] == "welcome", welcome
    return ws


def event(i: int | str, source: str = "/pytest", type_: str = "org.example.test", data=None) -> dict:
    return {"specversion": "1.0", "id": str(i), "source": source, "type": type_,
            "data": data if data is not None else {"i": i}}


_open: list = []  # connections made by connect(), closed when run() ends


def run(coro):
    """Runs a test coroutine with a watchdog, then closes every connection it opened (an
    unclosed websockets connection makes asyncio's shutdown wait for its close timeout)."""
    async def main():
        try:
            return await asyncio.wait_for(coro, 120)
        finally:
            for ws in _open:
                try:
                    await asyncio.wait_for(ws.close(), 5)
                except Exception:
                    pass
            _open.clear()
    return asyncio.run(main())


def wait_until(cond, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    """Polls cond() until it returns something truthy, and returns that; AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metric(text: str, name: str) -> float | None:
    """The value of the Prometheus line of `text` that starts with `name` (labels included),
    or None."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a relay that must come up
    later on a port the client already knows)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_id() -> str:
    return uuid.uuid4().hex[:12]


async def collect_all(relay: RelayProcess, token: str, topic: str, n: int):
    """Subscribes from earliest and returns [(offset, event)] once n events arrived."""
    ws = await session(relay, token)
    await ws.send(json.dumps({"op": "subscribe", "id": "all", "topic": topic, "from": "earliest"}))
    out = []
    while len(out) < n:
        m = await recv(ws)
        if m["op"] == "events":
            out += [(e["offset"], e["event"]) for e in m["events"]]
    await ws.close()
    return out


def write_spec(tmp_path: Path, creds: Credentials, token_file: Path, port: int, *, name: str = "plug",
               sites: list[dict] | None = None, extra: dict | None = None, **plugin) -> Path:
    """A workflow spec for an engine plugin talking to a relay on 127.0.0.1:`port`, its
    spool under tmp_path; `extra` adds top-level sections (policies, tasks)."""
    plugin.setdefault("spool_dir", str(tmp_path / "spool"))
    plugin.setdefault("reconnect_max", "1s")
    spec = {
        "version": 1, "name": name,
        "relay": {"url": f"wss://127.0.0.1:{port}", "ca_file": str(creds.ca), "token_file": str(token_file)},
        "plugin": plugin,
        "sites": sites or [{"name": "local", "engine": "local"}],
        **(extra or {}),
    }
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def relay_events(relay: RelayProcess, token: str, n: int, topic: str = "plug.events",
                 counted=lambda e: e["type"].startswith("org.diaspora.task."), within_s: float = 60) -> list[dict]:
    """Every event of `topic` from the start, once `n` of them satisfy `counted` (then
    whatever else is already there, read until 0.5 s pass without more), or what came
    within `within_s` seconds."""
    async def go():
        ws = await session(relay, token)
        await ws.send(json.dumps({"op": "subscribe", "id": "all", "topic": topic, "from": "earliest"}))
        out, deadline = [], time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                m = await asyncio.wait_for(ws.recv(), 0.5)
            except asyncio.TimeoutError:
                if sum(1 for e in out if counted(e)) >= n:
                    break
                continue
            m = json.loads(m)
            if m["op"] == "events":
                out += [e["event"] for e in m["events"]]
        await ws.close()
        return out
    return run(go())


def publish_events(relay: RelayProcess, token: str, topic: str, events: list[dict]) -> None:
    """Publishes `events` on `topic` in one batch and waits for the relay's ack."""
    async def go():
        ws = await session(relay, token)
        await ws.send(json.dumps({"op": "publish", "topic": topic, "seq": 0, "events": events}))
        ack = await recv(ws)
        assert ack["op"] == "ack", ack
    run(go())


def publish_action(relay: RelayProcess, token: str, data: dict, topic: str = "plug.control.engine") -> None:
    """Publishes an operator's org.diaspora.action.requested (`data`: action_id, action,
    reason, ...) on an engine's control topic and waits for the relay's ack."""
    publish_events(relay, token, topic,
                   [event(data["action_id"], source="/operator", type_="org.diaspora.action.requested", data=data)])


def https_get(relay: RelayProcess, path: str, token: str | None = None) -> str:
    """The body of GET https://HOST:PORT/PATH (urllib's HTTPError on a status >= 400)."""
    req = urllib.request.Request(f"https://{relay.host}:{relay.port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, context=relay.creds.client_ssl(), timeout=20) as r:
        return r.read().decode()


def wait_subscribed(relay: RelayProcess, topic: str, token: str | None = None, timeout: float = 30.0) -> None:
    """Waits until the relay has an open subscription to `topic` (its /metrics gauge): an
    engine's control subscription is up, so an action published now reaches it."""
    line = f'diaspora_relay_subscriptions{{topic="{topic}"}} '
    wait_until(lambda: line in https_get(relay, "/metrics", token), timeout, f"a subscription to {topic}")


def https_post(relay: RelayProcess, path: str, body, token: str | None) -> tuple[int, dict]:
    """POST https://HOST:PORT/PATH with a JSON body (or raw bytes): (status, the JSON answer)."""
    req = urllib.request.Request(f"https://{relay.host}:{relay.port}{path}", method="POST",
                                 data=(body if isinstance(body, bytes) else json.dumps(body).encode()),
                                 headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=relay.creds.client_ssl(), timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def https_request(relay: RelayProcess, method: str, path: str, token: str | None = None):
    """(status, headers, body text) of one HTTPS request; an error status is returned, not raised."""
    req = urllib.request.Request(f"https://{relay.host}:{relay.port}{path}", method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=relay.creds.client_ssl(), timeout=TIMEOUT) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def https_status(relay: RelayProcess, path: str, token: str | None = None) -> int:
    try:
        https_get(relay, path, token)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


# ---- the log's segment files, read independently of the relay's code ----------------------

def _crc32c_table():
    poly = 0x82F63B78
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def read_segments(topic_dir: Path):
    """Parses every record of a topic per the format documented in relay/src/topic_log.hpp:
    u32 length, u32 crc32c (over the `length` bytes that follow), u64 offset, i64 time_us,
    u64 producer_seq, u16 + producer id, u16 + dedupe key, payload. All little-endian."""
    records = []
    for seg in sorted(topic_dir.glob("*.log")):
        data = seg.read_bytes()
        pos = 0
        while pos < len(data):
            assert pos + 8 <= len(data), f"{seg}: torn record header at {pos} after recovery"
            length, crc = struct.unpack_from("<II", data, pos)
            body = data[pos + 8: pos + 8 + length]
            assert len(body) == length, f"{seg}: torn record at {pos} after recovery"
            assert crc32c(body) == crc, f"{seg}: CRC mismatch at {pos}"
            offset, _time_us, _seq, plen = struct.unpack_from("<QqQH", body, 0)
            p = 26 + plen
            (klen,) = struct.unpack_from("<H", body, p)
            payload = body[p + 2 + klen:]
            records.append((offset, json.loads(payload)))
            pos += 8 + length
    return records
