#!/bin/sh
# One step of a batch script (or a Parsl bash_app, or a Slurm job) reported through
# Diaspora: started, heartbeats, progress, the exit status; signals reach the command.
#
#   PATH=build/bin:$PATH sh examples/adapters/exec_step.sh workflow.yaml
SPEC=${1:-workflow.yaml}
diaspora exec --spec "$SPEC" --task reduce-frames --site a -- sh -c '
  for f in 0.25 0.5 0.75 1; do
    sleep 0.1                                       # a step of real work
    echo "progress $f" >&"$DIASPORA_PROGRESS_FD"    # optional: what is done so far
  done
  echo "reduced 4 frames"'
