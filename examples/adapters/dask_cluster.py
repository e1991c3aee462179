"""Diaspora inside a Dask LocalCluster: two sites of one cluster, one call to register.

    .venv/bin/python examples/adapters/dask_cluster.py workflow.yaml
"""
import sys

from distributed import Client, LocalCluster

import diaspora.dask


def inc(x: int) -> int:
    return x + 1


if __name__ == "__main__":
    spec = sys.argv[1] if len(sys.argv) > 1 else "workflow.yaml"
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        diaspora.dask.register(client, spec, sites={"a": [0], "b": [1]})  # worker names 0 and 1
        print("results:", client.gather(client.map(inc, range(8))))
