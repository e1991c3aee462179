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
import json
import os
import time
from pathlib import Path

from relay_harness import (DIASPORA, Credentials, NatsServer, Netns, RelayProcess, event, free_port, https_get,
                           publish_events, recv, relay_events, request, run, session, sh, stop_all, wait_until)

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


def events_of(relay: RelayProcess, token: str, topic: str, n: int, within_s: float = 90) -> list[dict]:
    """The events of `topic` on `relay` once it holds at least `n` (or what it holds after
    `within_s` seconds)."""
    return relay_events(relay, token, n, topic, counted=lambda e: True, within_s=within_s)


def test_two_sites_cut_off_for_30s_keep_working_and_the_centre_then_holds_each_event_once(tmp_path):
    creds = Credentials(tmp_path / "creds")
    ns = Netns("f")
    servers: list[NatsServer] = []
    relays: list[RelayProcess] = []
    try:
        creds.renew_server_cert(86400, ips=(ns.ns_ip,))  # the centre relay is reached on the namespace's address
        token = creds.token("admin")
        leaf_port = free_port()
        hub = NatsServer(tmp_path / "nats", "centre", host=ns.ns_ip, netns=ns.name, domain="centre",
                         leaf_port=leaf_port).start()
        servers.append(hub)
        site_nats = {s: NatsServer(tmp_path / "nats", s, domain=s,
                                   leaf_remotes=[f"nats-leaf://{ns.ns_ip}:{leaf_port}"]).start() for s in SITES}
        servers += site_nats.values()
        centre = federated_relay(creds, tmp_path, "CENTRE", hub, "centre",
                                 [{"domain": s, "prefix": s, "subject_root": s} for s in SITES],
                                 host=ns.ns_ip, netns=ns.name)
        relays.append(centre)
        site = {s: federated_relay(creds, tmp_path, s, site_nats[s], s,
                                   [{"domain": "centre", "prefix": "CENTRE", "subject_root": "centre",
                                     "topics": ["*.control"]}]) for s in SITES}
        relays += site.values()

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
        wait_until(lambda: len(events_of(site["siteB"], token, "fed.control", 1, 5)) >= 1, 60,
                   "the centre's action at site B")

        # The cut: the namespace's end of the veth goes down, nothing passes either way.
        ns.link(False)
        t_cut = time.monotonic()
        k = 100
        while time.monotonic() - t_cut < PARTITION_S:
            for s in SITES:  # each site still takes (acks) and serves its events
                publish_events(site[s], token, "fed.events", batch(s, k, k + 20))
            k += 20
            time.sleep(0.5)
        publish_events(site["siteB"], token, "fed.control", [event("b-1", source="/siteB")])
        for s in SITES:
            held = events_of(site[s], token, "fed.events", 0, 3)
            assert [e["id"] for e in held] == [f"{s}-{i}" for i in range(k)], f"{s} during the cut"
        cut_for = time.monotonic() - t_cut
        ns.link(True)

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
        print(f"cut for {cut_for:.1f} s; {k} events a site; the centre holds {total}")
    finally:
        try:
            stop_all(relays, servers)
        finally:
            ns.close()


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
