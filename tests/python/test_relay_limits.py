"""The relay's documented limits and switches (docs/protocol.md "Limits", docs/relay.md),
each tried against a real relay process over TLS: what a client sees when it goes past one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import time

import pytest
import websockets

from relay_harness import RELAY, TIMEOUT, Credentials, RelayProcess, event, metric, request, run, session
from relay_harness import https_request as http


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    return Credentials(tmp_path_factory.mktemp("creds"))


def admin(creds):
    return creds.token("admin", "publish:*", "subscribe:*")


@contextlib.contextmanager
def running(creds, data_dir, config=None):
    """A relay process for the block; it must stop cleanly (exit 0) after it."""
    relay = RelayProcess(creds, data_dir, config=config).start()
    try:
        yield relay
    finally:
        assert relay.stop() == 0


def raw_tls(relay):
    raw = socket.create_connection(("127.0.0.1", relay.port), timeout=TIMEOUT)
    return relay.creds.client_ssl().wrap_socket(raw, server_hostname="127.0.0.1")


def read_head(tls, data=b""):
    """(HTTP response head, bytes read past it)."""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(4096)
        assert chunk, "connection closed before a response"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def raw_upgrade(relay, token):
    """A diaspora.v1 WebSocket on a plain TLS socket: a peer that does only what the test says."""
    tls = raw_tls(relay)
    key = base64.b64encode(os.urandom(16)).decode()
    tls.sendall((f"GET /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: diaspora.v1\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n").encode())
    head, rest = read_head(tls)
    assert head.startswith(b"HTTP/1.1 101"), head
    return tls, rest


def client_frame(opcode: int, payload: bytes = b"") -> bytes:
    """One masked client frame (payload under 126 bytes)."""
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def read_frame(tls, data=b""):
    """(opcode, payload, bytes read past it) of the next server frame (payload under 126 bytes)."""
    def need(n):
        nonlocal data
        while len(data) < n:
            chunk = tls.recv(4096)
            assert chunk, "the relay dropped the connection without a close frame"
            data += chunk
    need(2)
    length = data[1] & 0x7F
    need(2 + length)
    return data[0] & 0x0F, data[2:2 + length], data[2 + length:]


def raw_ping_until_pong(tls, data=b""):
    """Sends a ping and reads frames until the pong: the relay's session is then running
    (it reads frames only once its accept has completed)."""
    tls.sendall(client_frame(0x9))
    opcode = None
    while opcode != 0xA:
        opcode, _, data = read_frame(tls, data)
    return data


def test_readyz_says_503_while_the_relay_drains(creds, tmp_path):
    """SIGTERM: the relay drains its WebSockets (a peer that never answers the close keeps
    it busy for the close handshake's 2 s) and meanwhile answers /readyz with 503 on a
    connection that was already open; /healthz stays 200."""
    relay = RelayProcess(creds, tmp_path / "data").start()  # stopped by the test itself
    http_conn = raw_tls(relay)
    http_conn.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, _ = read_head(http_conn)
    assert head.startswith(b"HTTP/1.1 200"), head
    silent, rest = raw_upgrade(relay, admin(creds))
    raw_ping_until_pong(silent, rest)  # the session is registered before the relay is told to stop
    relay.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    http_conn.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, _ = read_head(http_conn)
    assert head.startswith(b"HTTP/1.1 503"), head
    assert relay.proc.wait(timeout=TIMEOUT) == 0
    silent.close()
    http_conn.close()


def test_batches_over_max_batch_events_are_nacked_whole(creds, tmp_path):
    with running(creds, tmp_path / "data", {"limits": {"max_batch_events": 5}}) as relay:
        async def go():
            ws = await session(relay, admin(creds))
            nack = await request(ws, {"op": "publish", "topic": "b", "seq": 0, "events": [event(i) for i in range(6)]})
            assert nack["op"] == "nack" and nack["code"] == "batch_too_large" and nack["seq"] == 0, nack
            assert "limit of 5" in nack["message"]
            ack = await request(ws, {"op": "publish", "topic": "b", "seq": 1, "events": [event(i) for i in range(5)]})
            assert ack["op"] == "ack" and ack["count"] == 5 and ack["first_offset"] == 0, ack  # nothing of the first
        run(go())


def test_frames_nested_deeper_than_32_levels_are_bad_json_without_ref(creds, tmp_path):
    with running(creds, tmp_path / "data") as relay:
        async def go():
            ws = await session(relay, admin(creds))
            # 31 levels of data inside event, events array, frame: 34 in all.
            deep = 0
            for _ in range(31):
                deep = [deep]
            r = await request(ws, {"op": "publish", "topic": "d", "seq": 3, "events": [event(1, data={"x": deep})]})
            assert r["op"] == "error" and r["code"] == "bad_json" and "ref" not in r, r
            # 32 levels counting the frame and its events array is accepted.
            shallow = 0
            for _ in range(27):
                shallow = [shallow]
            r = await request(ws, {"op": "publish", "topic": "d", "seq": 4, "events": [event(2, data={"x": shallow})]})
            assert r["op"] == "ack", r
        run(go())


def test_a_text_frame_that_is_not_utf8_closes_v1_with_1007(creds, tmp_path):
    with running(creds, tmp_path / "data") as relay:
        async def go():
            ws = await session(relay, admin(creds))
            # websockets only sends valid text: write the frame ourselves.
            ws.transport.write(client_frame(0x1, b'{"op":"ping","id":"\xff\xfe"}'))
            with pytest.raises(websockets.ConnectionClosed) as c:
                await asyncio.wait_for(ws.recv(), TIMEOUT)
            assert c.value.code == 1007
        run(go())


def test_http_methods_challenges_and_private_metrics(creds, tmp_path):
    with running(creds, tmp_path / "data", {"public_metrics": False}) as relay:
        status, _, body = http(relay, "POST", "/api/v1/topics", admin(creds))
        assert status == 405 and "only GET" in body
        assert http(relay, "HEAD", "/healthz")[0] == 200
        status, headers, _ = http(relay, "GET", "/metrics")
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        status, headers, _ = http(relay, "GET", "/metrics", creds.token("subscribe:*"))
        assert status == 403 and "WWW-Authenticate" not in headers
        status, headers, _ = http(relay, "GET", "/api/v1/topics", "not-a-token")
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        status, _, text = http(relay, "GET", "/metrics", admin(creds))
        assert status == 200
        # Each refusal above counted once (401, 403, 401).
        assert metric(text, "diaspora_relay_auth_refusals_total") == 3, text


def test_consumer_lag_follows_commits(creds, tmp_path):
    with running(creds, tmp_path / "data") as relay:
        async def go():
            ws = await session(relay, admin(creds))
            assert (await request(ws, {"op": "publish", "topic": "lag", "seq": 0,
                                       "events": [event(i) for i in range(10)]}))["op"] == "ack"
            r = await request(ws, {"op": "commit", "group": "g", "topic": "lag", "offset": 4})
            assert r["op"] == "committed", r
        run(go())
        text = http(relay, "GET", "/metrics")[2]
        assert metric(text, 'diaspora_relay_consumer_lag{group="g",topic="lag"}') == 6, text


def test_validate_payloads_off_stores_what_the_schema_would_refuse(creds, tmp_path):
    bad = event("bad-payload", type_="org.diaspora.task.started", data={"task_id": "t", "attempt": "one"})
    for validate, expect in ((True, "nack"), (False, "ack")):
        with running(creds, tmp_path / f"data-{validate}", {"validate_payloads": validate}) as relay:
            async def go():
                ws = await session(relay, admin(creds))
                r = await request(ws, {"op": "publish", "topic": "p", "seq": 0, "events": [bad]})
                assert r["op"] == expect, (validate, r)
                if expect == "nack":
                    assert r["code"] == "invalid_event" and "attempt" in r["message"], r
            run(go())


def test_a_silent_peer_is_closed_with_4002_after_the_idle_timeout(creds, tmp_path):
    """A client that sends nothing and answers no ping: a raw TLS socket that upgrades and
    then only listens. It gets a close frame with code 4002 (docs/protocol.md)."""
    with running(creds, tmp_path / "data", {"limits": {"idle_timeout": "2s"}}) as relay:
        tls, data = raw_upgrade(relay, admin(creds))
        opcode = None
        while opcode != 0x8:  # pings, then the close, never answered
            opcode, body, data = read_frame(tls, data)
        assert int.from_bytes(body[:2], "big") == 4002 and b"idle" in body[2:], body
        tls.close()


def test_a_quiet_peer_that_answers_pings_is_never_closed(creds, tmp_path):
    """The relay pings a peer silent for a third of the idle timeout; a client that answers
    (every WebSocket library does) stays connected through several timeouts."""
    with running(creds, tmp_path / "data", {"limits": {"idle_timeout": "2s"}}) as relay:
        async def go():
            ws = await session(relay, admin(creds), ping_interval=None)  # our side never pings
            await asyncio.sleep(7)  # three and a half idle timeouts without sending anything
            assert (await request(ws, {"op": "ping", "id": 1})) == {"op": "pong", "id": 1}
        run(go())


def test_idle_timeout_below_two_seconds_is_refused(creds, tmp_path):
    cfg = tmp_path / "relay.yaml"
    cfg.write_text("listen: 127.0.0.1:0\nlimits:\n  idle_timeout: 1s\n")
    r = subprocess.run([str(RELAY), "--config", str(cfg), "--data-dir", str(tmp_path / "d"),
                        "--tls-cert", str(creds.certs / "server.pem"), "--tls-key", str(creds.certs / "server-key.pem"),
                        "--auth-secret-file", str(creds.secret_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "idle_timeout must be at least 2s" in r.stderr, (r.returncode, r.stderr)


def test_max_inflight_batches_pauses_reading_until_acks_free_a_slot(creds, tmp_path):
    """With max_inflight_batches 1, the relay reads nothing more from a connection while
    one publish is unacked: a ping sent right behind two publishes is answered only after
    both acks. (With room in the window the ping is read at once; its pong may then come
    before the acks, which wait for the fsync.)"""
    with running(creds, tmp_path / "data", {"limits": {"max_inflight_batches": 1}}) as relay:
        async def go():
            ws = await session(relay, admin(creds))
            big = [event(f"e{i}", data={"pad": "x" * 200}) for i in range(3000)]
            for seq in (0, 1):
                await ws.send(json.dumps({"op": "publish", "topic": "w", "seq": seq,
                                          "events": [dict(e, id=f"{seq}-{e['id']}") for e in big]}))
            await ws.send(json.dumps({"op": "ping", "id": "behind"}))
            order = []
            while len(order) < 3:
                m = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                order.append(m["op"] + ("" if m["op"] == "pong" else str(m.get("seq"))))
            assert order == ["ack0", "ack1", "pong"], order
        run(go())
