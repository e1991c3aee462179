"""`diaspora run` with a rehearsal job: diaspora-train trained on the workflow's own scans.

The job (dataset ptycho-stream) learns from the scans the ptycho-reconstruct instances
announce with data.arrived events on the run's relay. Moving it to another site mid-stream
(a migrate action: SIGTERM, checkpoint, resume there) and killing the runner (the job
checkpoints on its parent's death; `--resume` continues it) both end with the same error
matrix as a run left alone: no scan lost or trained twice.

In the sanitizer pass (DIASPORA_SANITIZED set by tests/CMakeLists.txt) the job trains one
epoch a scan instead of three: under ASan every tensor goes through the sanitizer's
allocator and the trainer runs about 6x slower; one epoch runs the same code paths.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import run_harness as rn


EPOCHS = 1 if os.environ.get("DIASPORA_SANITIZED") else 3


def stream_spec(tmp: Path, policies: str = "", rate: float = 2, duration: str = "3s") -> Path:
    return rn.write_spec(tmp, f"""version: 1
name: learn-stream
sites:
  - {{name: edge, engine: local, workers: 2}}
  - {{name: cluster, engine: local, workers: 2}}
tasks:
  - name: scan
    kind: ptycho-reconstruct
    args: {{iterations: 10, object_size: 64, probe_size: 16, scan_step: 4}}
    rate: {rate}
    duration: {duration}
rehearsal:
  - name: learn
    site: edge
    dataset: ptycho-stream
    stream: scan
    strategy: derpp
    buffer_size: 50
    set: {{train.epochs: {EPOCHS}, train.batch_size: 8}}
""" + policies)


MOVE = """policies:
  - name: move-learner
    signal: task.step_time
    detector: threshold
    threshold: 0
    for: 12
    action: migrate
    targets: [learn]
    to_sites: [cluster]
    max_attempts: 1
"""


def trained_one_scan(out: Path, p: subprocess.Popen) -> None:
    """Waits (at most 240 s: sanitizer builds start the trainer slowly) until the job has
    checkpointed the end of its first scan."""
    latest = out / "rehearsal" / "learn" / "checkpoint" / "LATEST"
    deadline = time.monotonic() + 240
    while not latest.is_file() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert latest.is_file() and p.poll() is None, "the job did not checkpoint a scan while the run was going"


def summary(out: Path) -> dict:
    return json.loads((out / "rehearsal" / "learn" / "summary.json").read_text())


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> dict:
    """The job's summary in a run with no policy and no fault."""
    tmp = tmp_path_factory.mktemp("undisturbed")
    out = tmp / "out"
    p = rn.run(stream_spec(tmp), out, "--no-policies")
    assert p.returncode == 0, p.stdout + p.stderr
    s = summary(out)
    assert s["dataset"] == "ptycho-stream" and s["tasks"] == 6 and len(s["error_matrix"]) == 6
    # Row i holds the scans seen after scan i only (the others had not been trained on).
    assert all(v is None for i, row in enumerate(s["error_matrix"]) for v in row[i + 1:])
    assert all(v is not None and 0 < v < 0.1 for row in s["error_matrix"] for v in row[:1])
    # Each evaluation went out as one report on the progress channel (the console's
    # Training page): its row of the error matrix, the same numbers.
    evals = [e["data"]["metrics"] for e in rn.stored_events(out, "learn-stream.events", None)
             if e["type"] == "org.diaspora.task.heartbeat" and "eval_after_task" in e["data"].get("metrics", {})]
    assert [m["eval_after_task"] for m in evals] == list(range(6)), evals
    for i, m in enumerate(evals):
        assert [m[f"error.t{j}"] for j in range(i + 1)] == pytest.approx(s["error_matrix"][i][:i + 1], rel=1e-6)
        assert m["average_error"] == pytest.approx(sum(s["error_matrix"][i][:i + 1]) / (i + 1), rel=1e-6)
    return s


def test_the_job_trains_on_every_scan_of_the_stream(tmp_path, undisturbed):
    # ... with a checkpoint every second besides (SIGUSR1: the trainer checkpoints and goes on,
    # which changes nothing in what it learns).
    out = tmp_path / "out"
    spec = stream_spec(tmp_path)
    spec.write_text(spec.read_text().replace("    buffer_size: 50\n", "    buffer_size: 50\n    checkpoint_every: 1s\n"))
    p = rn.run(spec, out, "--no-policies")
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    job = rn.instance(rep, "learn.0")
    assert job["state"] == "completed" and job["rehearsal"].endswith("rehearsal/learn")
    assert job["attempts"][0]["site"] == "edge"
    assert job["result"]["error_matrix"] == undisturbed["error_matrix"]  # deterministic: same scans, same order
    assert job["result"]["steps"] == undisturbed["steps"]
    assert "checkpoint requested (SIGUSR1): writing ckpt-" in (out / "tasks" / "learn.0.1.err").read_text()


def test_scans_through_the_fabric_train_the_same_as_scans_in_files(tmp_path, undisturbed):
    """output: item (docs/streaming.md): each scan is put on the relay as a data item and
    announced with its diaspora:// URI; the job, run where the run's data folder is empty
    (a mount namespace of its own), fetches each (checked) into its own folder. Same scans,
    same order: the same error matrix as the run that read the files."""
    out = tmp_path / "out"
    spec = stream_spec(tmp_path)
    spec.write_text(spec.read_text().replace("    duration: 3s\n", "    duration: 3s\n    output: item\n"))
    # The job on a site without the scans' folder: diaspora-train in a mount namespace of its
    # own where OUT/data is an empty tmpfs (DIASPORA_TRAIN: how a site wraps the trainer).
    wrapper = tmp_path / "train-without-data.sh"
    wrapper.write_text('#!/bin/sh\nexec unshare -m --propagation private sh -c \'mount -t tmpfs none "$0" && exec "$@"\' '
                       f'"{out / "data"}" "{rn.DIASPORA.parent / "diaspora-train"}" "$@"\n')
    wrapper.chmod(0o755)
    p = rn.run(spec, out, "--no-policies", env={"DIASPORA_TRAIN": str(wrapper)})
    assert p.returncode == 0, p.stdout + p.stderr
    job = rn.instance(rn.report(out), "learn.0")
    assert job["state"] == "completed" and job["result"]["error_matrix"] == undisturbed["error_matrix"]
    arrived = [e["data"] for e in rn.stored_events(out, "learn-stream.events", None)
               if e["type"] == "org.diaspora.data.arrived"]
    assert sorted(d["seq"] for d in arrived) == list(range(6)), arrived
    assert all(d["uri"].startswith("diaspora://learn-stream.data.scan/") for d in arrived), arrived
    # What the job trained on: the items, fetched into its folder, byte for byte the files
    # the tasks wrote (which it never opened).
    import hashlib
    written = {hashlib.sha256(f.read_bytes()).hexdigest() for f in (out / "data").rglob("*.scan")}
    fetched = [(out / "rehearsal" / "learn" / "scans" / f"scan-{d['seq']}.scan").read_bytes() for d in arrived]
    assert [len(b) for b in fetched] == [d["bytes"] for d in arrived]
    assert {hashlib.sha256(b).hexdigest() for b in fetched} == written and len(written) == 6
    # The control: the same job where scans are files fails there, naming the file it cannot read.
    out2 = tmp_path / "files"
    (tmp_path / "files-spec").mkdir()
    files_spec = stream_spec(tmp_path / "files-spec")  # output: file, the default
    wrapper.write_text(wrapper.read_text().replace(str(out / "data"), str(out2 / "data")))
    p = rn.run(files_spec, out2, "--no-policies", env={"DIASPORA_TRAIN": str(wrapper)})
    assert p.returncode != 0 and rn.instance(rn.report(out2), "learn.0")["state"] != "completed"
    assert "cannot read the scan file" in (out2 / "tasks" / "learn.0.1.err").read_text()


def test_migrated_mid_stream_it_ends_as_an_unmigrated_run(tmp_path, undisturbed):
    out = tmp_path / "out"
    p = rn.run(stream_spec(tmp_path, MOVE), out)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = rn.report(out)
    job = rn.instance(rep, "learn.0")
    assert [a["site"] for a in job["attempts"]] == ["edge", "cluster"], job["attempts"]
    assert job["attempts"][0]["outcome"] == "stopped" and "migration to cluster" in job["attempts"][0]["reason"]
    # The learner's migration (the default protection may also move a scan that the
    # trainer's start slowed on these 2 shared cores; docs/anomaly.md, "The task's normal").
    moved = [a for a in rn.actions(rep, "migrate") if a["task"] == "learn.0"]
    assert moved and moved[0]["outcome"] == "done", rep["actions"]
    # The decision is on the report's timeline too: its anomaly score, read back from the relay.
    seen = [a for a in rep["anomalies"] if a.get("task") == "learn.0"]
    assert seen and seen[0]["series"] == "task.step_time:learn.0" and seen[0]["detector"] == "threshold", rep["anomalies"]
    assert 0 <= seen[0]["score"] <= 1 and 0 < seen[0]["t_s"] < rep["duration_s"]
    html = (out / "report.html").read_text()
    assert "<circle" in html and "anomaly " in html and "task.step_time:learn.0" in html
    assert "(exit status 3, checkpointed)" in p.stdout
    s = summary(out)
    assert "resumed_from" in s and 0 < int(s["resumed_from"].rsplit("-", 1)[1]) < s["steps"]
    assert s["error_matrix"] == undisturbed["error_matrix"] and s["steps"] == undisturbed["steps"]


def test_migrated_between_sites_that_share_no_folder_its_checkpoint_travels_as_an_item(tmp_path, undisturbed):
    """checkpoints: item (docs/rehearsal.md): each checkpoint the job writes is put on the
    relay as a data item; migrated, its next attempt fetches the newest one. Each site has a
    disk of its own: the trainer runs in a mount namespace where the job's folder is that
    site's folder (the run's own stays empty) and OUT/data an empty tmpfs (the scans are
    items too)."""
    out = tmp_path / "out"
    spec = stream_spec(tmp_path, MOVE)
    spec.write_text(spec.read_text().replace("    duration: 3s\n", "    duration: 3s\n    output: item\n")
                    .replace("    buffer_size: 50\n", "    buffer_size: 50\n    checkpoints: item\n"))
    sites = tmp_path / "sites"
    job_dir = out / "rehearsal" / "learn"
    wrapper = tmp_path / "train-on-its-site.sh"
    wrapper.write_text(f"""#!/bin/sh
mkdir -p "{sites}/$DIASPORA_SITE"
exec unshare -m --propagation private sh -c 'mount -t tmpfs none "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"' \\
  "{out / "data"}" "{sites}/$DIASPORA_SITE" "{job_dir}" "{rn.DIASPORA.parent / "diaspora-train"}" "$@"
""")
    wrapper.chmod(0o755)
    p = rn.run(spec, out, env={"DIASPORA_TRAIN": str(wrapper)}, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    job = rn.instance(rn.report(out), "learn.0")
    assert job["state"] == "completed" and [a["site"] for a in job["attempts"]] == ["edge", "cluster"], job["attempts"]
    # Nothing of the trainer's reached the run's own folder: only the runner's note of the
    # newest checkpoint item (so a --resume dir could not have carried it).
    assert sorted(f.name for f in job_dir.iterdir()) == ["checkpoint-item"], list(job_dir.iterdir())
    noted = (job_dir / "checkpoint-item").read_text().strip()
    assert noted.startswith("diaspora://learn-stream.data.learn/"), noted
    edge, cluster = sites / "edge", sites / "cluster"
    edge_log = (out / "tasks" / "learn.0.1.err").read_text()
    cluster_log = (out / "tasks" / "learn.0.2.err").read_text()
    put = [line.split(" put as ")[1] for line in edge_log.splitlines() if " put as diaspora://" in line]
    assert put, edge_log
    assert f"fetched the checkpoint at {put[-1]} into" in cluster_log, cluster_log
    # The cluster continued from the edge's last checkpoint (fetched whole, its SHA-256
    # checked): its first step is the one after it.
    s = json.loads((cluster / "summary.json").read_text())
    name = (edge / "checkpoint" / "LATEST").read_text().strip()
    step = int(name.split("-")[1])
    assert s["resumed_from"].endswith(f"checkpoint/{name}") and 0 < step < s["steps"], s
    first = json.loads((cluster / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == step, first
    assert not (edge / "summary.json").exists()  # the edge never finished: it was moved
    # ... and ends where a run left alone ends: nothing lost or trained twice. The report has
    # its result, said on the progress channel (its summary.json is at the cluster's).
    assert s["error_matrix"] == undisturbed["error_matrix"] and s["steps"] == undisturbed["steps"]
    assert job["result"]["error_matrix"] == s["error_matrix"] and job["result"]["resumed_from"] == s["resumed_from"]
    assert "summary.json unreadable" not in p.stdout + p.stderr


def test_runner_killed_then_resumed_the_job_continues_from_its_checkpoint(tmp_path):
    spec = stream_spec(tmp_path, rate=1, duration="10s")
    ref = tmp_path / "ref"
    p = rn.run(spec, ref, "--no-policies", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "out"
    p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out), "--no-policies"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trained_one_scan(out, p)  # then kill it: the stream goes on for seconds yet
    p.kill()
    p.wait(timeout=10)
    # The trainer gets SIGTERM when its runner dies: it checkpoints and exits.
    ckpt = out / "rehearsal" / "learn" / "checkpoint" / "LATEST"
    for _ in range(200):
        busy = subprocess.run(["pgrep", "-f", str(out / "rehearsal")], capture_output=True).returncode == 0
        if not busy:
            break
        time.sleep(0.1)
    assert not busy and ckpt.is_file()
    r = subprocess.run([str(rn.DIASPORA), "run", str(spec), "--resume", str(out), "--no-policies"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rn.assert_no_sanitizer_report(out, r.stderr)
    s = summary(out)
    assert "resumed_from" in s
    want = json.loads((ref / "rehearsal" / "learn" / "summary.json").read_text())
    assert s["error_matrix"] == want["error_matrix"] and s["steps"] == want["steps"]


def test_rehearsal_jobs_it_cannot_run_are_refused_with_their_place(tmp_path):
    spec = rn.write_spec(tmp_path, """version: 1
name: refused-jobs
sites:
  - {name: a, engine: local}
tasks:
  - name: nap
    kind: sleep
    args: {seconds: 1}
rehearsal:
  - name: learn
    dataset: ptycho-stream
    stream: nap
    strategy: er
""")
    p = rn.run(spec, tmp_path / "out")
    assert p.returncode == 2
    assert f"{spec}:12:13: error: rehearsal[0].stream: task 'nap' does not write scan files" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
    bad = rn.write_spec(tmp_path, spec.read_text().replace("    stream: nap\n", ""), "bad.yaml")
    p = rn.run(bad, tmp_path / "out")
    assert p.returncode == 2
    assert "rehearsal[0].dataset: ptycho-stream needs 'stream'" in p.stderr, p.stderr


def test_sigint_checkpoints_the_job_before_the_report(tmp_path):
    spec = stream_spec(tmp_path, rate=1, duration="10s")
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        p = subprocess.Popen([str(rn.DIASPORA), "run", str(spec), "--out", str(out), "--no-policies"],
                             stdout=f, stderr=subprocess.STDOUT)
        trained_one_scan(out, p)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=180)
    text = log.read_text()
    assert p.returncode == 1, text
    rn.assert_no_sanitizer_report(out, text)
    assert "rehearsal job learn.0 stopped on edge (exit status 3, checkpointed)" in text, text
    assert (out / "rehearsal" / "learn" / "checkpoint" / "LATEST").is_file()
    rep = rn.report(out)
    assert rep["interrupted"] and rn.instance(rep, "learn.0")["state"] == "cancelled"
