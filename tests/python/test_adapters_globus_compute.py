"""diaspora.globus_compute.DiasporaEngine offline: the endpoint's config.py (the example) is
loaded as the endpoint daemon loads it, and the engine is started directly, as Globus
Compute's own tests start engines (the daemon, the web service and AMQP need the Globus
service). Tasks packed as the SDK packs them run on a real HTEX, are reported on a real
relay, and a worker killed mid-task is restarted with the same result."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import REPO, relay_events, wait_until, write_spec  # noqa: E402

import adapter_tasks as at  # noqa: E402
from globus_compute_common import messagepack  # noqa: E402
from globus_compute_endpoint.endpoint.config.utils import get_config  # noqa: E402
from globus_compute_endpoint.engines import GCFuture  # noqa: E402
from globus_compute_sdk.serialize import ComputeSerializer  # noqa: E402

from diaspora.globus_compute import DiasporaEngine  # noqa: E402

os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), str(REPO / "engine-adapters" / "python")])


def pack(serde: ComputeSerializer, task_id: uuid.UUID, fn, *args) -> bytes:
    """A task as the SDK sends it: the function, its args and kwargs, packed."""
    body = serde.pack_buffers([serde.serialize(fn), serde.serialize(args), serde.serialize({})])
    return messagepack.pack(messagepack.message_types.Task(task_id=task_id, container_id=None, task_buffer=body))


def value(serde: ComputeSerializer, packed: bytes):
    r = messagepack.unpack(packed)
    assert not getattr(r, "is_error", False), r
    return serde.deserialize(r.data)


def test_the_endpoint_config_runs_tasks_through_diaspora_and_survives_a_killed_worker(relay, token, tmp_path):
    spec = write_spec(tmp_path, relay.creds, token[1], relay.port, name="gce",
                      sites=[{"name": "endpoint", "engine": "globus-compute", "workers": 2}])
    ep_dir = tmp_path / "endpoint"
    ep_dir.mkdir()
    shutil.copy(REPO / "examples" / "globus_compute" / "config.py", ep_dir / "config.py")
    os.environ["DIASPORA_SPEC"] = str(spec)
    engine = get_config(ep_dir).engine
    assert isinstance(engine, DiasporaEngine)
    engine.start(endpoint_id=uuid.uuid4(), run_dir=str(tmp_path / "run"))
    serde = ComputeSerializer()
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        ids = [uuid.uuid4() for _ in range(3)]
        futs = []
        for k, tid in enumerate(ids):
            f = GCFuture(tid)
            engine.submit(f, pack(serde, tid, at.stepper, 30 if k == 0 else 2, 0.05, k, str(marks)), {})
            futs.append(f)
        first = wait_until(lambda: at.reached(marks, f"{ids[0]}.1", 2), 60, "the first task to run")
        os.kill(first["pid"], signal.SIGKILL)
        assert [value(serde, f.result(timeout=90)) for f in futs] == [0, 2, 4]
        t = engine.resilient._tasks[str(ids[0])]
        assert [x.state for x in t.attempts] == ["failed", "done"]
        assert engine.resilient.plugin.wait_acked(30)
    finally:
        engine.shutdown()
    events = relay_events(relay, token[0], 3, topic="gce.events",
                          counted=lambda e: e["type"] == "org.diaspora.task.completed")
    done = {e["data"]["task_id"] for e in events if e["type"] == "org.diaspora.task.completed"}
    assert done == {str(i) for i in ids}
    failed = [e["data"] for e in events if e["type"] == "org.diaspora.task.failed"]
    assert [(d["task_id"], d.get("failure")) for d in failed] == [(str(ids[0]), "lost")], failed
