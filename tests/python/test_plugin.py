"""The engine plugin (libdiaspora_plugin.so) against real relay processes on 127.0.0.1
with real TLS: symbol visibility, the dlopen example, delivery while the relay is down,
after an engine crash and across a relay restart, operator actions, many threads.

The plugin is driven through its C ABI with ctypes (plugin_ctypes.py), in this process or
in child processes that are SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import plugin_ctypes as pc  # noqa: E402
from relay_harness import (BIN, Credentials, RelayProcess, event, free_port, project_env, publish_action,  # noqa: E402
                           recv, relay_events, run, session, write_spec)

MINIMAL = BIN / "diaspora-plugin-minimal"
TOPIC = "plug.events"


@pytest.fixture(scope="module")
def creds(tmp_path_factory) -> Credentials:
    return Credentials(tmp_path_factory.mktemp("plugin-creds"))


@pytest.fixture
def token_file(creds, tmp_path) -> Path:
    f = tmp_path / "token"
    f.write_text(creds.token("publish:*", "subscribe:*") + "\n")
    return f


def task_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"].startswith("org.diaspora.task.")]


def check_exactly_once_in_order(events: list[dict], tasks: int, prefix: str = "task") -> None:
    """Each task's six events exactly once, in lifecycle order, tasks in reporting order."""
    evs = task_events(events)
    ids = [(e["source"], e["id"]) for e in evs]
    assert len(ids) == len(set(ids)), "duplicate events"
    assert len(evs) == tasks * 6, f"expected {tasks * 6} task events, got {len(evs)}"
    per_task = defaultdict(list)
    last_index = -1
    for e in evs:
        tid = e["data"]["task_id"]
        index = int(tid.rsplit("-", 1)[1])
        assert index >= last_index, f"{tid} after task {last_index}: order broken"
        last_index = index
        kind = e["type"].rsplit(".", 1)[1]
        per_task[tid].append(kind if kind != "heartbeat" else f"hb{int(e['data']['metrics']['k'])}")
    for tid, kinds in per_task.items():
        assert kinds == ["submitted", "started", "hb0", "hb1", "hb2", "completed"], (tid, kinds)


def test_only_the_c_abi_is_exported():
    out = subprocess.run(["nm", "-D", "--defined-only", str(pc.LIB)], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names, "no symbols?"
    assert [n for n in names if not n.startswith("diaspora_")] == []
    header = (Path(__file__).resolve().parents[2] / "plugin/include/diaspora/plugin.h").read_text()
    import re
    declared = sorted(set(re.findall(r"DIASPORA_API [^;(]*?\b(diaspora_\w+)\(", header)))
    assert names == declared


def test_minimal_example_runs_against_a_relay(creds, token_file, tmp_path):
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        spec = write_spec(tmp_path, creds, token_file, relay.port)
        p = subprocess.run([str(MINIMAL), str(pc.LIB), str(spec), "3"], capture_output=True, text=True, timeout=60,
                           env=project_env())
        assert p.returncode == 0, p.stdout + p.stderr
        assert "reported 3 tasks (21 events accepted)" in p.stdout and "close: DIASPORA_OK" in p.stdout, p.stdout
        evs = task_events(relay_events(relay, creds.token("subscribe:*"), 21))
        kinds = [e["type"].rsplit(".", 1)[1] for e in evs if e["data"]["task_id"] == "task-1"]
        assert kinds == ["submitted", "started"] + ["progress"] * 4 + ["completed"]
        started = next(e for e in evs if e["type"].endswith("started"))
        assert started["source"] == "/diaspora/plug/engine" and started["subject"] == started["data"]["task_id"]
        assert "queue_wait_s" in started["data"]
        done = next(e for e in evs if e["type"].endswith("completed"))
        assert done["data"]["exit_code"] == 0 and done["data"]["runtime_s"] >= 0
    finally:
        relay.stop()


def test_minimal_example_carries_out_an_operator_action(creds, token_file, tmp_path):
    """The example engine polls for actions while it waits: an operator's cancel reaches
    it, and its acknowledgement is published as org.diaspora.action.done."""
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        spec = write_spec(tmp_path, creds, token_file, relay.port)
        proc = subprocess.Popen([str(MINIMAL), str(pc.LIB), str(spec), "2", "20"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=project_env())
        admin = creds.token("publish:*", "subscribe:*")

        async def go():
            # The example subscribes to its control topic from "latest" some time after it
            # starts: offer a cancel every 0.5 s (bounded) and count the ones it carried out.
            ws = await session(relay, admin)
            for i in range(30):
                aid = f"op-{i}"
                data = {"action_id": aid, "action": "cancel", "task_id": "task-1", "reason": "operator cancels"}
                ev = event(aid, source="/operator", type_="org.diaspora.action.requested", data=data)
                await ws.send(json.dumps({"op": "publish", "topic": "plug.control.engine", "seq": i, "events": [ev]}))
                assert (await recv(ws))["op"] == "ack"
                await asyncio.sleep(0.5)
        run(go())
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        handled = [line.split()[1].rstrip(":") for line in out.splitlines()
                   if line.startswith("action op-") and line.endswith("cancel task 'task-1' because operator cancels")]
        assert handled, out
        assert f"handled {len(handled)} actions" in out, out
        evs = relay_events(relay, creds.token("subscribe:*"), len(handled),
                           counted=lambda e: e["type"] == "org.diaspora.action.done")
        done = {e["data"]["action_id"]: e["data"] for e in evs if e["type"] == "org.diaspora.action.done"}
        for aid in handled:
            assert done[aid]["status"] == "done" and done[aid]["message"] == "handled by the minimal example", done
    finally:
        relay.stop()


def test_example_refuses_a_spec_with_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nsites: [{name: a, engine: locl}]\n")
    p = subprocess.run([str(MINIMAL), str(pc.LIB), str(bad)], capture_output=True, text=True, timeout=30,
                       env=project_env())
    assert p.returncode == 1
    assert f"{bad}:3:" in p.stderr and "DIASPORA_ERR_CONFIG" in p.stderr, p.stderr


def test_relay_down_at_start_up_30s_later_delivers_everything_once_in_order(creds, token_file, tmp_path):
    port = free_port()
    spec = write_spec(tmp_path, creds, token_file, port)
    p = pc.Plugin(spec)
    tasks = 400
    n = pc.report_tasks(p, tasks)
    pc.wait_for(lambda: p.stats()["spool_records"] >= n, 20, "events spooled while the relay is down")
    assert p.stats()["connected"] == 0 and "127.0.0.1" in p.last_error()
    time.sleep(30)
    relay = RelayProcess(creds, tmp_path / "data", port=port).start()
    try:
        assert p.close(60000) == pc.OK
        check_exactly_once_in_order(relay_events(relay, creds.token("subscribe:*"), n), tasks)
    finally:
        relay.stop()


def test_engine_killed_with_spooled_events_next_start_replays_them(creds, token_file, tmp_path):
    port = free_port()
    spec = write_spec(tmp_path, creds, token_file, port)
    tasks = 300
    child = subprocess.run([sys.executable, str(Path(pc.__file__)), str(spec), str(tasks),
                            "--kill-when-spooled", str(tasks * 6)], capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stdout + child.stderr
    relay = RelayProcess(creds, tmp_path / "data", port=port).start()
    try:
        again = subprocess.run([sys.executable, str(Path(pc.__file__)), str(spec), "0"],
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        check_exactly_once_in_order(relay_events(relay, creds.token("subscribe:*"), tasks * 6), tasks)
    finally:
        relay.stop()


def test_relay_killed_and_restarted_mid_stream_no_loss_no_duplicate(creds, token_file, tmp_path):
    port = free_port()
    relay = RelayProcess(creds, tmp_path / "data", port=port).start()
    spec = write_spec(tmp_path, creds, token_file, port)
    p = pc.Plugin(spec)
    tasks = 3000
    done = threading.Event()

    def engine():
        for t in range(tasks):
            tid = f"task-{t}"
            p.task("submitted", tid, site="local", attempt=1)
            p.task("started", tid, site="local", worker="w0")
            for k in range(3):
                p.task("heartbeat", tid, metrics={"k": float(k)})
            p.task("completed", tid, has_exit_code=1, exit_code=0)
            time.sleep(0.002)  # under 3,000 events/s, steadily: the stream spans both restarts
        done.set()

    th = threading.Thread(target=engine)
    th.start()
    try:
        unacked_at_kill = []
        for _ in range(2):
            pc.wait_for(lambda: p.stats()["events_acked"] > 0 and p.stats()["connected"] == 1, 30, "acks")
            time.sleep(0.3)
            # Kill at a moment when the engine has handed over events the relay has not acked
            # (batched, in flight): the kill hits a live stream, not an idle one.
            pc.wait_for(lambda: (lambda s: s["events_accepted"] > s["events_acked"])(p.stats()), 30, "unacked events")
            before = p.stats()
            assert not done.is_set(), "the stream ended before the relay was killed"
            relay.kill()
            unacked_at_kill.append(before["events_accepted"] - before["events_acked"])
            time.sleep(0.5)
            relay.start()
        th.join(120)
        assert done.is_set()
        assert all(n > 0 for n in unacked_at_kill), unacked_at_kill
        assert p.stats()["reconnects"] >= 2
        assert p.close(60000) == pc.OK, p.last_error()
        check_exactly_once_in_order(relay_events(relay, creds.token("subscribe:*"), tasks * 6), tasks)
    finally:
        relay.stop()


def test_operator_actions_reach_the_engine_and_outcomes_are_published(creds, token_file, tmp_path):
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        spec = write_spec(tmp_path, creds, token_file, relay.port)
        p = pc.Plugin(spec)
        pc.wait_for(lambda: p.stats()["control_connected"] == 1, 30, "control subscription")
        admin = creds.token("publish:*", "subscribe:*")

        def request(action_id: str, action: str, **extra) -> None:
            publish_action(relay, admin, {"action_id": action_id, "action": action, "reason": "operator says so",
                                          **extra})

        request("a-1", "migrate", task_id="task-7", target_site="cluster-b")
        got = []
        pc.wait_for(lambda: got.append(p.poll_action()) or got[-1] is not None, 30, "the action")
        a = got[-1]
        assert (a["id"], a["kind_name"], a["task_id"], a["target_site"], a["origin"]) == \
            ("a-1", "migrate", "task-7", "cluster-b", "control")
        assert a["kind"] == 2 and a["reason"] == "operator says so"
        assert p.action_done("a-1", "moved") == pc.OK
        assert p.action_done("a-1", "again") == pc.ERR_NOT_FOUND

        # With a callback: called on the plugin's thread.
        seen = []
        cb = pc.ACTION_CB(lambda ptr, _: seen.append((ptr.contents.id.decode(), threading.get_ident())))
        assert p.lib.diaspora_set_action_callback(p.h, cb, None) == pc.OK
        request("a-2", "restart", task_id="task-8")
        pc.wait_for(lambda: seen, 30, "the callback")
        assert seen[0][0] == "a-2" and seen[0][1] != threading.get_ident()
        assert p.lib.diaspora_action_failed(p.h, b"a-2", b"no capacity") == pc.OK
        assert p.close(20000) == pc.OK

        evs = relay_events(relay, creds.token("subscribe:*"), 2,
                           counted=lambda e: e["type"] == "org.diaspora.action.done")
        outcomes = {e["data"]["action_id"]: e["data"] for e in evs if e["type"] == "org.diaspora.action.done"}
        assert outcomes["a-1"]["status"] == "done" and outcomes["a-1"]["message"] == "moved"
        assert outcomes["a-2"]["status"] == "failed" and outcomes["a-2"]["message"] == "no capacity"
    finally:
        relay.stop()


def test_many_engine_threads_at_once(creds, token_file, tmp_path):
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        spec = write_spec(tmp_path, creds, token_file, relay.port, queue_size=256)  # small: forces spills
        p = pc.Plugin(spec)
        threads, per = 6, 300

        def engine(k: int):
            pc.report_tasks(p, per, prefix=f"th{k}-task")

        ths = [threading.Thread(target=engine, args=(k,)) for k in range(threads)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        st = p.stats()
        assert st["events_accepted"] == threads * per * 6 and st["events_lost"] == 0
        assert p.close(60000) == pc.OK, p.last_error()
        evs = task_events(relay_events(relay, creds.token("subscribe:*"), threads * per * 6))
        assert len({e["id"] for e in evs}) == threads * per * 6
        for k in range(threads):  # per thread, each task's lifecycle in order
            mine = [e for e in evs if e["data"]["task_id"].startswith(f"th{k}-")]
            check_exactly_once_in_order(mine, per, prefix=f"th{k}-task")
    finally:
        relay.stop()


def test_an_event_the_relay_refuses_is_dropped_alone_and_reported(creds, token_file, tmp_path):
    # The relay accepts events of at most 2 KiB; one failure reason is 3,000 bytes (that
    # call also takes the spool path: it does not fit a queue slot).
    relay = RelayProcess(creds, tmp_path / "data", config={"limits": {"max_event_bytes": 2048}}).start()
    try:
        spec = write_spec(tmp_path, creds, token_file, relay.port)
        p = pc.Plugin(spec)
        tasks = 20
        for t in range(tasks):
            tid = f"task-{t}"
            assert p.task("submitted", tid) == pc.OK
            assert p.task("started", tid) == pc.OK
            if t == 7:
                assert p.task("failed", tid, reason="x" * 3000) == pc.OK
            else:
                assert p.task("completed", tid) == pc.OK
        assert p.close(30000) == pc.OK, p.last_error()
        evs = relay_events(relay, creds.token("subscribe:*"), tasks * 3 - 1)
        got = [(e["data"]["task_id"], e["type"].rsplit(".", 1)[1]) for e in task_events(evs)]
        want = [(f"task-{t}", k) for t in range(tasks) for k in ("submitted", "started", "completed") if (t, k) != (7, "completed")]
        assert got == want
        warnings = [e["data"] for e in evs if e["type"] == "org.diaspora.plugin.warning"]
        assert any(w["code"] == "event_rejected" for w in warnings), warnings
        stats = [e["data"] for e in evs if e["type"] == "org.diaspora.plugin.stats"]
        assert stats and stats[-1]["events_spilled"] >= 1
    finally:
        relay.stop()


def test_actions_published_while_the_relay_is_away_arrive_after_it_returns(creds, token_file, tmp_path):
    """The control subscription survives a relay restart: it resubscribes with its consumer
    group, so an action published after the restart, and one published while the plugin
    was still reconnecting, both reach the engine, once each."""
    port = free_port()
    relay = RelayProcess(creds, tmp_path / "data", port=port).start()
    try:
        spec = write_spec(tmp_path, creds, token_file, port)
        p = pc.Plugin(spec)
        pc.wait_for(lambda: p.stats()["control_connected"] == 1, 30, "control subscription")
        admin = creds.token("publish:*", "subscribe:*")

        def request(seq: int, action_id: str) -> None:
            async def go():
                ws = await session(relay, admin, producer_id="operator")
                data = {"action_id": action_id, "action": "restart", "reason": "after the restart", "task_id": "t"}
                ev = event(action_id, source="/operator", type_="org.diaspora.action.requested", data=data)
                assert (await request_frame(ws, seq, ev))["op"] == "ack"
            run(go())

        async def request_frame(ws, seq, ev):
            await ws.send(json.dumps({"op": "publish", "topic": "plug.control.engine", "seq": seq, "events": [ev]}))
            return await recv(ws)

        request(0, "before")
        got = []
        pc.wait_for(lambda: (a := p.poll_action()) is not None and got.append(a["id"]) is None, 30, "the first action")
        time.sleep(1)  # the plugin commits its group's offset past "before" (two fsyncs on the relay)
        relay.kill()
        relay.start()
        request(1, "while-reconnecting")  # the plugin may not have resubscribed yet
        pc.wait_for(lambda: p.stats()["control_connected"] == 1, 30, "control subscription again")
        request(2, "after")
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            a = p.poll_action()
            if a:
                got.append(a["id"])
            else:
                time.sleep(0.05)
        assert got == ["before", "while-reconnecting", "after"], got
        time.sleep(0.5)
        assert p.poll_action() is None  # none delivered twice
        assert p.close(20000) == pc.OK
    finally:
        relay.stop()
