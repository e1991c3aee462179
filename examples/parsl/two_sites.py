# Parsl with Diaspora: two HighThroughputExecutors as the sites of one DiasporaExecutor.
# Every app's attempts are reported (submitted, started, heartbeats, steps, completed);
# a killed worker or a stopped manager is restarted on the other site at once, a hung
# attempt is restarted and its worker killed, by the default protection of the spec.
#   .venv/bin/python examples/parsl/two_sites.py workflow.yaml
import os
import sys

import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from diaspora.parsl import DiasporaExecutor, retry_handler

# HTEX starts interchange.py and process_worker_pool.py from this environment's bin/.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]


def site(label):
    return HighThroughputExecutor(label=label, address="127.0.0.1", max_workers_per_node=2,
                                  provider=LocalProvider(init_blocks=1, max_blocks=1))


@parsl.python_app
def reconstruct(frame, steps=5):
    import time
    from diaspora import task

    for i in range(steps):
        time.sleep(0.05)  # one step of work
        task.step()       # step_time_s for the policies
    return frame * frame


if __name__ == "__main__":
    ex = DiasporaExecutor(sites=[site("a"), site("b")], spec=sys.argv[1])
    with parsl.load(Config(executors=[ex], retries=2, retry_handler=retry_handler, usage_tracking=0)):
        futures = [reconstruct(k) for k in range(8)]
        print("results:", [f.result() for f in futures])
