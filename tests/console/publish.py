"""Publishes events to a relay and waits for the ack: what tests/console/drive.mjs runs
at the moment it wants an event to appear.

    python3 tests/console/publish.py URL CA_FILE TOKEN TOPIC EVENTS_JSON
"""
import asyncio
import json
import ssl
import sys

import websockets


async def main(url: str, ca: str, token: str, topic: str, events: list) -> None:
    ctx = ssl.create_default_context(cafile=ca)
    async with websockets.connect(url + "/v1", ssl=ctx, subprotocols=["diaspora.v1"], open_timeout=10) as ws:
        await ws.send(json.dumps({"op": "hello", "client_id": "console-test", "token": token}))
        assert json.loads(await ws.recv())["op"] == "welcome"
        await ws.send(json.dumps({"op": "publish", "topic": topic, "seq": 0, "events": events}))
        ack = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert ack["op"] == "ack", ack


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(*sys.argv[1:5], json.loads(sys.argv[5])), 20))
