"""`diaspora run` with `engine: dask` sites (distributed from requirements.lock): a LocalCluster the
runner starts (`endpoint: local`) and a running scheduler it joins (`endpoint: tcp://`).
Each attempt is a Dask task running a one-shot worker that connects back to the runner.
Real faults: a Dask worker process SIGKILLed mid-task (its nanny starts another; the
attempt is restarted by the policy), a Dask site slowed by a SIGSTOP duty cycle (the policy
migrates the task to a local site). Bad sites are refused before anything runs, or with a
clear error when the scheduler cannot be reached. (The Slurm site is tested beside the
SPANK plugin, in test_adapters_slurm.py, on the Slurm cluster that test starts.)
"""

from __future__ import annotations

import re
import secrets
import socket
import time

import pytest

import run_harness as rn
from relay_harness import wait_until

import distributed  # noqa: E402,F401  (requirements.lock: scripts/install-deps.sh installs it into .venv)


def remote_leftovers(stdout: str, site: str) -> list[str]:
    """Processes the run left behind: its one-shot workers (they connect to the address the
    runner printed) and its Dask bridge (named by the site)."""
    m = re.search(r"remote workers connect to (\S+)", stdout)
    assert m, stdout
    addr = m.group(1).encode()
    return [b" ".join(cmd).decode(errors="replace") for _, cmd in rn.process_cmdlines()
            if addr in cmd or (any(c.endswith(b"dask_bridge.py") for c in cmd) and site.encode() in cmd)]


def test_dask_local_cluster_site_survives_a_killed_dask_worker(tmp_path):
    site = "dsk-" + secrets.token_hex(3)
    spec = rn.write_spec(tmp_path, f"""version: 1
name: dask-run
sites:
  - {{name: {site}, engine: dask, endpoint: local, workers: 2}}
  - {{name: loc, engine: local, workers: 1}}
tasks:
  - name: burn
    kind: cpu-burn
    args: {{seconds: 3, step: 0.25}}
    count: 3
    allowed_sites: [{site}]
  - name: note
    command: echo local
{rn.RESTART_FAILED}
faults:
  - {{at: 1.5s, kind: kill-worker, site: {site}}}
""")
    out = tmp_path / "out"
    p = rn.run(spec, out, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    insts = {i["id"]: i for i in rep["instances"]}
    assert all(i["state"] == "completed" for i in insts.values()), insts
    assert {a["site"] for i in insts.values() if i["id"].startswith("burn") for a in i["attempts"]} == {site}
    assert [a["site"] for a in insts["note.0"]["attempts"]] == ["loc"]  # a command runs on the local site
    (fault,) = rep["faults"]
    assert fault["hit"], fault  # the kill hit an attempt (it waits for one when none runs at 1.5 s)
    killed = insts[fault["hit"][0]["instance"]]
    first = killed["attempts"][0]
    assert "died" in first["reason"] and "connection closed" in first["reason"], first
    assert killed["attempts"][-1]["outcome"] == "completed" and killed["attempts"][1]["cause"].startswith("restart (action ")
    # The fault killed a Dask worker process, not only our worker: the nanny started another.
    assert "Restarting worker" in (out / "engines" / f"{site}.log").read_text()
    # Every attempt that ran was a Dask task whose worker connected back: the started events
    # name the site's slots, and each started attempt ended exactly once.
    events = rn.stored_events(out, "dask-run.events", rep["plugin"]["stats"]["events_acked"])
    started = [e["data"] for e in events if e["type"] == "org.diaspora.task.started" and e["data"]["task_id"].startswith("burn")]
    ended = [e["data"] for e in events if e["type"] in ("org.diaspora.task.completed", "org.diaspora.task.failed")
             and e["data"]["task_id"].startswith("burn")]
    assert len(started) == sum(len(i["attempts"]) for i in insts.values() if i["id"].startswith("burn")), started
    assert sorted((d["task_id"], d["attempt"]) for d in started) == sorted((d["task_id"], d["attempt"]) for d in ended)
    assert all(d["worker"].startswith(site + "/worker-") for d in started)
    wait_until(lambda: not remote_leftovers(p.stdout, site), 20, "the bridge, cluster and workers to exit")


def test_a_killed_dask_bridge_is_started_again(tmp_path):
    """The runner's bridge to a LocalCluster site SIGKILLed while two attempts run: its
    cluster's workers die with it (the attempts are lost and restarted), the runner starts
    another bridge at once (a new LocalCluster) and every task completes on the site; the
    site's log shows both bridges, and nothing is left behind."""
    site = "dsk-" + secrets.token_hex(3)
    spec = rn.burns_spec(tmp_path, "dask-bridge", f"{{name: {site}, engine: dask, endpoint: local, workers: 2}}")
    out = tmp_path / "out"

    def bridge(out) -> list[int]:
        found = [pid for pid, cmd in rn.process_cmdlines()
                 if any(c.endswith(b"dask_bridge.py") for c in cmd) and site.encode() in cmd]
        assert len(found) == 1, found
        return found

    rc, stdout = rn.run_killing(spec, out, bridge)
    assert rc == 0, rn.run_tails(out, stdout, "")
    insts = rn.report(out)["instances"]
    assert all(i["state"] == "completed" for i in insts), insts
    assert all(a["site"] == site for i in insts for a in i["attempts"])
    assert (out / "engines" / f"{site}.log").read_text().count(f"dask_bridge: site {site} on tcp://") == 2
    wait_until(lambda: not remote_leftovers(stdout, site), 20, "the bridges, clusters and workers to exit")


def test_dask_scheduler_endpoint_slowed_site_is_migrated_to_a_local_one(tmp_path):
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        spec = rn.write_spec(tmp_path, f"""version: 1
name: dask-tcp
sites:
  - {{name: dsk, engine: dask, endpoint: "{cluster.scheduler_address}", workers: 1}}
  - {{name: loc, engine: local, workers: 1}}
tasks:
  - name: burn
    kind: cpu-burn
    args: {{seconds: 14, step: 0.1}}
    count: 1
    preferred_sites: [dsk]
{rn.MOVE_OFF}
faults:
  - {{at: 6s, kind: slow-site, site: dsk, factor: 8, for: 30s}}
""")
        out = tmp_path / "out"
        p = rn.run(spec, out, timeout=180)
        assert p.returncode == 0, p.stdout + p.stderr
        rep = rn.report(out)
        inst = rn.instance(rep, "burn.0")
        assert [a["site"] for a in inst["attempts"]] == ["dsk", "loc"], inst
        assert inst["attempts"][0]["outcome"] == "stopped" and "migration to loc" in inst["attempts"][0]["reason"]
        (mig,) = rn.actions(rep, "migrate")
        assert mig["outcome"] == "done" and mig["target_site"] == "loc"
        # The runner joined this scheduler and left it as it was: its worker still there, no
        # task of the run left on it.
        assert len(client.scheduler_info()["workers"]) == 1
        wait_until(lambda: not client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)), 20,
                   "the run's Dask tasks to be released")
        wait_until(lambda: not remote_leftovers(p.stdout, "dsk"), 20, "the run's workers to exit")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("site,tasks,error", [
    ("{name: g, engine: globus-compute}", "", "sites[0].engine: 'globus-compute' sites are driven by the engine adapters"),
    ("{name: p, engine: parsl, endpoint: 'tcp://10.0.0.5:8786'}", "",
     "sites[0].endpoint: a Parsl site of `diaspora run` is an HTEX on a LocalProvider"),
    ("{name: d, engine: dask, endpoint: 'dask.example:8786'}", "",
     "sites[0].endpoint: a Dask site's endpoint is `local`"),
    ("{name: d, engine: dask}", "  - {name: c, command: 'true'}\n",
     "tasks[1].command: a command task runs on engine: local sites only"),
])
def test_sites_diaspora_run_cannot_drive_are_refused_before_anything_starts(tmp_path, site, tasks, error):
    spec = rn.write_spec(tmp_path, f"""version: 1
name: bad
sites:
  - {site}
tasks:
  - {{name: s, kind: sleep, args: {{seconds: 0.1}}}}
{tasks}""")
    out = tmp_path / "out"
    p = rn.run(spec, out)
    assert p.returncode == 2, p.stdout + p.stderr
    assert re.search(r"wf\.yaml:\d+:\d+: error: " + re.escape(error), p.stderr), p.stderr
    assert "nothing was started" in p.stderr and not out.exists()


def test_an_unreachable_scheduler_is_a_clear_error(tmp_path):
    spec = rn.write_spec(tmp_path, f"""version: 1
name: gone
sites:
  - {{name: d, engine: dask, endpoint: "tcp://127.0.0.1:{closed_port()}", attributes: {{connect_timeout: 3}}}}
tasks:
  - {{name: s, kind: sleep, args: {{seconds: 0.1}}}}
""")
    t = time.monotonic()
    p = rn.run(spec, tmp_path / "out")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "error: site 'd' (engine: dask, endpoint tcp://127.0.0.1:" in p.stderr, p.stderr
    assert "its log: " in p.stderr and time.monotonic() - t < 60


def test_a_hung_dask_attempt_is_copied_and_the_loser_cancelled(tmp_path):
    site = "dsk-" + secrets.token_hex(3)
    spec = rn.write_spec(tmp_path, f"""version: 1
name: dask-spec
sites:
  - {{name: {site}, engine: dask, endpoint: local, workers: 1}}
  - {{name: loc, engine: local, workers: 1}}
tasks:
  - name: burn
    kind: cpu-burn
    args: {{seconds: 4, step: 0.25}}
    count: 1
    preferred_sites: [{site}]
policies:
  - {{name: copy-silent, signal: task.heartbeat_gap, detector: phi-accrual, threshold: 8, action: speculate, max_attempts: 1}}
faults:
  - {{at: 1.5s, kind: hang-task, site: {site}}}
""")
    out = tmp_path / "out"
    p = rn.run(spec, out, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    inst = rn.instance(rep, "burn.0")
    (fault,) = rep["faults"]
    assert [h["instance"] for h in fault["hit"]] == ["burn.0"], fault  # the hang hit the attempt on Dask
    assert len(inst["attempts"]) == 2, inst
    first, copy = inst["attempts"]
    assert first["site"] == site and copy["site"] == "loc" and copy["outcome"] == "completed", inst
    assert first["outcome"] == "cancelled", first  # the loser: its Dask task withdrawn, its worker killed
    # One copy: max_attempts 1, and a copy spends its original's budget (a copy whose own
    # heartbeats come late under load gets no copy of its own).
    (spec_action,) = rn.actions(rep, "speculate")
    assert spec_action["outcome"] == "done"
    wait_until(lambda: not remote_leftovers(p.stdout, site), 20, "the hung worker, bridge and cluster to exit")
