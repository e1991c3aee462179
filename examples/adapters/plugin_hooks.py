"""Report a task's lifecycle from Python and act on the plugin's actions.

    .venv/bin/python examples/adapters/plugin_hooks.py workflow.yaml
"""
import sys

import diaspora

spec = sys.argv[1] if len(sys.argv) > 1 else "workflow.yaml"
with diaspora.Plugin.open(spec) as p:
    p.submitted("recon-1", site="a", name="recon", attempt=1, deadline_s=30)
    p.started("recon-1", site="a", worker="node7", attempt=1)
    p.heartbeat("recon-1", metrics={"step_time_s": 0.4})
    p.progress("recon-1", 0.5, step=10)
    p.completed("recon-1", exit_code=0)
    for action in p.actions(timeout=1.0):  # or p.on_action(callback)
        print("action:", action.kind, action.task_id, action.reason)
        action.done("carried out")
    p.wait_acked(10)
    print("events acked:", p.stats()["events_acked"])
