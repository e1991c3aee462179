"""The Python package `diaspora` (engine-adapters/python) over the real plugin library and
a real relay on 127.0.0.1 with TLS: every hook lands on the relay once, in order, with its
fields; errors are exceptions with the plugin's message; actions by iterator and
callback; `required: false`; the GIL is released while the plugin blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import (REPO, free_port, publish_action,  # noqa: E402
                           relay_events, write_spec)

sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
import diaspora  # noqa: E402


def test_every_hook_reaches_the_relay_once_in_order(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port)
    with diaspora.Plugin.open(spec) as p:
        p.submitted("t1", site="local", name="recon", attempt=1, deadline_s=30)
        p.started("t1", site="local", worker="w0", attempt=1)
        p.heartbeat("t1", metrics={"step_time_s": 0.25, "rows": 7})
        p.progress("t1", 0.5, step=3)
        p.completed("t1", exit_code=0)
        p.submitted("t2", site="local")
        p.failed("t2", "ValueError: bad frame", exit_code=3, retryable=True)
        p.submitted("t3", site="local")
        p.cancelled("t3", "superseded")
        p.metric("site", "local", "queue_length", 4)
        p.data_arrived("frames", 0, bytes=1024, uri="file:///tmp/f0", checksum="crc32c:0a0b0c0d", site="local")
        p.resource_status("w0", "worker", "degraded", site="local", metrics={"cpu": 0.9})
        assert p.wait_acked(30), p.stats()
        s = p.stats()
        assert s["events_accepted"] == 12 and s["events_lost"] == 0 and s["invalid_transitions"] == 0, s
    events = relay_events(relay, token[0], 9)
    tasks = [(e["type"].rsplit(".", 1)[1], e["data"]["task_id"]) for e in events if e["type"].startswith("org.diaspora.task.")]
    assert tasks == [("submitted", "t1"), ("started", "t1"), ("heartbeat", "t1"), ("progress", "t1"), ("completed", "t1"),
                     ("submitted", "t2"), ("failed", "t2"), ("submitted", "t3"), ("cancelled", "t3")]
    by = {(e["type"], e["data"].get("task_id")): e["data"] for e in events}
    assert by[("org.diaspora.task.heartbeat", "t1")]["metrics"] == {"step_time_s": 0.25, "rows": 7}
    assert by[("org.diaspora.task.failed", "t2")]["reason"] == "ValueError: bad frame"
    assert by[("org.diaspora.task.failed", "t2")]["exit_code"] == 3
    assert by[("org.diaspora.task.started", "t1")]["worker"] == "w0"
    kinds = [e["type"] for e in events]
    for t in ("org.diaspora.metric", "org.diaspora.data.arrived", "org.diaspora.resource.status"):
        assert kinds.count(t) == 1, kinds


def test_the_same_from_yaml_text_and_errors_carry_the_plugins_message(relay, token, tmp_path):
    text = write_spec(tmp_path, relay.creds, token[1], relay.port).read_text()
    with diaspora.Plugin.open(text) as p:
        with pytest.raises(diaspora.DiasporaError, match="progress") as e:
            p.progress("t1", 1.5)
        assert e.value.status == "DIASPORA_ERR_INVALID"
        with pytest.raises(ValueError):
            p.failed("t1", "")
        with pytest.raises(ValueError, match="scope"):
            p.metric("cluster", "x", "y", 1)
    with pytest.raises(diaspora.ClosedError):
        p.started("t1")
    assert p.close() is True  # idempotent


def test_a_bad_spec_is_a_spec_error_with_file_line_col(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nsites:\n  - {name: a, engine: lokal}\n")
    with pytest.raises(diaspora.SpecError) as e:
        diaspora.Plugin.open(bad)
    assert any(line.startswith(f"{bad}:4:") and "engine" in line for line in e.value.problems), e.value.message
    with pytest.raises(diaspora.SpecError, match=r"<yaml>:2:7"):
        diaspora.Plugin.open("version: 1\nname: [x\n")


def test_a_missing_library_and_a_wrong_abi_are_refused_unless_not_required(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port)
    with pytest.raises(diaspora.LibraryError, match="nowhere/libdiaspora_plugin.so"):
        diaspora.Plugin.open(spec, library=tmp_path / "nowhere" / "libdiaspora_plugin.so")
    # A library exporting the whole ABI whose version check says 2.0.
    from diaspora import _abi
    names = [
        "diaspora_abi_version", "diaspora_library_version", "diaspora_status_name", "diaspora_open_file",
        "diaspora_open_yaml", "diaspora_close", "diaspora_last_error", "diaspora_metric_sample",
        "diaspora_data_arrived", "diaspora_resource_status", "diaspora_set_action_callback",
        "diaspora_poll_action", "diaspora_action_done", "diaspora_action_failed", "diaspora_get_stats",
    ] + [f"diaspora_task_{h}" for h in _abi.TASK_HOOKS]
    src = tmp_path / "fake.c"
    src.write_text("#include <string.h>\n#include <stddef.h>\n" + "".join(f"long {n}(void) {{ return 0; }}\n" for n in names)
                   + "int diaspora_abi_check(unsigned v, char* e, size_t n) { strncpy(e, \"plugin library ABI 2.0 "
                     "cannot serve an engine built for ABI 1.0\", n); return 9; }\n")
    fake = tmp_path / "libfake.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(fake), str(src)], check=True)
    with pytest.raises(diaspora.AbiError, match="ABI 2.0 cannot serve"):
        diaspora.Plugin.open(spec, library=fake)
    # Not required: a warning, and a plugin that does nothing.
    with pytest.warns(RuntimeWarning, match="running without the plugin"):
        p = diaspora.Plugin.open(spec, library=fake, required=False)
    assert not p.enabled and "ABI 2.0" in p.last_error()
    p.submitted("t1")
    p.failed("t1", "x")
    assert list(p.actions(timeout=0)) == [] and p.close()
    # ... also when the spec says so.
    lax = tmp_path / "lax.yaml"
    doc = json.loads(spec.read_text())
    doc["plugin"]["required"] = False
    doc["plugin"]["library"] = "nowhere.so"  # relative to the spec's folder
    lax.write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = diaspora.Plugin.open(lax)
    assert not p.enabled and str(tmp_path / "nowhere.so") in p.reason and w
    with pytest.raises(diaspora.LibraryError):
        diaspora.Plugin.open(lax, required=True)


def test_actions_by_iterator_and_by_callback_are_acknowledged_on_the_relay(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port)
    with diaspora.Plugin.open(spec) as p:
        deadline = time.monotonic() + 30
        while p.stats()["control_connected"] != 1:
            assert time.monotonic() < deadline, p.last_error()
            time.sleep(0.05)
        publish_action(relay, token[0], {"action_id": "op-1", "action": "migrate", "task_id": "t9",
                                         "target_site": "b", "reason": "operator says so"})
        got = next(iter(p.actions(timeout=30)))
        assert (got.id, got.kind, got.task_id, got.target_site, got.origin) == ("op-1", "migrate", "t9", "b", "control")
        got.done("moved to b")
        with pytest.raises(diaspora.DiasporaError) as e:
            got.done("again")
        assert e.value.status == "DIASPORA_ERR_NOT_FOUND"
        seen, threads = [], []
        p.on_action(lambda a: (seen.append(a), threads.append(threading.get_ident()), a.failed("no capacity")))
        p.on_action(lambda a: (seen.append(a), threads.append(threading.get_ident()), a.failed("no capacity")))
        publish_action(relay, token[0], {"action_id": "op-2", "action": "restart", "task_id": "t9", "reason": "r"})

        def boom(a):
            raise RuntimeError("engine bug")
        deadline = time.monotonic() + 30
        while not seen:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert seen[0].kind == "restart" and threads[0] != threading.get_ident()  # the control thread
        p.on_action(boom)
        publish_action(relay, token[0], {"action_id": "op-3", "action": "cancel", "task_id": "t9", "reason": "r"})
        assert p.wait_acked(30)
        deadline = time.monotonic() + 30
        while sum(1 for e in relay_events(relay, token[0], 0, counted=lambda e: False)
                  if e["type"] == "org.diaspora.action.done") < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    done = {e["data"]["action_id"]: e["data"] for e in relay_events(relay, token[0], 0, counted=lambda e: False)
            if e["type"] == "org.diaspora.action.done"}
    assert done["op-1"]["status"] == "done" and done["op-1"]["message"] == "moved to b"
    assert done["op-2"]["status"] == "failed" and done["op-2"]["message"] == "no capacity"
    assert done["op-3"]["status"] == "failed" and "RuntimeError: engine bug" in done["op-3"]["message"]


def test_a_local_policy_decides_and_the_action_arrives(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, extra={"policies": [
        {"name": "restart-failed", "signal": "task.failures", "detector": "threshold", "threshold": 1,
         "action": "restart"}]})
    with diaspora.Plugin.open(spec) as p:
        p.submitted("t1", site="local", attempt=1)
        p.started("t1", site="local", worker="w0", attempt=1)
        p.failed("t1", "OSError: disk")
        a = next(iter(p.actions(timeout=20)))
        assert a.kind == "restart" and a.task_id == "t1" and a.origin == "local" and "restart-failed" in a.reason
        a.done("attempt 2")


def test_the_gil_is_free_while_close_waits_for_an_absent_relay(token, tmp_path, creds):
    spec = write_spec(tmp_path, creds, token[1], free_port())  # nobody listens there
    p = diaspora.Plugin.open(spec)
    for i in range(50):
        p.submitted(f"t{i}")
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1
    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.2)
    before = count[0]
    t0 = time.monotonic()
    assert p.close(1.5) is False  # not acked: spooled for the next open
    waited = time.monotonic() - t0
    during = count[0] - before
    stop.set()
    th.join()
    assert waited >= 1.0
    assert during > 100_000, f"the Python thread ran {during} loops in {waited:.1f} s of close()"
    with diaspora.Plugin.open(spec) as again:  # the spool is replayed on the next open
        assert again.stats()["spool_records"] >= 50
        again.close(0)


def test_task_knows_no_engine_and_reports_through_an_adapters_context_hook():
    # diaspora.task imports no engine (the Dask adapter registers its hook, not the reverse).
    code = ("import sys; import diaspora.task; "
            "print(sorted(m for m in ('dask', 'distributed', 'diaspora.dask') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "engine-adapters" / "python")})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    from diaspora import task
    from diaspora.channel import Listener
    got = []
    listener = Listener(got.append)
    try:
        ctx = task.EngineContext("k.0", listener.address)
        task.set_context_hook(lambda: ctx)
        try:
            task.step(rows=3)
            task.progress(0.5, step=1)
        finally:
            task.set_context_hook(None)
        task.step()  # no hook, no Runner: a no-op
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        listener.close()
    kinds = [(m["t"], m["k"]) for m in got]
    assert kinds == [("k.0", "hb"), ("k.0", "progress")], got
    assert got[0]["m"]["rows"] == 3.0 and got[0]["m"]["step_time_s"] >= 0


def test_the_udp_channel_takes_only_datagrams_signed_with_its_key_and_refuses_bad_addresses():
    from diaspora.channel import Listener, Sender, new_udp_address, parse_udp, route_to

    got = []
    listener = Listener(got.append, address=new_udp_address("127.0.0.1"))
    try:
        host, port, key = parse_udp(listener.address)
        assert host == "127.0.0.1" and port > 0 and len(key) == 32
        assert route_to(listener.address) == "127.0.0.1"
        other_key = listener.address.rsplit("/", 1)[0] + "/" + "cd" * 32
        assert Sender.send(other_key, {"t": "forged", "k": "hb"})
        assert Sender.send(listener.address, {"t": "real", "k": "hb"})
        deadline = time.monotonic() + 5
        while (not got or listener.dropped < 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [m["t"] for m in got] == ["real"] and listener.dropped == 1
    finally:
        listener.close()
    for bad, what in (("udp://127.0.0.1/" + "ab" * 32, "expected udp://HOST:PORT/KEY"),
                      ("udp://127.0.0.1:5/abc", "at least 32 hex digits")):
        with pytest.raises(ValueError, match=what):
            parse_udp(bad)
        assert Sender.send(bad, {"t": "x"}) is False  # a bad address is a failed send, never an exception


def test_data_items_put_and_get_through_the_plugin_block_until_acked_across_a_relay_restart(relay, token, tmp_path):
    """Plugin.put_item / get_item (ABI 1.3, docs/streaming.md): items round-trip by offset
    with their events; the same id again is not written twice; a put made while the relay
    is down blocks and lands once it is back (on the same port); with no relay at all it
    times out; an offset that holds no item is DIASPORA_ERR_NOT_FOUND."""
    import hashlib
    import random

    spec = write_spec(tmp_path, relay.creds, token[1], relay.port)
    blobs = [random.Random(i).randbytes(n) for i, n in enumerate((1 << 20, 0, 300_000))]
    with diaspora.Plugin.open(spec) as p:
        refs = [p.put_item(b, id=f"frame-{i}", stream="frames", seq=i, content_type="application/octet-stream", site="edge")
                for i, b in enumerate(blobs)]
        assert [r.topic for r in refs] == ["plug.data"] * 3 and not any(r.duplicate or r.late for r in refs), refs
        assert refs[1].offset == refs[0].offset + 1 + 4 and refs[2].offset == refs[1].offset + 1, refs  # 4 chunks, then none
        for r, b in zip(refs, blobs):
            data, ev = p.get_item(r.offset)
            assert data == b and ev["itemsha256"] == hashlib.sha256(b).hexdigest()
            assert ev["type"] == "org.diaspora.data.item" and ev["source"] == "/diaspora/plug/engine", ev
        assert ev["data"] == {"stream": "frames", "seq": 2, "content_type": "application/octet-stream", "site": "edge"}
        assert p.put_item(blobs[2], id="frame-2").duplicate
        # Announced with data_arrived, the item's URI is enough to fetch it.
        assert refs[2].uri == f"diaspora://plug.data/{refs[2].offset}"
        p.data_arrived("frames", 2, bytes=len(blobs[2]), uri=refs[2].uri, site="edge")
        assert p.get_item(refs[2].uri)[0] == blobs[2] and p.get_item(refs[0])[0] == blobs[0]
        with pytest.raises(ValueError):
            p.get_item("file:///tmp/x")
        with pytest.raises(diaspora.DiasporaError) as e:
            p.get_item(refs[0].offset + 1, timeout=10)  # a chunk: no item starts there
        assert e.value.status == "DIASPORA_ERR_NOT_FOUND", e.value
        # The relay goes away; a put blocks until it is back, then lands once.
        relay.kill()
        relay.listen_port = relay.port
        back = threading.Timer(1.5, relay.start)
        back.start()
        t0 = time.monotonic()
        ref = p.put_item(b"after the restart", id="late-comer", timeout=60)
        back.join()
        assert time.monotonic() - t0 >= 1.0, "the put returned before the relay was back"
        assert p.get_item(ref.offset)[0] == b"after the restart"
        relay.kill()
        with pytest.raises(diaspora.DiasporaError) as e:
            p.put_item(b"nobody", timeout=2)
        assert e.value.status == "DIASPORA_ERR_TIMEOUT", e.value
        relay.start()
    disabled = diaspora.DisabledPlugin("no library here")
    with pytest.raises(diaspora.DiasporaError):
        disabled.put_item(b"x")
