"""Fixtures shared by the adapter tests: development credentials (one set per module), a
relay process on 127.0.0.1 with TLS (one per test) and a token with publish and subscribe
on everything, as text and as a file. A relay that exits non-zero at stop, or whose log holds
a sanitizer report, fails the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from relay_harness import Credentials, RelayProcess  # noqa: E402


@pytest.fixture(scope="module")
def creds(tmp_path_factory) -> Credentials:
    return Credentials(tmp_path_factory.mktemp("creds"))


@pytest.fixture
def relay(creds, tmp_path):
    r = RelayProcess(creds, tmp_path / "relay").start()
    yield r
    r.stop_cleanly()  # a non-zero exit at stop or a sanitizer report fails the test


@pytest.fixture
def token(creds, tmp_path) -> tuple[str, Path]:
    t = creds.token("publish:*", "subscribe:*")
    f = tmp_path / "token"
    f.write_text(t + "\n")
    return t, f
