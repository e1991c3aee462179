"""The chaos suite's Dask producer (tests/chaos/chaos.py, scenario `dask`): a real Dask
LocalCluster (two worker processes) with diaspora.dask registered on its scheduler, a
stream of tasks submitted at a steady rate for a while, then the engine plugin closed
with time to deliver what it spooled. Writes what the checker needs as JSON:

    {"keys": [task ids], "stats": the plugin's stats once all is acked (or after 60 s),
     "flushed": what close() said (True: nothing left unacknowledged)}

    .venv/bin/python tests/chaos/dask_producer.py SPEC OUT.json SECONDS RATE
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "engine-adapters" / "python"))
import diaspora  # noqa: E402
import diaspora.dask as dd  # noqa: E402

from distributed import Client, LocalCluster  # noqa: E402


def nap(i: int) -> int:
    time.sleep(0.05)
    return i


def main() -> int:
    spec, out, seconds, rate = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        plugin = diaspora.Plugin.open(spec)
        dd.register(cluster.scheduler, plugin=plugin, sites={"a": [0], "b": [1]}, heartbeat_s=0.5)
        futures, t0, i = [], time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            while i < (time.monotonic() - t0) * rate:
                futures.append(client.submit(nap, i, key=f"nap-{i}"))
                i += 1
            time.sleep(0.02)
        results = client.gather(futures)
        assert results == list(range(len(futures))), "Dask lost a result"
        cluster.scheduler.remove_plugin(name="diaspora")
        plugin.wait_acked(60.0)  # whatever was spooled meanwhile is delivered now
        stats = plugin.stats()
        flushed = plugin.close(10.0)
        out.write_text(json.dumps({"keys": [dd.key_id(f.key) for f in futures], "stats": stats, "flushed": flushed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
