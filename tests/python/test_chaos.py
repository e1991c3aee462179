"""The short form of the chaos tests (tests/chaos/chaos.py; the long form is make chaos):
two producers and a consumer group against a real relay behind a proxy the test owns,
while the relay is killed three times, paused, cut off, slowed on a lossy link, left a torn
record, and its disk fills, and again with the relay in a network namespace whose veth
pair is taken down twice; then `diaspora run`'s engine plugin publishes a stream of task
instances while the relay is killed twice and cut off (and so does a Dask LocalCluster with
diaspora.dask), and again while its wall clock is
stepped back an hour and forward two (libfaketime), while its token runs out (renewed two
seconds later), and while the relay's certificate runs out (renewed, loaded on SIGHUP).
The history checker then finds
every acknowledged event stored exactly once, in each producer's order, every CRC valid,
and a consumer group that never skipped. Mounts a small tmpfs for the full disk (root, as
on the CI machines)."""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))
import chaos  # noqa: E402


def test_faults_lose_and_duplicate_no_acknowledged_event(tmp_path):
    # Should a scenario hang, every thread's stack is on stderr before CTest's limit ends
    # the run (CTest runs this file with -s, so the scenarios' progress lines are there too).
    limit = float(os.environ.get("DIASPORA_TEST_TIMEOUT", "0"))
    if limit > 30:
        faulthandler.dump_traceback_later(limit - 20, exit=False)
    try:
        results = {r.name: r for r in chaos.short_form(tmp_path)}
    finally:
        faulthandler.cancel_dump_traceback_later()
    print("\n" + chaos.HEADER + "\n" + "\n".join(r.row() for r in results.values()))
    for r in results.values():
        assert not r.problems, r.row()
        assert r.lost == 0 and r.duplicated == 0, r.row()
        if r.name in ("mixed", "disk-full", "veth"):  # producers of their own
            assert r.acked_events == r.attempted_batches * chaos.BATCH, r.row()
            assert r.group_sessions >= 1 and r.group_read == r.stored_events, r.row()
    mixed = results["mixed"]
    # Every fault struck while the clients ran, and the clients noticed.
    assert sorted(set(mixed.faults)) == ["delay 20 ms, loss 0.02 for 2s", "kill", "partition 2s", "pause 2s", "torn"], mixed.faults
    assert mixed.faults.count("kill") == 3 and mixed.reconnects >= 3, mixed.row()
    assert mixed.group_sessions >= 4, mixed.row()  # the consumer group came back after each kill
    assert results["veth"].faults == ["veth down 2s", "veth down 2s"], results["veth"].row()
    full = results["disk-full"]
    assert full.nacks.get("storage_error", 0) > 0, full.row()  # the full disk refused publishes
    # diaspora run's engine plugin as the producer; the Dask adapter's (not in the sanitized
    # pass, which leaves Dask out: tests/CMakeLists.txt)
    for name in ("plugin",) + (() if os.environ.get("DIASPORA_SANITIZED") else ("dask",)):
        plugin = results[name]
        assert plugin.faults == ["kill", "kill", "partition 2s"] and plugin.reconnects >= 2, plugin.row()
    clock = results["clock"]  # the same on a wall clock stepped back an hour, then on two
    assert clock.faults == ["clock -1h", "clock +2h", "kill", "clock +0"] and clock.reconnects >= 1, clock.row()
    # The plugin's token ran out mid-session and was refused until renewed; the relay's
    # certificate ran out and was refused until renewed: the run's output said so (checked
    # by the scenario), the plugin came back, and nothing was lost.
    for name, faults in (("token", ["token expired", "token renewed"]),
                         ("cert", ["certificate expired", "certificate renewed (SIGHUP)"])):
        assert results[name].faults == faults and results[name].reconnects >= 1, results[name].row()
