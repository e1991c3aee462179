"""The copy-paste examples of docs/adapters.md: each file in examples/adapters/ appears in
the docs verbatim, and runs against a real relay with the outcome it shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import BIN, REPO, Credentials, RelayProcess, relay_events, write_spec  # noqa: E402

EXAMPLES = REPO / "examples" / "adapters"
PARSL_EXAMPLES = REPO / "examples" / "parsl"
GC_EXAMPLES = REPO / "examples" / "globus_compute"  # run by test_adapters_globus_compute.py
DOC = REPO / "docs" / "adapters.md"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("examples")
    creds = Credentials(tmp / "creds")
    relay = RelayProcess(creds, tmp / "relay").start()
    tok = tmp / "token"
    tok.write_text(creds.token("publish:*", "subscribe:*") + "\n")
    spec = write_spec(tmp, creds, tok, relay.port, name="demo",
                      sites=[{"name": "a", "engine": "local"}, {"name": "b", "engine": "local"}])
    env = dict(os.environ, PYTHONPATH=str(REPO / "engine-adapters" / "python"),
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    yield relay, creds, spec, env
    relay.stop()


def run(args, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("path", sorted([*EXAMPLES.iterdir(), *PARSL_EXAMPLES.iterdir(), *GC_EXAMPLES.iterdir()]), ids=lambda p: p.name)
def test_each_example_is_in_the_docs_verbatim(path):
    code = path.read_text()
    blocks = re.findall(r"```(?:python|sh)\n(.*?)```", DOC.read_text(), re.S)
    assert code in blocks, f"docs/adapters.md does not show {path.relative_to(REPO)} as it is"


def test_plugin_hooks(setup, tmp_path):
    relay, creds, spec, env = setup
    r = run([sys.executable, str(EXAMPLES / "plugin_hooks.py"), str(spec)], env, tmp_path)
    assert r.returncode == 0 and "events acked: 5" in r.stdout, r.stdout + r.stderr


def test_futures_two_pools(setup, tmp_path):
    relay, creds, spec, env = setup
    r = run([sys.executable, str(EXAMPLES / "futures_two_pools.py"), str(spec)], env, tmp_path)
    assert r.returncode == 0 and "results: [0, 1, 4, 9, 16, 25, 36, 49]" in r.stdout, r.stdout + r.stderr


def test_dask_cluster(setup, tmp_path):
    relay, creds, spec, env = setup
    r = run([sys.executable, str(EXAMPLES / "dask_cluster.py"), str(spec)], env, tmp_path)
    assert r.returncode == 0 and "results: [1, 2, 3, 4, 5, 6, 7, 8]" in r.stdout, r.stdout + r.stderr


def test_parsl_two_sites(setup, tmp_path):
    relay, creds, spec, env = setup
    r = run([sys.executable, str(PARSL_EXAMPLES / "two_sites.py"), str(spec)], env, tmp_path)
    assert r.returncode == 0 and "results: [0, 1, 4, 9, 16, 25, 36, 49]" in r.stdout, r.stdout + r.stderr
    evs = relay_events(relay, creds.token("subscribe:*"), 8, topic="demo.events",
                       counted=lambda e: e["type"] == "org.diaspora.task.completed"
                       and e["data"]["task_id"].startswith("reconstruct-"))
    done = {e["data"]["task_id"] for e in evs if e["type"] == "org.diaspora.task.completed"
            and e["data"]["task_id"].startswith("reconstruct-")}
    assert done == {f"reconstruct-{k}" for k in range(8)}
    steps = [e for e in evs if e["type"] == "org.diaspora.task.heartbeat"
             and "step_time_s" in e["data"].get("metrics", {}) and e["data"]["task_id"].startswith("reconstruct-")]
    assert steps, "no heartbeat carried a step time"


def test_exec_step(setup, tmp_path):
    relay, creds, spec, env = setup
    r = run(["sh", str(EXAMPLES / "exec_step.sh"), str(spec)], env, tmp_path)
    assert r.returncode == 0 and r.stdout == "reduced 4 frames\n", r.stdout + r.stderr
    evs = relay_events(relay, creds.token("subscribe:*"), 1, topic="demo.events",
                       counted=lambda e: e["type"] == "org.diaspora.task.completed"
                       and e["data"]["task_id"] == "reduce-frames")
    prog = [e["data"]["progress"] for e in evs
            if e["type"] == "org.diaspora.task.progress" and e["data"]["task_id"] == "reduce-frames"]
    assert prog == [0.25, 0.5, 0.75, 1.0]
