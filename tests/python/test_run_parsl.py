"""`diaspora run` with `engine: parsl` sites: the runner starts a bridge per site
(runner/python/parsl_bridge.py) that starts a real Parsl HighThroughputExecutor (an
interchange and a LocalProvider block on 127.0.0.1); each attempt is an HTEX task running a
one-shot worker that connects back to the runner. Real faults with no policy in the spec (the
default protection acts): an HTEX worker process SIGKILLed mid-task (its manager starts
another; the attempt is restarted) and a hung attempt; the site's whole block (its manager,
its workers and their attempts: a node lost) SIGKILLed. (A Parsl site with another endpoint
is refused in test_run_engines.py, with the other sites `diaspora run` cannot drive.)"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import pytest
import run_harness as rn
from relay_harness import wait_until


def leftovers(stdout: str, site: str) -> list[str]:
    """Processes the run left behind: its one-shot workers, its Parsl bridge, and the HTEX
    interchange and worker pool of its run directory."""
    m = re.search(r"remote workers connect to (\S+)", stdout)
    assert m, stdout
    addr = m.group(1).encode()
    return [b" ".join(cmd).decode(errors="replace") for _, cmd in rn.process_cmdlines()
            if addr in cmd or (any(c.endswith(b"parsl_bridge.py") for c in cmd) and site.encode() in cmd)
            or any(c.endswith((b"process_worker_pool.py", b"interchange.py")) for c in cmd)
            and any(site.encode() in c for c in cmd)]


def test_parsl_site_survives_a_killed_htex_worker_and_a_hang_with_the_defaults(tmp_path):
    site = "prs-" + secrets.token_hex(3)
    spec = rn.write_spec(tmp_path, f"""version: 1
name: parsl-run
sites:
  - {{name: {site}, engine: parsl, workers: 2}}
  - {{name: loc, engine: local, workers: 1}}
tasks:
  - name: burn
    kind: cpu-burn
    args: {{seconds: 3, step: 0.25}}
    count: 3
    allowed_sites: [{site}]
  - name: note
    command: echo local
faults:
  - {{at: 1.5s, kind: kill-worker, site: {site}}}
  - {{at: 5s, kind: hang-task, site: {site}}}
""")
    out = tmp_path / "out"
    p = rn.run(spec, out, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    insts = {i["id"]: i for i in rep["instances"]}
    assert all(i["state"] == "completed" for i in insts.values()), insts
    assert {a["site"] for i in insts.values() if i["id"].startswith("burn") for a in i["attempts"]} == {site}
    assert [a["site"] for a in insts["note.0"]["attempts"]] == ["loc"]
    kill, hang = rep["faults"]
    assert kill["hit"] and hang["hit"], rep["faults"]
    killed = insts[kill["hit"][0]["instance"]]
    assert "died" in killed["attempts"][0]["reason"], killed["attempts"][0]
    assert killed["attempts"][-1]["outcome"] == "completed" and len(killed["attempts"]) >= 2
    hung = insts[hang["hit"][0]["instance"]]
    assert hung["attempts"][-1]["outcome"] == "completed" and len(hung["attempts"]) >= 2, hung
    # The fault killed an HTEX worker process: the bridge's HTEX ran on (its manager started
    # another worker), and the started events name the site's slots.
    events = rn.stored_events(out, "parsl-run.events", rep["plugin"]["stats"]["events_acked"])
    started = [e["data"] for e in events if e["type"] == "org.diaspora.task.started" and e["data"]["task_id"].startswith("burn")]
    assert all(d["worker"].startswith(site + "/worker-") for d in started)
    assert "HTEX with 2 workers" in (out / "engines" / f"{site}.log").read_text()
    # The manager's watchdog (the bridge's heartbeat period, 2 s, not Parsl's 30) saw its
    # worker die and started another while the run went on.
    manager = "".join(f.read_text() for f in (out / "engines" / f"{site}.parsl").rglob("manager.log"))
    assert "has died" in manager and "has been restarted" in manager, manager[-3000:]
    wait_until(lambda: not leftovers(p.stdout, site), 30, "the bridge, HTEX and workers to exit")



def block_processes(site: str) -> list[int]:
    """Processes of the site's HTEX blocks (LocalProvider exports JOBNAME=parsl.SITE.block-N
    to the block's manager and its workers)."""
    mark = f"JOBNAME=parsl.{site}.block-".encode()
    out = []
    for pid, _ in rn.process_cmdlines():
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def run_and_kill(tmp_path: Path, site: str, victims) -> tuple[str, Path]:
    """Runs four 3-s attempts on a 2-worker Parsl site and, once two have started, SIGKILLs
    the pids victims(out) returns; returns the run's stdout and OUT (the run succeeded)."""
    spec = rn.burns_spec(tmp_path, "parsl-node", f"{{name: {site}, engine: parsl, workers: 2}}")
    out = tmp_path / "out"
    rc, stdout = rn.run_killing(spec, out, victims)
    assert rc == 0, rn.run_tails(out, stdout, "")
    return stdout, out


def completed_on(out: Path, site: str) -> dict:
    """The report's instances by id, after checking that all completed, every attempt on `site`."""
    insts = {i["id"]: i for i in rn.report(out)["instances"]}
    assert all(i["state"] == "completed" for i in insts.values()), insts
    assert all(a["site"] == site for i in insts.values() for a in i["attempts"])
    return insts


def htex_processes(out: Path, script: bytes) -> list[int]:
    """Pids of the run's HTEX processes whose argv ends a word with `script` and names OUT."""
    return [pid for pid, cmd in rn.process_cmdlines()
            if any(c.endswith(script) for c in cmd) and any(str(out).encode() in c for c in cmd)]


@pytest.mark.parametrize("lost", ["node", "manager"])
def test_parsl_site_replaces_a_lost_block_and_its_attempts_complete(tmp_path, lost):
    """A block lost while two attempts run on it. `node`: its HTEX manager and every process
    below it SIGKILLed (the attempts die with their workers and are restarted by the default
    protection); `manager`: the manager alone (its workers run their attempts to the end,
    then wait forever on the dead manager's queues: the bridge kills them when it ends).
    Either way the bridge's JobStatusPoller starts another block (no error handler puts the
    executor in a bad state, as Parsl's default would after its one block failed: every
    later task was refused), every task completes there, and nothing is left behind."""
    site = "prs-" + secrets.token_hex(3)

    def victims(out: Path) -> list[int]:
        managers = htex_processes(out, b"process_worker_pool.py")
        assert len(managers) == 1, managers
        return rn.process_tree(managers[0]) if lost == "node" else managers

    stdout, out = run_and_kill(tmp_path, site, victims)
    insts = completed_on(out, site)
    restarted = [i for i in insts.values() if len(i["attempts"]) >= 2]
    if lost == "node":  # the two that ran on the lost block, restarted
        assert len(restarted) == 2 and all("died" in i["attempts"][0]["reason"] for i in restarted), insts
    else:  # their work kept
        assert restarted == [], insts
    blocks = sorted(d.name for d in (out / "engines" / f"{site}.parsl" / site).iterdir() if d.name.startswith("block-"))
    assert blocks == ["block-0", "block-1"], blocks
    site_log = (out / "engines" / f"{site}.log").read_text()
    assert "block 0 FAILED" in site_log and "block 1 " in site_log, site_log  # the next one started
    wait_until(lambda: not leftovers(stdout, site) and not block_processes(site), 30,
               "the bridge, HTEX and the blocks' processes to exit")


def test_parsl_site_replaces_its_htex_when_the_interchange_dies(tmp_path):
    """The HTEX interchange SIGKILLed while two attempts run: nothing sent to that HTEX would
    ever run (the run waited forever). The bridge sees the interchange exit, kills its
    blocks (the two attempts' workers: restarted by the default protection), reports what
    it held as ended and starts another HTEX in RUN_DIR/restart-1, where every task
    completes; nothing is left behind."""
    site = "prs-" + secrets.token_hex(3)

    def victims(out: Path) -> list[int]:
        bridge = bridge_of(site)[0]
        found = [pid for pid, cmd in rn.process_cmdlines()
                 if rn.parent_pid(pid) == bridge and b"interchange" in b" ".join(cmd)]
        assert len(found) == 1, found
        return found

    stdout, out = run_and_kill(tmp_path, site, victims)
    insts = completed_on(out, site)
    restarted = [i for i in insts.values() if len(i["attempts"]) >= 2]
    assert len(restarted) == 2 and all("died" in i["attempts"][0]["reason"] for i in restarted), insts
    site_log = (out / "engines" / f"{site}.log").read_text()
    assert "the HTEX interchange exited (status -9)" in site_log and "the new HTEX is ready" in site_log, site_log
    assert (out / "engines" / f"{site}.parsl" / "restart-1" / site / "block-0").is_dir()
    wait_until(lambda: not leftovers(stdout, site) and not block_processes(site), 30,
               "the bridge, HTEX and the blocks' processes to exit")


def bridge_of(site: str) -> list[int]:
    """The runner's Parsl bridge process of `site` (one expected)."""
    found = [pid for pid, cmd in rn.process_cmdlines()
             if any(c.endswith(b"parsl_bridge.py") for c in cmd) and site.encode() in cmd]
    assert len(found) == 1, found
    return found


def test_a_killed_parsl_bridge_is_started_again(tmp_path):
    """The runner's bridge to the site SIGKILLed while two attempts run: its interchange dies
    with it (started under setpriv --pdeathsig), the runner starts another bridge at once
    (a new HTEX in SITE.parsl/bridge-1) and sends it the launches that follow; every task
    completes, on the site."""
    site = "prs-" + secrets.token_hex(3)
    stdout, out = run_and_kill(tmp_path, site, lambda out: bridge_of(site))
    completed_on(out, site)
    site_log = (out / "engines" / f"{site}.log").read_text()
    assert site_log.count(f"parsl_bridge: site {site}, HTEX with 2 workers") == 2, site_log
    assert (out / "engines" / f"{site}.parsl" / "bridge-1" / site / "block-0").is_dir()
    wait_until(lambda: not leftovers(stdout, site) and not block_processes(site), 60,
               "the bridges, HTEXes and the blocks' processes to exit (the old manager: 30 s without its interchange)")
