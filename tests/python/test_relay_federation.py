"""Sites federated (relay.yaml `jetstream.sources`, docs/relay.md "Sites federated"): the
centre's nats-server and relay in a network namespace the test makes; two sites, each a
nats-server with its own JetStream domain on a leaf node of the centre's and a relay of its
own. Each site's events reach the centre through JetStream sourcing, the control topics go
both ways, and nothing comes back where it came from. With the link between the sites and
the centre cut for 30 s, both sites go on taking and serving events (and the centre its
own), and after the heal the centre holds every event of both sites exactly once, in
each site's order."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from relay_harness import (DIASPORA, Credentials, NatsServer, Netns, RelayProcess, collect_all, event, free_port, https_get, metric,
                           publish_events, recv, request, run, session, sh, stop_all, wait_until)

SITES = ("siteA", "siteB")
PARTITION_S = 30.0


def federated_relay(creds: Credentials, root: Path, name: str, nats: NatsServer, subject_root: str,
                    sources: list[dict], **where) -> RelayProcess:
    """A relay on `nats` whose streams are `<name>-<topic>` on `<subject_root>.t.<topic>`,
    holding the topics of `sources` too."""
    return RelayProcess(creds, root / name, config={
        "storage": "jetstream",
        "jetstream": {"urls": [nats.url], "replicas": 1, "timeout": "3s", "prefix": name,
                      "subject_root": subject_root, "sources": sources}}, **where).start()


def events_of(relay: RelayProcess, token: str, topic: str, n: int | None = None) -> list[dict]:
    """The events of `topic` on `relay` once it holds at least `n` (None: as many as its
    topic holds now)."""
    if n is None:
        topics = json.loads(https_get(relay, "/api/v1/topics", token))["topics"]
        n = next((t["next_offset"] for t in topics if t["name"] == topic), 0)
    return [e for _, e in run(collect_all(relay, token, topic, n))] if n else []


class Federation:
    """The centre (its nats-server, domain `centre`, and relay CENTRE) in a network namespace
    the test makes; each site (a nats-server with its own domain on a leaf node of the
    centre's, and a relay of its own) outside it. cut() takes the veth down, heal() up."""

    def __init__(self, root: Path):
        self.creds = Credentials(root / "creds")
        self.ns = Netns("f")
        self.servers: list[NatsServer] = []
        self.relays: list[RelayProcess] = []
        try:
            self.creds.renew_server_cert(86400, ips=(self.ns.ns_ip,))  # the centre is reached on the namespace's address
            self.token = self.creds.token("admin")
            leaf_port = free_port()
            hub = NatsServer(root / "nats", "centre", host=self.ns.ns_ip, netns=self.ns.name, domain="centre",
                             leaf_port=leaf_port).start()
            self.servers.append(hub)
            site_nats = {s: NatsServer(root / "nats", s, domain=s,
                                       leaf_remotes=[f"nats-leaf://{self.ns.ns_ip}:{leaf_port}"]).start() for s in SITES}
            self.servers += site_nats.values()
            self.centre = federated_relay(self.creds, root, "CENTRE", hub, "centre",
                                          [{"domain": s, "prefix": s, "subject_root": s} for s in SITES],
                                          host=self.ns.ns_ip, netns=self.ns.name)
            self.relays.append(self.centre)
            self.site = {s: federated_relay(self.creds, root, s, site_nats[s], s,
                                            [{"domain": "centre", "prefix": "CENTRE", "subject_root": "centre",
                                              "topics": ["*.control", "*.control.*"]}]) for s in SITES}
            self.relays += self.site.values()
        except BaseException:
            self.close()
            raise

    def cut(self) -> None:
        self.ns.link(False)

    def heal(self) -> None:
        self.ns.link(True)

    def close(self) -> None:
        """Stops every relay (checking its log and exit status) and server, then the namespace."""
        try:
            stop_all(self.relays, self.servers)
        finally:
            self.ns.close()


@pytest.fixture
def fed(tmp_path):
    f = Federation(tmp_path)
    yield f
    f.close()


def test_two_sites_cut_off_for_30s_keep_working_and_the_centre_then_holds_each_event_once(fed):
    token, centre, site = fed.token, fed.centre, fed.site

    def batch(s: str, lo: int, hi: int) -> list[dict]:
        return [event(f"{s}-{i}", source=f"/{s}", data={"i": i}) for i in range(lo, hi)]

    # Before the cut: a subscriber at the centre hears the sites' events as they come
    # (JetStream sources them; the relay follows how far the sourced streams came).
    async def live_at_centre():
        ws = await session(centre, token)
        await ws.send(json.dumps({"op": "subscribe", "id": "live", "topic": "fed.events", "from": "earliest"}))
        assert (await recv(ws))["op"] == "subscribed"
        for s in SITES:
            pub = await session(site[s], token)
            ack = await request(pub, {"op": "publish", "topic": "fed.events", "seq": 0, "events": batch(s, 0, 100)})
            assert ack["op"] == "ack", ack
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 200:
            assert time.monotonic() < deadline, f"the centre heard {len(got)} of 200 events live"
            try:
                m = json.loads(await asyncio.wait_for(ws.recv(), 1))
            except asyncio.TimeoutError:
                continue
            if m["op"] == "events":
                got += [e["event"]["id"] for e in m["events"]]
        return got
    live = run(live_at_centre())
    assert sorted(live) == sorted(f"{s}-{i}" for s in SITES for i in range(100))
    # Control both ways: the operator's action at the centre reaches both sites, a site's
    # own action reaches the centre; neither comes back.
    publish_events(centre, token, "fed.control", [event("op-1", source="/console")])
    publish_events(site["siteA"], token, "fed.control", [event("a-1", source="/siteA")])
    events_of(site["siteB"], token, "fed.control", 1)  # the centre's action reached site B

    # The cut: the namespace's end of the veth goes down, nothing passes either way.
    fed.cut()
    t_cut = time.monotonic()
    k = 100
    while time.monotonic() - t_cut < PARTITION_S:
        for s in SITES:  # each site still takes (acks) and serves its events
            publish_events(site[s], token, "fed.events", batch(s, k, k + 20))
        k += 20
        time.sleep(0.5)
    publish_events(site["siteB"], token, "fed.control", [event("b-1", source="/siteB")])
    for s in SITES:  # each site's /metrics says the centre does not answer
        assert metric(https_get(site[s], "/metrics"), 'diaspora_relay_jetstream_source_up{domain="centre"}') == 0, s
        held = events_of(site[s], token, "fed.events")
        assert [e["id"] for e in held] == [f"{s}-{i}" for i in range(k)], f"{s} during the cut"
    cut_for = time.monotonic() - t_cut
    fed.heal()

    # After the heal the centre catches up: every event of both sites once, each site's
    # in its order.
    total = k * len(SITES)
    at_centre = events_of(centre, token, "fed.events", total)
    ids = [e["id"] for e in at_centre]
    assert len(ids) == total and len(set(ids)) == total, \
        f"the centre holds {len(ids)} events ({len(set(ids))} distinct) of {total}"
    for s in SITES:
        assert [e["data"]["i"] for e in at_centre if e["source"] == f"/{s}"] == list(range(k)), s
    control = {"centre": events_of(centre, token, "fed.control", 3),
               **{s: events_of(site[s], token, "fed.control", 2) for s in SITES}}
    assert sorted(e["id"] for e in control["centre"]) == ["a-1", "b-1", "op-1"], control["centre"]
    assert sorted(e["id"] for e in control["siteA"]) == ["a-1", "op-1"], control["siteA"]
    assert sorted(e["id"] for e in control["siteB"]) == ["b-1", "op-1"], control["siteB"]
    topics = {t["name"]: t for t in json.loads(https_get(centre, "/api/v1/topics", token))["topics"]}
    assert topics["fed.events"]["next_offset"] == total, topics
    # The centre's view of each source: up, its two topics taken, nothing left to copy (as
    # the federation thread last asked, a quarter of a second at most ago).
    def sources_seen():
        metrics = https_get(centre, "/metrics")
        return [[metric(metrics, f'diaspora_relay_jetstream_source_{m}{{domain="{s}"}}') for m in ("up", "topics", "lag")]
                for s in SITES]
    try:
        wait_until(lambda: sources_seen() == [[1, 2, 0]] * len(SITES), 10, "the centre's metrics of its sources")
    except AssertionError:
        raise AssertionError(f"up, topics, lag of {SITES} at the centre: {sources_seen()}") from None
    print(f"cut for {cut_for:.1f} s; {k} events a site; the centre holds {total}")


def test_diaspora_run_with_a_relay_per_site_keeps_both_sites_running_and_acting_through_a_30s_cut(fed, tmp_path):
    """`diaspora run` on a two-site workflow whose sites each have their own relay
    (sites[].relay; the run's relay is the centre): cut off from the centre for 30 s, both
    sites go on running tasks, and site A's policy moves the task of a worker killed there,
    its decision stored at site A during the cut; the run ends with every task done, and
    after the heal the centre holds every event of both sites once."""
    token_file = tmp_path / "token"
    token_file.write_text(fed.token)
    relay_of = lambda r: {"url": r.url, "ca_file": str(fed.creds.ca), "token_file": str(token_file)}
    spec = {"version": 1, "name": "fedrun", "relay": relay_of(fed.centre),
            "plugin": {"reconnect_max": "1s"},
            "sites": [{"name": s, "engine": "local", "workers": 2, "relay": relay_of(fed.site[s])} for s in SITES],
            "tasks": [{"name": "nap", "kind": "sleep", "args": {"seconds": 0.4}, "rate": 5, "duration": "40s"}],
            "faults": [{"at": "15s", "kind": "kill-worker", "site": "siteA"}]}
    spec_file = tmp_path / "fedrun.yaml"
    spec_file.write_text(json.dumps(spec))
    out = tmp_path / "out"
    proc = subprocess.Popen([str(DIASPORA), "run", str(spec_file), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []  # what the run prints, read as it comes (its pipe never fills)
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        # Cut once both sites run tasks (a sanitized run on a loaded machine takes seconds to
        # connect its three plugins; a cut before the run's own connection would hold it).
        wait_until(lambda: all(any(f"on {s}/" in ln for ln in list(lines)) for s in SITES), 60, "tasks started at both sites",
                   interval=0.2)
        fed.cut()
        t_cut = time.monotonic()
        # During the cut each site's relay takes its site's events: site A's holds the
        # killed worker's failure and the policy's restart.
        def site_a_acted():
            evs = events_of(fed.site["siteA"], fed.token, "fedrun.events")
            return any(e["type"] == "org.diaspora.action.requested" for e in evs)
        try:
            wait_until(site_a_acted, PARTITION_S, "site A's policy acting while cut off")
        except AssertionError:
            # Why, in the message itself (a CI log keeps its head and tail): what the run said
            # of the fault and of actions, and what site A's relay holds.
            said = [ln.strip() for ln in list(lines) if any(w in ln for w in ("fault", "action", "lost", "plugin"))]
            held = collections.Counter(".".join(e["type"].split(".")[-2:])
                                       for e in events_of(fed.site["siteA"], fed.token, "fedrun.events"))
            raise AssertionError(f"site A's relay holds no action.requested {time.monotonic() - t_cut:.1f} s into the "
                                 f"cut; the run said: {said[:8]}; its last line: {lines[-1].strip() if lines else None}; "
                                 f"site A's relay holds: {held}") from None
        counts_during = {s: len(events_of(fed.site[s], fed.token, "fedrun.events")) for s in SITES}
        # Site A's console answers from its own relay during the cut: its tasks, and the
        # action its policy took.
        view = lambda r, v, q="": json.loads(https_get(r, f"/api/v1/views/{v}?workflow=fedrun&limit=1000{q}", fed.token))
        assert {t["site"] for t in view(fed.site["siteA"], "tasks")["items"] if t.get("site")} <= {"siteA", "siteB"}
        local = view(fed.site["siteA"], "actions")["items"]
        assert any(a["action"] == "migrate" for a in local), [(a.get("action"), a.get("origin")) for a in local] or view(fed.site["siteA"], "tasks")["total"]
        time.sleep(max(0.0, PARTITION_S - (time.monotonic() - t_cut)))
        for s in SITES:  # still running: more events at each site than earlier in the cut
            assert len(events_of(fed.site[s], fed.token, "fedrun.events")) > counts_during[s], s
        fed.heal()
        proc.wait(timeout=180)
        reader.join(10)
    except BaseException:
        # What the run printed says why (a sanitized pass on a loaded machine is slow).
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
        print(f"--- diaspora run's output (last 6000 characters):\n{''.join(lines)[-6000:]}", file=sys.stderr)
        # What a failure turns on, wherever it is in the output: faults, losses, decisions.
        notable = [ln for ln in lines if any(w in ln for w in ("fault", "lost", "action", "policy", "migrat", "restart",
                                                                "failed", "plugin", "relay"))]
        print("--- its faults, losses and actions:\n" + "".join(notable[:200]), file=sys.stderr)
        raise
    log = "".join(lines)
    (tmp_path / "run.log").write_text(log)
    assert proc.returncode == 0, log[-3000:]
    assert "siteA: its events go to its own relay" in log, log[:2000]
    rep = json.loads((out / "report.json").read_text())
    assert rep["plugin"]["stats"]["close_status"] == "DIASPORA_OK", rep["plugin"]
    at_site = {s: events_of(fed.site[s], fed.token, "fedrun.events") for s in SITES}
    # Each site's relay holds its own site's attempts only.
    for s in SITES:
        started = [e["data"].get("site") for e in at_site[s] if e["type"] == "org.diaspora.task.started"]
        assert started and set(started) == {s}, (s, sorted(set(map(str, started))))
        assert any(e["type"] == "org.diaspora.task.completed" for e in at_site[s]), s
        # A migrated task's attempt at its new site comes with its submission there: the
        # site's plugin saw a whole lifecycle, nothing out of order.
        warned = [e["data"] for e in at_site[s] if e["type"] == "org.diaspora.plugin.warning"]
        assert not warned, (s, warned[:3])
    # The centre also holds the run's own plugin's events (those of no site).
    expected = {(e["source"], e["id"]) for s in SITES for e in at_site[s]}
    keys: list = []

    def centre_caught_up():
        nonlocal keys
        keys = [(e["source"], e["id"]) for e in events_of(fed.centre, fed.token, "fedrun.events")]
        return expected <= set(keys)
    try:
        wait_until(centre_caught_up, 60, "the centre to hold every site event", interval=1)
    except AssertionError:
        raise AssertionError(f"{len(expected - set(keys))} of {len(expected)} site events missing at the centre") from None
    assert len(keys) == len(set(keys)), "an event twice at the centre"
    # The centre's views (its console) hold every task of both sites, done.
    # (The views follow the sourced streams a moment behind a read of the topic.)
    tasks: dict = {}

    def centre_views_done():
        nonlocal tasks
        tasks = view(fed.centre, "tasks")
        return tasks["total"] == len(rep["instances"]) and {t["state"] for t in tasks["items"]} == {"completed"}
    try:
        wait_until(centre_views_done, 30, "the centre's views to show every task completed", interval=0.5)
    except AssertionError:
        odd = [t for t in tasks["items"] if t["state"] != "completed"]
        of_odd = [(e["source"], e["type"], e["data"].get("attempt")) for e in events_of(fed.centre, fed.token, "fedrun.events")
                  if odd and e["data"].get("task_id") == odd[0].get("task_id")]
        raise AssertionError(f"{tasks['total']} tasks of {len(rep['instances'])} at the centre, not completed: {odd[:3]}; "
                             f"the centre's events of the first: {of_odd}") from None


def test_a_source_that_would_capture_the_relays_own_events_is_refused_at_start(tmp_path):
    creds = Credentials(tmp_path / "creds")
    cfg = tmp_path / "relay.yaml"
    base = ("listen: 127.0.0.1:0\nstorage: jetstream\njetstream:\n  urls: [nats://127.0.0.1:1]\n"
            "  subject_root: centre\n  sources:\n")
    args = ["--data-dir", tmp_path / "d", "--tls-cert", creds.certs / "server.pem",
            "--tls-key", creds.certs / "server-key.pem", "--auth-secret-file", creds.secret_file, "--config", cfg]
    cases = [
        ("    - {domain: siteA, prefix: siteA, subject_root: centre}\n",
         "domain siteA has this relay's own subject_root 'centre'"),
        ("    - {domain: siteA, prefix: siteA, subject_root: siteA}\n    - {domain: siteA, prefix: s2, subject_root: s2}\n",
         "domain siteA is listed twice"),
        ("    - {domain: site.A, prefix: siteA, subject_root: siteA}\n",
         f"{cfg}:7:16: error: jetstream.sources[0].domain: must be the jetstream.domain of its nats-server"),
        ("    - {domain: siteA, subject_root: siteA}\n", "prefix"),
    ]
    for text, said in cases:
        cfg.write_text(base + text)
        p = sh(DIASPORA.parent / "diaspora-relay", *args, check=False)
        assert p.returncode == 2 and said in p.stderr, (text, p.returncode, p.stderr)
