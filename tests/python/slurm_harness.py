"""A one-node Slurm (slurm-wlm 22.05 and munge from Debian) that a test starts itself and
stops: munged as user munge on its own socket, slurmctld and slurmd in the foreground with
a configuration under a temporary folder, node address 127.0.0.1, free ports, a
plugstack.conf naming the Diaspora SPANK plugin. Needs root (slurmd runs jobs as their
user). Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from relay_harness import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slurm:
    def __init__(self, root: Path, spank: Path, spank_args: str = ""):
        self.root = root
        self.spank = spank
        self.spank_args = spank_args
        self.procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split(".")[0]

    @property
    def env(self) -> dict:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self) -> "Slurm":
        r = self.root
        for d in ("state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        # munged: its own key copy, socket and pid file, as user munge, in a folder it can
        # reach (pytest's temporary folders are root's alone).
        self.munge_dir = Path(tempfile.mkdtemp(prefix="diaspora-munge-"))
        os.chmod(self.munge_dir, 0o755)
        m = self.munge_dir / "m"
        m.mkdir()
        shutil.chown(m, "munge", "munge")
        os.chmod(m, 0o700)
        key = m / "munge.key"
        shutil.copy("/etc/munge/munge.key", key)
        shutil.chown(key, "munge", "munge")
        os.chmod(key, 0o400)
        self.munge_socket = m / "munge.socket"
        self._spawn(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--foreground", "--force",
                     f"--key-file={key}", f"--socket={self.munge_socket}", f"--pid-file={m / 'munged.pid'}",
                     f"--log-file={r / 'log' / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"],
                    r / "log" / "munged.out")
        wait_until(lambda: self.munge_socket.exists(), 20, "munged's socket", interval=0.2)
        cpus = os.cpu_count() or 1
        self.conf = r / "slurm.conf"
        (r / "plugstack.conf").write_text(f"required {self.spank} {self.spank_args}\n")
        self.conf.write_text(f"""ClusterName=diaspora-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
PlugStackConfig={r / 'plugstack.conf'}
JobRequeue=1
KillWait=2
InactiveLimit=0
MinJobAge=300
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], r / "log" / "slurmctld.out")
        self._spawn(["/usr/sbin/slurmd", "-D", "-f", str(self.conf)], r / "log" / "slurmd.out")
        wait_until(self._node_idle, 60, "the node to be idle", interval=0.2)
        return self

    def _spawn(self, argv: list[str], out: Path) -> None:
        f = open(out, "ab")
        self.procs.append(subprocess.Popen(argv, stdout=f, stderr=f, env=self.env if hasattr(self, "conf") else None))

    def _node_idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args[0]} exited with {p.returncode}:\n{self.logs()}")
        r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True, timeout=20)
        return r.returncode == 0 and r.stdout.strip() in ("idle", "idle*") and not r.stdout.strip().endswith("*")

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        shutil.rmtree(getattr(self, "munge_dir", "/nonexistent"), ignore_errors=True)
