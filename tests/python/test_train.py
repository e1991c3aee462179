"""diaspora-train with the engine plugin against a real relay (TLS, 127.0.0.1): the job
reports itself as a task (progress with loss and throughput metrics); an operator's
migrate, checkpoint, restart or cancel action makes it checkpoint and exit with its
documented status (4, 3, 3, 5) with the action acknowledged; the job resumed after a
migration completes and reports completion; a job that fails while it starts (missing
data) is reported as a failed task; a request made before the job started (meant for an
earlier run) is refused as stale and the job goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import BIN, Credentials, RelayProcess, event, recv, run, session  # noqa: E402
from test_plugin import relay_events, write_spec  # noqa: E402

TRAIN = BIN / "diaspora-train"
TOPIC = "plug.events"


@pytest.fixture(scope="module")
def creds(tmp_path_factory) -> Credentials:
    return Credentials(tmp_path_factory.mktemp("train-creds"))


def first_events(relay: RelayProcess, token: str, n: int, counted, within: float = 60) -> list[dict]:
    """Reads TOPIC from the start until `n` events satisfy `counted` (at most `within` s)."""
    async def go():
        ws = await session(relay, token)
        await ws.send(json.dumps({"op": "subscribe", "id": "w", "topic": TOPIC, "from": "earliest"}))
        out, deadline = [], time.monotonic() + within
        while time.monotonic() < deadline and sum(1 for e in out if counted(e)) < n:
            m = await recv(ws)
            if m["op"] == "events":
                out += [e["event"] for e in m["events"]]
        await ws.close()
        return out
    return run(go())


def train_config(tmp_path: Path, spec: Path) -> Path:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(json.dumps({
        "strategy": "er", "buffer_size": 200, "seed": 1,
        "dataset": {"tasks": 2, "classes_per_task": 5, "train_per_task": 2000, "test_per_task": 200},
        # Many epochs: the job is still running when the action comes (the resumed one
        # runs with --set train.epochs=1: it finishes epoch 0 if it stopped in it, and
        # otherwise goes on to the task's evaluation).
        "train": {"epochs": 1000, "batch_size": 32, "threads": 1, "log_every": 10},
        "sampling": {"representatives": 8},
        "plugin": {"spec": str(spec), "task_id": "train-7", "site": "cluster-a"},
    }))
    return cfg


def relay_and_config(creds: Credentials, tmp_path: Path) -> tuple[RelayProcess, str, Path]:
    """A relay of its own, a job config whose plugin spec points at it, and a reader's
    token. The caller stops the relay."""
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        token_file = tmp_path / "token"
        token_file.write_text(creds.token("publish:*", "subscribe:*") + "\n")
        cfg = train_config(tmp_path, write_spec(tmp_path, creds, token_file, relay.port))
    except BaseException:
        relay.stop()
        raise
    return relay, creds.token("subscribe:*"), cfg


def request_action(relay: RelayProcess, creds: Credentials, action: str, action_id: str,
                   requested_at: float | None = None) -> None:
    """An operator's request for task train-7 on the control topic; `requested_at` (Unix
    seconds) becomes the event's CloudEvents `time` (none when None)."""
    async def go():
        ws = await session(relay, creds.token("publish:*"))
        data = {"action_id": action_id, "action": action, "task_id": "train-7",
                "target_site": "cluster-b", "reason": "site a is slowing down"}
        ev = event(action_id, source="/operator", type_="org.diaspora.action.requested", data=data)
        if requested_at is not None:
            ev["time"] = datetime.fromtimestamp(requested_at, timezone.utc).isoformat().replace("+00:00", "Z")
        await ws.send(json.dumps({"op": "publish", "topic": "plug.control.engine", "seq": 0, "events": [ev]}))
        assert (await recv(ws))["op"] == "ack"
    run(go())


@pytest.mark.parametrize("action,status", [("migrate", 4), ("checkpoint", 3), ("restart", 3), ("cancel", 5)])
def test_action_checkpoints_and_exits_with_its_status(creds, tmp_path, action, status):
    t0 = time.monotonic()
    mark = lambda what: print(f"{time.monotonic() - t0:6.1f}s {what}")
    relay, reader, cfg = relay_and_config(creds, tmp_path)
    try:
        out = tmp_path / "out"
        job = subprocess.Popen([str(TRAIN), "--config", str(cfg), "--out", str(out)],
                               stderr=subprocess.PIPE, text=True)
        try:
            # The job is on the fabric once its progress events arrive.
            first_events(relay, reader, 2, lambda e: e["type"] == "org.diaspora.task.progress")
            mark("progress seen")
            time.sleep(1.0)  # the control subscription starts with the publisher

            # The control subscription starts from "latest" when it connects, shortly
            # after the publisher: ask again every 2 s until the job acts (bounded).
            code = None
            for i in range(30):
                request_action(relay, creds, action, f"m-{i}")
                try:
                    code = job.wait(2)
                    break
                except subprocess.TimeoutExpired:
                    continue
            print("requests sent:", i + 1)
            err = job.stderr.read()
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        mark("job exited")
        assert code == status, err
        assert "--resume" in err
        assert (out / "checkpoint" / "LATEST").exists()
        assert not (out / "summary.json").exists()

        evs = relay_events(relay, reader, 1, counted=lambda e: e["type"] == "org.diaspora.action.done")
        done = [e["data"] for e in evs if e["type"] == "org.diaspora.action.done"]
        assert done and done[0]["status"] == "done", done
        assert "checkpointed at step" in done[0]["message"], done
        assert ("cluster-b" in done[0]["message"]) == (action == "migrate"), done
        # The task is reported as stopped (cancelled, with the checkpoint in the reason).
        stopped = lambda e: e["type"] == "org.diaspora.task.cancelled" and e["data"].get("task_id") == "train-7"
        if not any(stopped(e) for e in evs):
            evs = relay_events(relay, reader, 1, counted=stopped)
        assert any(stopped(e) and "checkpointed at step" in e["data"].get("reason", "") for e in evs), \
            [e["type"] for e in evs]
        progress = [e for e in evs if e["type"] == "org.diaspora.task.progress"
                    and e["data"].get("task_id") == "train-7"]
        assert progress, [e["type"] for e in evs]
        metrics = progress[-1]["data"].get("metrics", {})
        assert "loss" in metrics and "samples_per_s" in metrics, progress[-1]["data"]

        mark("events read")
        if action != "migrate":
            return
        # Resumed "on the target site": it continues from the checkpoint and completes.
        # Under the target site's engine (its own engine id, so its own control-topic
        # group): a second request the loop above sent while the first job was still
        # checkpointing (ASan, CI 2026-12-03) is addressed to the first engine, whose group
        # never committed it; the resumed job must not take it for its own.
        resumed = subprocess.run([str(TRAIN), "--config", str(cfg), "--out", str(tmp_path / "out2"),
                                  "--resume", str(out), "--set", "train.epochs=1"], stderr=subprocess.PIPE, text=True,
                                 timeout=240, env={**os.environ, "DIASPORA_ENGINE_ID": "engine-cluster-b"})
        mark("resumed job exited")
        assert resumed.returncode == 0, resumed.stderr
        summary = json.loads((tmp_path / "out2" / "summary.json").read_text())
        assert summary["resumed_from"].startswith(str(out))
        assert len(summary["accuracy_matrix"]) == 2
        evs = relay_events(relay, reader, 1, counted=lambda e: e["type"] == "org.diaspora.task.completed")
        assert any(e["type"] == "org.diaspora.task.completed" and e["data"].get("task_id") == "train-7"
                   for e in evs)
    finally:
        relay.stop()


def test_a_job_failing_while_it_starts_is_reported_as_failed(creds, tmp_path):
    relay, reader, cfg = relay_and_config(creds, tmp_path)
    try:
        empty = tmp_path / "no-data"
        empty.mkdir()
        job = subprocess.run([str(TRAIN), "--config", str(cfg), "--out", str(tmp_path / "out"),
                              "--set", f"dataset.dir={empty}"], stderr=subprocess.PIPE, text=True, timeout=120)
        assert job.returncode == 1, job.stderr
        assert "dataset-fashion-mnist" in job.stderr, job.stderr
        evs = relay_events(relay, reader, 1,
                           counted=lambda e: e["type"] == "org.diaspora.task.failed")
        failed = [e["data"] for e in evs if e["type"] == "org.diaspora.task.failed"]
        assert failed and failed[0]["task_id"] == "train-7", [e["type"] for e in evs]
        assert "dataset-fashion-mnist" in failed[0].get("reason", ""), failed[0]
    finally:
        relay.stop()


def test_a_request_made_before_the_job_started_is_refused_as_stale(creds, tmp_path):
    """A request whose `time` precedes the job's start was meant for an earlier run (one
    that exited without taking it; the control group hands it to the next job of the same
    engine id): refused with a reason that says so, and the job goes on; a request made
    after the start is taken."""
    relay, reader, cfg = relay_and_config(creds, tmp_path)
    try:
        earlier_run = time.time() - 30  # before the job started
        job = subprocess.Popen([str(TRAIN), "--config", str(cfg), "--out", str(tmp_path / "out")],
                               stderr=subprocess.PIPE, text=True)
        try:
            first_events(relay, reader, 2, lambda e: e["type"] == "org.diaspora.task.progress")
            stale_done = lambda e: e["type"] == "org.diaspora.action.done" and e["data"]["action_id"].startswith("s-")
            refused = []
            for i in range(30):  # until the control subscription is up and one is refused (bounded)
                request_action(relay, creds, "migrate", f"s-{i}", requested_at=earlier_run)
                refused = [e["data"] for e in first_events(relay, reader, 1, stale_done, within=2) if stale_done(e)]
                if refused:
                    break
            print(f"stale requests sent: {i + 1}")
            assert refused, "no outcome for a stale request in 60 s"
            assert job.poll() is None, job.stderr.read()  # it went on
            assert refused[0]["status"] == "failed", refused
            assert "stale: requested at" in refused[0]["message"], refused
            assert "before this run of the task started" in refused[0]["message"], refused
            code = None
            for i in range(15):
                request_action(relay, creds, "migrate", f"m-{i}", requested_at=time.time())
                try:
                    code = job.wait(2)
                    break
                except subprocess.TimeoutExpired:
                    continue
            print(f"fresh requests sent: {i + 1}")
            err = job.stderr.read()
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
        assert code == 4, err
        evs = relay_events(relay, reader, 1, counted=lambda e: e["type"] == "org.diaspora.action.done"
                           and e["data"]["action_id"].startswith("m-"))
        done = [e["data"] for e in evs if e["type"] == "org.diaspora.action.done" and e["data"]["action_id"].startswith("m-")]
        assert done and done[0]["status"] == "done" and "cluster-b" in done[0]["message"], done
        # No stale request was acted on.
        assert all(e["data"]["status"] == "failed" for e in evs if stale_done(e))
    finally:
        relay.stop()


def test_a_checkpoint_put_as_a_data_item_resumes_the_job_where_its_folder_is_not(creds, tmp_path):
    """checkpoint.item_topic (docs/rehearsal.md, "Checkpoints as data items"): each
    checkpoint is put on the relay as one item and its URI said; --resume-item continues
    from it in an --out that never held it, as --resume from the folder would. A URI that is
    not one, or an item that is not a checkpoint, is refused and nothing is written."""
    relay = RelayProcess(creds, tmp_path / "data").start()
    try:
        token = tmp_path / "token"
        token.write_text(creds.token("publish:*", "subscribe:*") + "\n")
        fabric = [f"checkpoint.relay={relay.url}", f"checkpoint.ca_file={creds.ca}",
                  f"checkpoint.token_file={token}"]
        base = ["--set", "strategy=er", "--set", "buffer_size=100", "--set", "seed=3",
                "--set", "dataset.tasks=2", "--set", "dataset.classes_per_task=5",
                "--set", "dataset.train_per_task=640", "--set", "dataset.test_per_task=100",
                "--set", "train.batch_size=32", "--set", "train.threads=1", "--set", "train.log_every=5",
                "--set", "sampling.representatives=8"]
        for s in fabric:
            base += ["--set", s]
        first = tmp_path / "site-a"
        p = subprocess.run([str(TRAIN), *base, "--set", "checkpoint.item_topic=t.data.learn", "--out", str(first),
                            "--stop-after", "30"], capture_output=True, text=True, timeout=240)
        assert p.returncode == 3, p.stderr  # checkpointed and stopped
        put = [line.split(" put as ")[1] for line in p.stderr.splitlines() if " put as " in line]
        assert put and put[-1].startswith("diaspora://t.data.learn/"), p.stderr
        # Resumed elsewhere from the last one: the same matrix as the job run in one go.
        second = tmp_path / "site-b"
        p = subprocess.run([str(TRAIN), *base, "--out", str(second), "--resume-item", put[-1]],
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr
        assert f"fetched the checkpoint at {put[-1]} into {second / 'checkpoint'}" in p.stderr, p.stderr
        resumed = json.loads((second / "summary.json").read_text())
        assert resumed["resumed_from"] == str(second / "checkpoint" / "ckpt-30"), resumed
        whole = tmp_path / "whole"
        p = subprocess.run([str(TRAIN), *base, "--out", str(whole)], capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stderr
        alone = json.loads((whole / "summary.json").read_text())
        assert resumed["accuracy_matrix"] == alone["accuracy_matrix"] and resumed["steps"] == alone["steps"]
        # Refusals: nothing is written into the checkpoint folder.
        other = tmp_path / "site-c"
        p = subprocess.run([str(TRAIN), *base, "--out", str(other), "--resume-item", "file:///tmp/ckpt"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "is not a diaspora://TOPIC/OFFSET URI" in p.stderr, p.stderr
        scan = tmp_path / "scan.bin"
        scan.write_bytes(b"not a checkpoint")
        q = subprocess.run([str(BIN / "diaspora"), "put", "--url", relay.url, "--ca", str(creds.ca), "--token",
                            token.read_text().strip(), "--topic", "t.data.learn", str(scan)],
                           capture_output=True, text=True, timeout=60)
        assert q.returncode == 0, q.stderr
        uri = json.loads(q.stdout)["uri"]
        p = subprocess.run([str(TRAIN), *base, "--out", str(other), "--resume-item", uri],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and f"--resume-item {uri} is not a checkpoint diaspora-train put" in p.stderr, p.stderr
        assert not (other / "checkpoint").exists()
        p = subprocess.run([str(TRAIN), *base, "--out", str(other), "--resume-item", put[-1], "--resume", str(first)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "--resume-item goes alone" in p.stderr, p.stderr
    finally:
        relay.stop()
