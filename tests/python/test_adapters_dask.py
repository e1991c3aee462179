"""diaspora.dask against a real Dask LocalCluster (distributed from requirements.lock, worker
processes) and a real relay: transitions reported once and in order, worker changes,
heartbeats from the worker plugin, a SIGKILLed worker, a slowed site migrated off by the
policy, an operator's drain of a site, a relay that cannot be reached, a bad spec."""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import REPO, free_port, publish_action, relay_events, wait_until, write_spec  # noqa: E402

sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
import adapter_tasks as at  # noqa: E402
import diaspora  # noqa: E402
import diaspora.dask as dd  # noqa: E402

import distributed  # noqa: E402  (requirements.lock: scripts/install-deps.sh installs it into .venv)
from distributed import Client, LocalCluster  # noqa: E402

SITES = [{"name": "a", "engine": "dask", "endpoint": "local"}, {"name": "b", "engine": "dask", "endpoint": "local"}]
MIGRATE = at.SLOW_MIGRATE


@pytest.fixture
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as c, Client(c) as client:
        yield c, client


def by_task(events: list[dict]) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for e in events:
        if e["type"].startswith("org.diaspora.task."):
            out[e["data"]["task_id"]].append(e)
    return out


def kinds(evs: list[dict]) -> list[str]:
    return [e["type"].rsplit(".", 1)[1] for e in evs if not e["type"].endswith(".heartbeat")]


def worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def test_transitions_and_workers_reach_the_relay_once_in_order(relay, token, tmp_path, cluster):
    c, client = cluster
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="dsk", sites=SITES)
    dd.register(client, spec, sites={"a": [0], "b": [1]}, heartbeat_s=0.2)  # one call, on the client
    futs = [client.submit(at.stepper, 3, 0.01, k, pure=False) for k in range(6)]
    slow = client.submit(at.stepper, 8, 0.1, 9, pure=False)  # long enough for heartbeats
    bad = client.submit(at.explode, "bad frame", pure=False)
    assert client.gather(futs) == [2 * k for k in range(6)] and slow.result() == 18
    with pytest.raises(ValueError):
        bad.result()
    keys = [f.key for f in futs] + [slow.key, bad.key]
    events = relay_events(relay, token[0], 8, topic="dsk.events",
                          counted=lambda e: e["type"] in ("org.diaspora.task.completed", "org.diaspora.task.failed"))
    tasks = by_task(events)
    ids = [(e["source"], e["id"]) for e in events]
    assert len(ids) == len(set(ids))
    for k in keys[:-1]:
        assert kinds(tasks[dd.key_id(k)]) == ["submitted", "started", "completed"], tasks[dd.key_id(k)]
        started = tasks[dd.key_id(k)][1]["data"]
        assert started["site"] in ("a", "b") and started["worker"].startswith("tcp://127.0.0.1:")
    assert kinds(tasks[dd.key_id(bad.key)]) == ["submitted", "started", "failed"]
    failed = tasks[dd.key_id(bad.key)][-1]["data"]
    assert "bad frame" in failed["reason"]
    beats = [e["data"]["metrics"] for e in tasks[dd.key_id(slow.key)] if e["type"].endswith(".heartbeat")]
    assert any("step_time_s" in m for m in beats) and any("rss_mib" in m for m in beats), beats
    workers = [e["data"] for e in events if e["type"] == "org.diaspora.resource.status"]
    assert sorted((w["site"], w["state"]) for w in workers) == [("a", "up"), ("b", "up")], workers


def test_a_killed_worker_dasks_rerun_is_reported_as_a_new_attempt(relay, token, tmp_path, cluster):
    c, client = cluster
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="dsk", sites=SITES)
    dd.register(client, spec, sites={"a": [0], "b": [1]}, heartbeat_s=0.2)
    marks = tmp_path / "marks"
    marks.mkdir()
    addr_a = next(a for a, w in c.scheduler.workers.items() if str(w.name) == "0")
    fut = client.submit(at.stepper, 40, 0.05, 5, str(marks), workers=[addr_a], allow_other_workers=True, pure=False)
    m = wait_until(lambda: at.markers(marks).get("plain.0"), 60, "the task to run")
    os.kill(m["pid"], signal.SIGKILL)
    assert fut.result(timeout=120) == 10
    tid = dd.key_id(fut.key)
    events = relay_events(relay, token[0], 1, topic="dsk.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed" and e["data"]["task_id"] == tid)
    life = [e for e in by_task(events)[tid] if not e["type"].endswith(".heartbeat")]
    assert kinds(life) == ["submitted", "started", "failed", "submitted", "started", "completed"], kinds(life)
    assert life[2]["data"]["retryable"] is True and "left while it was processing" in life[2]["data"]["reason"]
    assert [e["data"].get("attempt") for e in life if e["type"].endswith(".submitted")] == [1, 2]
    down = [e["data"] for e in events if e["type"] == "org.diaspora.resource.status" and e["data"]["state"] == "down"]
    # The killed worker was on site a: its down event says so (it once said "dask", the default).
    assert down and down[0].get("site") == "a", down
    assert life[2]["data"].get("failure") == "lost", life[2]["data"]


def test_a_slowed_site_is_migrated_off_by_the_policy(relay, token, tmp_path, cluster):
    c, client = cluster
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="dsk", sites=SITES,
                      extra={"policies": MIGRATE})
    dd.register(client, spec, sites={"a": [0], "b": [1]}, heartbeat_s=0.5)
    marks = tmp_path / "marks"
    marks.mkdir()
    addr_a = next(a for a, w in c.scheduler.workers.items() if str(w.name) == "0")
    t0 = time.monotonic()
    fut = client.submit(at.stepper, 160, 0.05, 6, str(marks), workers=[addr_a], allow_other_workers=True, pure=False)
    m = wait_until(lambda: at.reached(marks, "plain.0", 20), 60, "20 steps on a")
    slow = at.DutyCycle([m["pid"]])
    slow.start()
    try:
        # Slowed 10x the task would need 20 + 140 × 0.5 = 90 s; migrated it ends far sooner.
        assert fut.result(timeout=120) == 12
    finally:
        slow.stop()
    took = time.monotonic() - t0
    tid = dd.key_id(fut.key)
    events = relay_events(relay, token[0], 1, topic="dsk.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed" and e["data"]["task_id"] == tid)
    life = [e for e in by_task(events)[tid] if not e["type"].endswith(".heartbeat")]
    assert life[1]["data"]["site"] == "a" and life[-1]["type"].endswith(".completed")
    assert [e["data"]["site"] for e in life if e["type"].endswith(".started")][-1] == "b", life
    (mig,) = [e["data"] for e in events if e["type"] == "org.diaspora.action.done" and e["data"]["action"] == "migrate"]
    assert mig["status"] == "done" and "restricted to b" in mig["message"], mig
    assert took < 80, took


def test_an_operator_drain_retires_the_sites_workers(relay, token, tmp_path, cluster):
    c, client = cluster
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="dsk", sites=SITES)
    dd.register(client, spec, sites={"a": [0], "b": [1]}, heartbeat_s=0.5)
    assert client.submit(at.stepper, 2, 0.01, 1, pure=False).result(timeout=60) == 2
    for aid, what in (("op-d", "drain"), ("op-u", "undrain")):
        publish_action(relay, token[0], {"action_id": aid, "action": what, "site": "a", "reason": "maintenance"},
                       topic="dsk.control.engine")
        events = relay_events(relay, token[0], 1, topic="dsk.events",
                              counted=lambda e, aid=aid: e["type"] == "org.diaspora.action.done" and e["data"]["action_id"] == aid)
        (done,) = [e["data"] for e in events if e["type"] == "org.diaspora.action.done" and e["data"]["action_id"] == aid]
        if what == "drain":
            assert done["status"] == "done" and "site a: 1 worker(s) retired" in done["message"], done
            wait_until(lambda: sorted(str(w.name) for w in c.scheduler.workers.values()) == ["1"], 30, "site a's worker retired")
        else:  # retired workers do not come back: said, not pretended
            assert done["status"] == "failed" and "do not come back" in done["message"], done
    assert client.submit(at.stepper, 2, 0.01, 2, pure=False).result(timeout=60) == 4  # site b still works


def test_an_unreachable_relay_never_slows_or_fails_the_graph(token, tmp_path, cluster, creds):
    c, client = cluster
    spec = write_spec(tmp_path, creds, token[1], free_port(), name="dsk", sites=SITES)  # nobody listens
    p = diaspora.Plugin.open(spec)
    try:
        dd.register(c.scheduler, plugin=p, sites={"a": [0], "b": [1]})  # on the scheduler object, live handle
        t0 = time.monotonic()
        futs = client.map(lambda x: x + 1, range(500), pure=False)
        assert sum(client.gather(futs)) == sum(range(1, 501))
        took = time.monotonic() - t0
        st = p.stats()
        assert st["events_accepted"] >= 500 * 3 and st["events_lost"] == 0 and st["connected"] == 0, st
        assert took < 30, took
    finally:
        c.scheduler.remove_plugin(name="diaspora")
        assert p.close(0.5) is False  # what the relay never acked stays in the spool
    assert any((tmp_path / "spool").rglob("*")), "nothing spooled"


def test_a_bad_spec_refuses_to_start_unless_not_required(tmp_path, cluster):
    c, client = cluster
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: dsk\nsites:\n  - {name: a, engine: dusk}\n")
    with pytest.raises(Exception, match=r"bad.yaml:4:.*engine"):
        dd.register(client, bad)
    assert "diaspora" not in c.scheduler.plugins
    lax = tmp_path / "lax.yaml"
    lax.write_text("version: 1\nname: dsk\nplugin: {required: false, library: /nowhere/libdiaspora_plugin.so}\n"
                   "sites:\n  - {name: a, engine: dask}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dd.register(client, lax)
    assert client.submit(lambda: 41 + 1, pure=False).result(timeout=30) == 42
    assert not c.scheduler.plugins["diaspora"].plugin.enabled
