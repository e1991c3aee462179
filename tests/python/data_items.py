"""Data items over diaspora.v1, written from docs/streaming.md: the put frame, the binary
chunk frames each way, and a reader that puts items back together from a subscription."""
from __future__ import annotations

import hashlib
import json
import struct

from relay_harness import TIMEOUT, event, recv  # noqa: F401  (recv re-exported for the tests)

MAGIC = b"DSPD"
VERSION = 1
HEADER = struct.Struct(">4sBBHQII")  # magic, version, kind, reserved, ref, index, count
PUT, DELIVERED, STORED = 1, 2, 3
CHUNK = 256 * 1024


def put_chunk(seq: int, index: int, count: int, payload: bytes, version: int = VERSION, kind: int = PUT) -> bytes:
    return HEADER.pack(MAGIC, version, kind, 0, seq, index, count) + payload


def decode_delivered(frame: bytes) -> dict:
    magic, version, kind, _, offset, index, count = HEADER.unpack_from(frame)
    assert (magic, version, kind) == (MAGIC, VERSION, DELIVERED), (magic, version, kind)
    at = HEADER.size
    (n,) = struct.unpack_from(">H", frame, at)
    sub = json.loads(frame[at + 2:at + 2 + n])
    at += 2 + n
    (n,) = struct.unpack_from(">H", frame, at)
    topic = frame[at + 2:at + 2 + n].decode()
    at += 2 + n
    return {"id": sub, "topic": topic, "offset": offset, "index": index, "count": count, "payload": frame[at:]}


def item_event(item_id: str, data: bytes, chunk: int = CHUNK, source: str = "/pytest/detector", **attrs) -> dict:
    ev = event(item_id, source=source, type_="org.example.frame", data={"detector": "d0"})
    ev.update(itemsize=len(data), itemchunks=(len(data) + chunk - 1) // chunk,
              itemsha256=hashlib.sha256(data).hexdigest(), **attrs)
    return ev


async def send_item(ws, topic: str, seq: int, ev: dict, data: bytes, chunk: int = CHUNK) -> None:
    """Sends a put and its chunks (no wait for the ack)."""
    await ws.send(json.dumps({"op": "put", "topic": topic, "seq": seq, "event": ev}))
    count = ev["itemchunks"]
    for i in range(count):
        await ws.send(put_chunk(seq, i, count, data[i * chunk:(i + 1) * chunk]))


async def put_item(ws, topic: str, seq: int, data: bytes, item_id: str, chunk: int = CHUNK, **attrs) -> dict:
    """Puts one item and returns the relay's answer to it (ack or nack)."""
    await send_item(ws, topic, seq, item_event(item_id, data, chunk, **attrs), data, chunk)
    return await answer(ws, seq)


async def answer(ws, seq: int) -> dict:
    while True:
        m = await recv(ws)
        if m.get("seq") == seq or m["op"] == "error":
            return m


class ItemReader:
    """Reads a subscription's frames and puts items back together: events frames (an item's
    event announces its chunks) and binary chunk frames, in offset order."""

    def __init__(self, ws):
        self.ws = ws
        self.events: list[tuple[int, dict]] = []  # every event, items' included
        self.items: list[dict] = []               # whole items: {"offset", "event", "data"}
        self.chunks = 0
        self.next_offset = 0
        self._open: dict | None = None

    async def read(self, timeout: float = TIMEOUT):
        import asyncio
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        if isinstance(frame, bytes):
            c = decode_delivered(frame)
            it = self._open
            assert it is not None and c["offset"] == it["offset"] + 1 + c["index"] and c["index"] == len(it["parts"]), \
                (c["offset"], c["index"], it and it["offset"])
            it["parts"].append(c["payload"])
            self.chunks += 1
            self.next_offset = c["offset"] + 1
            if len(it["parts"]) == c["count"]:
                self._close()
            return
        m = json.loads(frame)
        if m["op"] != "events":
            return m
        for e in m["events"]:
            assert self._open is None, f"event at {e['offset']} inside the item at {self._open['offset']}"
            self.events.append((e["offset"], e["event"]))
            if "itemsize" in e["event"]:
                self._open = {"offset": e["offset"], "event": e["event"], "parts": []}
                if e["event"]["itemchunks"] == 0:
                    self._close()
        self.next_offset = m["next_offset"]

    def _close(self):
        it = self._open
        data = b"".join(it.pop("parts"))
        it["data"] = data
        assert len(data) == it["event"]["itemsize"]
        assert hashlib.sha256(data).hexdigest() == it["event"]["itemsha256"], f"item at {it['offset']}: checksum"
        self.items.append(it)
        self._open = None

    async def until(self, items: int, timeout: float = TIMEOUT):
        while len(self.items) < items:
            await self.read(timeout)
        return self.items
