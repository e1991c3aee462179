"""Helpers for the `diaspora run` tests: write a spec, run it, read its report and the
events its embedded relay stored (served again by a real diaspora-relay afterwards)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import relay_harness as rh

DIASPORA = rh.DIASPORA


def write_spec(tmp: Path, text: str, name: str = "wf.yaml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def run(spec: Path, out: Path, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `diaspora run SPEC --out OUT ARGS...` to the end (a watchdog kills it); `env`:
    more environment for it."""
    try:
        p = subprocess.run([str(DIASPORA), "run", str(spec), "--out", str(out), *args], capture_output=True,
                           text=True, timeout=timeout, env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"diaspora run {spec.name} did not end within {timeout:.0f} s (killed)\n"
                             + run_tails(out, e.stdout, e.stderr)) from None
    assert_no_sanitizer_report(out, p.stderr)
    return p


def burns_spec(tmp: Path, name: str, site: str, count: int = 4) -> Path:
    """A spec of one site (`site`: its YAML flow mapping) running `count` 3-s cpu-burn tasks."""
    return write_spec(tmp, f"""version: 1
name: {name}
sites:
  - {site}
tasks:
  - name: burn
    kind: cpu-burn
    args: {{seconds: 3, step: 0.25}}
    count: {count}
""")


def run_killing(spec: Path, out: Path, victims, starts: int = 2, timeout: float = 240) -> tuple[int, str]:
    """Runs `diaspora run SPEC --out OUT` and, once `starts` attempts have started, SIGKILLs
    the pids victims(OUT) returns; waits for the run to end (a watchdog kills it). Returns
    its exit status and its stdout (stderr merged)."""
    log = out.parent / (out.name + ".stdout.txt")
    with open(log, "w") as f:
        p = subprocess.Popen([str(DIASPORA), "run", str(spec), "--out", str(out)], stdout=f, stderr=subprocess.STDOUT)
    try:
        rh.wait_until(lambda: log.read_text().count("] start ") >= starts, 120, f"{starts} attempts to start")
        for pid in victims(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    stdout = log.read_text()
    assert_no_sanitizer_report(out, stdout)
    return p.returncode, stdout


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run_tails(out: Path, stdout, stderr, lines: int = 60) -> str:
    """What a run that did not end left to read: the last `lines` lines of its stdout and
    stderr and of each engine's and worker's log under OUT (the Parsl bridge's HTEX logs
    among them), so a run stuck in CI says where it stood."""
    def tail(text: str) -> str:
        return "\n".join(text.splitlines()[-lines:])
    parts = [("stdout", _text(stdout)), ("stderr", _text(stderr))]
    if out.is_dir():
        for f in sorted([*out.glob("workers.log"), *(out / "engines").rglob("*.log")]):
            if f.is_file():
                parts.append((str(f.relative_to(out)), f.read_text(errors="replace")))
    return "\n".join(f"--- {name} (last {lines} lines) ---\n{tail(text)}" for name, text in parts)


def assert_no_sanitizer_report(out: Path, stderr: str = "") -> None:
    """Fails the test when the run's stderr, or a log of any process it started (workers.log,
    engines/*.log, the tasks' logs), holds a sanitizer report: a worker that died of one at
    shutdown leaves no other trace."""
    texts = [("diaspora run's stderr", stderr)]
    if out.is_dir():
        texts += [(str(f), f.read_text(errors="replace")) for f in sorted(out.rglob("*.log")) if f.is_file()]
    for where, text in texts:
        found = rh.SANITIZER_REPORT.search(text)
        assert found is None, f"{where} holds a sanitizer report:\n{text[max(0, found.start() - 200):][:4000]}"


REPORT_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "run-report.schema.json"
_report_validator = None


def report(out: Path) -> dict:
    """OUT/report.json, held to schemas/run-report.schema.json (every runner test's report)."""
    global _report_validator
    import jsonschema
    if _report_validator is None:
        _report_validator = jsonschema.Draft202012Validator(json.loads(REPORT_SCHEMA.read_text()))
    rep = json.loads((out / "report.json").read_text())
    errors = sorted(_report_validator.iter_errors(rep), key=lambda e: list(e.absolute_path))
    assert not errors, "report.json does not match run-report.schema.json:\n" + "\n".join(
        f"  {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])
    return rep


def instance(rep: dict, iid: str) -> dict:
    return next(i for i in rep["instances"] if i["id"] == iid)


def actions(rep: dict, kind: str) -> list[dict]:
    return [a for a in rep["actions"] if a["kind"] == kind]


# Restart an attempt as soon as it fails (its worker died).
RESTART_FAILED = """
policies:
  - name: restart-failed
    signal: task.failures
    detector: threshold
    threshold: 1
    action: restart
"""

# The migrate policy of the slow-site tests. Migrates a task `burn` whose steps take 3x its normal on that site. Give the task steps of
# 0.1 s (cpu-burn's `step`): a built-in kind's heartbeat is its step, and a step slowed past
# the mean gap + 3 s (16x was seen on a loaded machine with 0.25 s steps, a slow-site of
# factor 8) is a silence that default-revive restarts on the same site before the migration.
# A ratio to the normal holds under load where a z-score (its scale widens with the noise)
# or a fixed bound (a loaded machine slows the normal steps too) did not, in CI.
MOVE_OFF = """
policies:
  - name: move-off
    signal: task.step_time
    detector: relative
    threshold: 3
    for: 3
    action: migrate
    targets: [burn]
"""


def process_cmdlines():
    """(pid, argv as bytes) of every process on this host that can be read."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            yield int(d.name), (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue


def parent_pid(pid: int) -> int | None:
    """The parent of process `pid` (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def worker_processes(parent: int | None = None) -> set[int]:
    """Pids of the `diaspora-run __worker` processes on this host (children of `parent` when given)."""
    return {pid for pid, cmd in process_cmdlines()
            if len(cmd) > 1 and cmd[0].endswith(b"diaspora-run") and cmd[1] == b"__worker"
            and (parent is None or parent_pid(pid) == parent)}


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (children, theirs, ...), root first."""
    children: dict[int, list[int]] = {}
    for pid, _ in process_cmdlines():
        children.setdefault(parent_pid(pid), []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def stored_events(out: Path, topic: str, count: int | None) -> list[dict]:
    """The first `count` events of `topic` in the run's relay log (None: all of them), read
    through a real diaspora-relay started on that log with the run's own certificates and secret."""
    creds = rh.Credentials.__new__(rh.Credentials)
    creds.root = out / "relay"
    creds.certs = creds.root / "certs"
    creds.secret_file = creds.root / "auth-secret"
    creds.secret = creds.secret_file.read_text().strip().encode()
    creds.ca = creds.certs / "ca.pem"
    relay = rh.RelayProcess(creds, out / "relay" / "data").start()
    try:
        token = creds.token("subscribe:*")
        if count is None:
            return rh.relay_events(relay, token, 0, topic=topic, counted=lambda e: False)
        return [e for _, e in rh.run(rh.collect_all(relay, token, topic, count))]
    finally:
        relay.stop_cleanly()
