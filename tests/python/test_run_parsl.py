"""`diaspora run` with `engine: parsl` sites: the runner starts a bridge per site
(runner/python/parsl_bridge.py) that starts a real Parsl HighThroughputExecutor (an
interchange and a LocalProvider block on 127.0.0.1); each attempt is an HTEX task running a
one-shot worker that connects back to the runner. Real faults with no policy in the spec (the
default protection acts): an HTEX worker process SIGKILLed mid-task (its manager starts
another; the attempt is restarted) and a hung attempt. (A Parsl site with another endpoint
is refused in test_run_engines.py, with the other sites `diaspora run` cannot drive.)"""

from __future__ import annotations

import re
import secrets

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

