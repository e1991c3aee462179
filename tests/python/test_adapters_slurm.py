"""spank_diaspora.so in a real one-node Slurm (slurm-wlm 22.05, munge) that the test starts
and stops, with a real relay: `srun --diaspora=SPEC` reports each task's start and end
with job and step ids; a job killed with scancel says so; a restart action requeues a
batch job; a broken spec never fails the job; `diaspora run` submits an `engine: slurm`
site's attempts through it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import (BIN, Credentials, RelayProcess, publish_action, relay_events,  # noqa: E402
                           wait_subscribed, wait_until, write_spec)
import run_harness as rn  # noqa: E402
from slurm_harness import Slurm  # noqa: E402

SPANK = BIN.parent / "lib" / "spank_diaspora.so"
ENDS = ("org.diaspora.task.completed", "org.diaspora.task.failed")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    assert os.geteuid() == 0, "the Slurm test runs slurmd, which needs root"
    assert SPANK.exists(), f"{SPANK} was not built (libslurm-dev missing? scripts/install-deps.sh installs it)"
    tmp = tmp_path_factory.mktemp("slurm")
    creds = Credentials(tmp / "creds")
    relay = RelayProcess(creds, tmp / "relay").start()
    tok = tmp / "token"
    tok.write_text(creds.token("publish:*", "subscribe:*") + "\n")
    spec = write_spec(tmp, creds, tok, relay.port, name="slm", sites=[{"name": "hpc", "engine": "slurm"}])
    slurm = Slurm(tmp / "cluster", SPANK, "site=hpc close_timeout_ms=5000").start()
    yield slurm, relay, creds, spec, tmp
    slurm.stop()
    relay.stop()


def events_of(relay, creds, task: str) -> list[dict]:
    evs = relay_events(relay, creds.token("subscribe:*"), 1, topic="slm.events",
                       counted=lambda e: e["type"] in ENDS and e["data"]["task_id"] == task)
    return [e for e in evs if e["type"].startswith("org.diaspora.task.") and e["data"]["task_id"] == task]


def all_events(relay, creds) -> list[dict]:
    """Everything on the events topic now."""
    return relay_events(relay, creds.token("subscribe:*"), 0, topic="slm.events", counted=lambda e: False)


def wait_event(slurm, relay, creds, type_: str, task: str, timeout: float, each=None, attempt: int | None = None) -> list[dict]:
    """Waits until an event of `type_` for `task` (and `attempt`, when given) is on the relay
    (calling each() between looks); returns the topic's events then. On timeout, fails with
    Slurm's logs."""
    def look():
        evs = all_events(relay, creds)
        if any(e["type"] == type_ and e["data"]["task_id"] == task and attempt in (None, e["data"].get("attempt"))
               for e in evs):
            return evs
        if each is not None:
            each()
        return None
    try:
        return wait_until(look, timeout, f"{type_} of {task}", interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{slurm.logs()}") from None


def run_on(slurm, spec: Path, out: Path):
    """`diaspora run SPEC --out OUT` on this Slurm; asserts it ends well, without sanitizer
    reports; returns the process and its report."""
    p = subprocess.run([str(rn.DIASPORA), "run", str(spec), "--out", str(out)], env=slurm.env, capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr + slurm.logs()
    rn.assert_no_sanitizer_report(out, p.stderr)
    return p, rn.report(out)


def test_srun_reports_started_and_ended_with_job_and_step_ids(env):
    slurm, relay, creds, spec, tmp = env
    r = slurm.run("srun", f"--diaspora={spec}", "-n", "2", "hostname")
    assert r.returncode == 0 and r.stdout.count("\n") == 2, r.stdout + r.stderr + slurm.logs()
    def job_id():  # from the relay's events: the job of the first task completed
        got = relay_events(relay, creds.token("subscribe:*"), 2, topic="slm.events",
                           counted=lambda e: e["type"] == "org.diaspora.task.completed")
        ids = [e["data"]["task_id"] for e in got if e["type"] == "org.diaspora.task.completed"]
        return ids[0].split(".")[0] if ids else None
    job = wait_until(job_id, 60, "the step's completed events")
    assert job.startswith("slurm-") and job[6:].isdigit(), job
    for rank in (0, 1):
        evs = events_of(relay, creds, f"{job}.0.{rank}")
        kinds = [e["type"].rsplit(".", 1)[1] for e in evs]
        assert kinds == ["submitted", "started", "completed"], kinds
        started = evs[1]["data"]
        assert started["site"] == "hpc" and started["worker"] == slurm.node and started["attempt"] == 1
        assert evs[2]["data"]["exit_code"] == 0


def test_a_failing_step_and_a_job_killed_with_scancel(env):
    slurm, relay, creds, spec, tmp = env
    r = slurm.run("srun", f"--diaspora={spec}", "-J", "fails", "sh", "-c", "exit 7")
    assert r.returncode != 0
    r = slurm.run("sbatch", f"--diaspora={spec}", "-J", "victim", "--parsable", f"--output={tmp}/slurm-%j.out", "--wrap",
                  "srun sleep 120")
    assert r.returncode == 0, r.stderr + slurm.logs()
    job = r.stdout.strip().split(";")[0]
    step_id = f"slurm-{job}.0.0"
    wait_event(slurm, relay, creds, "org.diaspora.task.started", step_id, 60)  # the step is running
    assert slurm.run("scancel", job).returncode == 0
    evs = events_of(relay, creds, step_id)
    end = evs[-1]
    assert end["type"] == "org.diaspora.task.failed", evs
    assert "killed by signal" in end["data"]["reason"] and "scancel" in end["data"]["reason"], end["data"]
    assert end["data"]["failure"] == "lost", end["data"]  # killed from outside: not the step's own error
    failed = [e for e in all_events(relay, creds)
              if e["type"] == "org.diaspora.task.failed" and e["data"].get("exit_code") == 7]
    assert failed and failed[0]["data"]["reason"] == "exit status 7"
    assert failed[0]["data"]["failure"] == "error"


def test_a_restart_action_requeues_a_batch_job(env):
    slurm, relay, creds, spec, tmp = env
    # The first run would take 60 s (the action arrives long before, even under load); the
    # requeued one ends at once.
    r = slurm.run("sbatch", f"--diaspora={spec}", "-J", "requeued", "--parsable", "--requeue", f"--output={tmp}/slurm-%j.out", "--wrap",
                  'srun sh -c "[ \"${SLURM_RESTART_COUNT:-0}\" -ge 1 ] || sleep 60; exit 0"')
    job = r.stdout.strip().split(";")[0]
    step_id = f"slurm-{job}.0.0"
    wait_event(slurm, relay, creds, "org.diaspora.task.started", step_id, 60)
    wait_subscribed(relay, f"slm.control.slurm-{job}.0", creds.token("admin"))  # the step listens for actions
    publish_action(relay, creds.token("publish:*", "subscribe:*"),
                   {"action_id": "rq-1", "action": "restart", "task_id": step_id, "reason": "operator"},
                   topic=f"slm.control.slurm-{job}.0")
    # Requeued, the step runs again as attempt 2 and completes. A requeued job waits about two
    # minutes before it is eligible again: start it sooner, once it has been pending 3 s (a
    # launch less than a second after the requeue's kill is refused by slurmd: "Job N
    # already killed, do not launch batch job"). (The first run may end "completed" too:
    # the requeue's SIGTERM can reach `sleep` before the shell, which then exits 0.)
    pending_since: list[float] = []
    def start_when_settled():
        state = slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
        if state != "PENDING":
            pending_since.clear()
        elif not pending_since:
            pending_since.append(time.monotonic())
        elif time.monotonic() - pending_since[0] >= 3:
            slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    evs = wait_event(slurm, relay, creds, "org.diaspora.task.completed", step_id, 90, each=start_when_settled, attempt=2)
    done = [e["data"] for e in evs if e["type"] == "org.diaspora.action.done" and e["data"]["action_id"] == "rq-1"]
    assert done and done[0]["status"] == "done" and "requeued" in done[0]["message"], done
    starts = [e["data"]["attempt"] for e in evs if e["type"] == "org.diaspora.task.started" and e["data"]["task_id"] == step_id]
    assert starts[-1] == 2, starts


def test_a_broken_spec_never_fails_the_job(env):
    slurm, relay, creds, spec, tmp = env
    bad = tmp / "bad.yaml"
    bad.write_text("version: 1\nname: slm\nsites: [{name: a, engine: lokal}]\n")
    r = slurm.run("srun", f"--diaspora={bad}", "echo", "still-runs")
    assert r.returncode == 0 and r.stdout == "still-runs\n", r.stdout + r.stderr


def test_diaspora_run_submits_each_attempt_through_slurm(env, tmp_path):
    """`diaspora run` with an `engine: slurm` site: each attempt a batch job (`sbatch
    --diaspora=`), whose worker connects back to the runner; a worker killed mid-task is
    restarted as a new job; the SPANK plugin reports every job on the run's own relay."""
    slurm = env[0]
    spec = rn.write_spec(tmp_path, """version: 1
name: slurm-run
sites:
  - {name: hpc, engine: slurm, endpoint: debug, workers: 2}
  - {name: loc, engine: local, workers: 1}
tasks:
  - name: nap
    kind: sleep
    args: {seconds: 10, step: 0.25}
    count: 3
    allowed_sites: [hpc]
policies:
  - {name: restart-failed, signal: task.failures, detector: threshold, threshold: 1, action: restart}
faults:
  - {at: 8s, kind: kill-worker, site: hpc}
""")
    out = tmp_path / "out"
    p, rep = run_on(slurm, spec, out)
    insts = {i["id"]: i for i in rep["instances"]}
    assert all(i["state"] == "completed" for i in insts.values()), insts
    (fault,) = rep["faults"]
    # A connected worker was running when it struck: at 8 s into 10 s tasks, so a batch job
    # that slurmd starts up to 8 s late (seen under a loaded make test at 5 s of 6) is hit.
    assert fault["hit"], (fault, p.stdout)
    killed = insts[fault["hit"][0]["instance"]]
    assert "died" in killed["attempts"][0]["reason"], killed
    assert killed["attempts"][1]["cause"].startswith("restart (action ") and killed["attempts"][-1]["site"] == "hpc"
    attempts = sum(len(i["attempts"]) for i in insts.values())
    # The jobs: one per attempt, named after it, run by slurmd with the Diaspora SPANK plugin,
    # which published each job's start and end on the run's embedded relay.
    outputs = sorted((out / "engines" / "hpc").glob("nap.*.out"))
    assert len(outputs) == attempts, outputs
    events = rn.stored_events(out, "slurm-run.events", None)
    spank = [e for e in events if e["data"].get("task_id", "").startswith("slurm-")]
    jobs = {e["data"]["task_id"].split(".")[0] for e in spank if e["type"] == "org.diaspora.task.started"}
    assert len(jobs) == attempts, (jobs, spank)
    ends = [e["data"] for e in spank if e["type"] in ENDS]
    assert sum(1 for d in ends if "killed by signal 9" in d.get("reason", "")) == 1, ends
    assert sum(1 for e in spank if e["type"] == "org.diaspora.task.completed") == attempts - 1, ends
    runner = [e["data"] for e in events if e["type"] == "org.diaspora.task.started" and e["data"]["task_id"].startswith("nap")]
    assert len(runner) == attempts and all(d["worker"].startswith("hpc/worker-") for d in runner), runner


def test_a_slurm_site_with_its_own_relay(env, tmp_path):
    """A Slurm site with a relay of its own (sites[].relay, sites federated): `diaspora run`
    hands its jobs' SPANK plugin that relay and the site's spool, so the jobs' events go
    where the site's attempts go, and none to the run's relay."""
    slurm, relay, creds, _, tmp = env
    spec = rn.write_spec(tmp_path, f"""version: 1
name: slurm-fed
sites:
  - name: hpc
    engine: slurm
    endpoint: debug
    workers: 2
    relay: {{url: "wss://127.0.0.1:{relay.port}", ca_file: "{creds.ca}", token_file: "{tmp / 'token'}"}}
  - {{name: loc, engine: local, workers: 1}}
tasks:
  - name: nap
    kind: sleep
    args: {{seconds: 2, step: 0.25}}
    count: 2
    allowed_sites: [hpc]
""")
    out = tmp_path / "out"
    _, rep = run_on(slurm, spec, out)
    assert all(i["state"] == "completed" for i in rep["instances"]), rep["instances"]
    attempts = sum(len(i["attempts"]) for i in rep["instances"])
    # The SPANK plugin's spec names the site's relay and spool, not the run's.
    spank_spec = json.loads((out / "engines" / "slurm-spec-hpc.yaml").read_text())
    assert spank_spec["relay"]["url"] == f"wss://127.0.0.1:{relay.port}", spank_spec["relay"]
    assert spank_spec["plugin"]["spool_dir"] == str(out / "spool" / "site-hpc"), spank_spec["plugin"]
    # At the site's relay: each job's start and end from slurmstepd, beside the runner's
    # own events of the attempts it ran there.
    site = relay_events(relay, creds.token("subscribe:*"), attempts, topic="slurm-fed.events",
                        counted=lambda e: e["type"] == "org.diaspora.task.completed"
                        and e["data"]["task_id"].startswith("slurm-"))
    jobs = [e["data"] for e in site if e["data"].get("task_id", "").startswith("slurm-")]
    assert sum(1 for e in site if e["type"] == "org.diaspora.task.completed"
               and e["data"]["task_id"].startswith("slurm-")) == attempts, jobs
    ran = [e["data"] for e in site if e["type"] == "org.diaspora.task.started" and e["data"]["task_id"].startswith("nap")]
    assert len(ran) == attempts and all(d["worker"].startswith("hpc/worker-") for d in ran), ran
    # At the run's relay: none of the jobs' events.
    run_events = rn.stored_events(out, "slurm-fed.events", None)
    assert not [e for e in run_events if e["data"].get("task_id", "").startswith("slurm-")], run_events
