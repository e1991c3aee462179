# A Globus Compute endpoint's config.py (~/.globus_compute/<endpoint>/config.py) whose tasks
# run with Diaspora: reported on the spec's relay, lost workers and hung tasks restarted.
# DIASPORA_SPEC names the workflow spec (its relay, token, site and policies).
import os

from globus_compute_endpoint.endpoint.config import UserEndpointConfig
from parsl.providers import LocalProvider

from diaspora.globus_compute import DiasporaEngine

config = UserEndpointConfig(
    engine=DiasporaEngine(
        spec=os.environ["DIASPORA_SPEC"],
        site="endpoint",
        address="127.0.0.1",
        max_workers_per_node=2,
        provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
    )
)
