"""End-to-end tests of the `diaspora` command line (build/bin/diaspora).

Checks what a user sees: exit codes, messages, files written. Certificates are checked
with the `openssl` command (an independent implementation) and tokens are verified
with Python's own hmac module, so the C++ code is not checking itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("DIASPORA_BIN_DIR", REPO / "build" / "bin"))
DIASPORA = BIN / "diaspora"


def flip(token: str) -> str:
    """The token with one signature character changed (not the last one, whose low bits are padding)."""
    i = len(token) - 10
    return token[:i] + ("B" if token[i] == "A" else "A") + token[i + 1:]


def run(*args: str, check_rc: int | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([str(DIASPORA), *args], capture_output=True, text=True, timeout=60)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.returncode, p.stdout, p.stderr)
    return p


def b64url_decode(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def test_binary_exists():
    assert DIASPORA.is_file(), f"build the project first: {DIASPORA} is missing"


def test_version_and_help():
    p = run("--version", check_rc=0)
    assert p.stdout.startswith("diaspora 0.")
    p = run("--help", check_rc=0)
    for cmd in ("validate", "certs", "token"):
        assert cmd in p.stdout
    p = run("validate", "--help", check_rc=0)
    assert "FILE:LINE:COL" in p.stdout
    p = run("token", "issue", "--help", check_rc=0)
    assert "--scope" in p.stdout


def test_usage_errors_exit_2():
    assert run().returncode == 2
    assert run("frobnicate").returncode == 2
    assert run("validate").returncode == 2  # no files


def test_validate_examples_ok():
    examples = sorted((REPO / "examples" / "workflows").glob("*.yaml"))
    assert len(examples) >= 3
    p = run("validate", *map(str, examples), check_rc=0)
    assert p.stdout.count(": ok") == len(examples)
    assert p.stderr == ""


def test_validate_bad_prints_every_error_and_exits_2():
    bad = REPO / "tests" / "data" / "specs" / "bad" / "multiple-schema-errors.yaml"
    good = REPO / "examples" / "workflows" / "quickstart.yaml"
    p = run("validate", str(good), str(bad), check_rc=2)
    lines = [line for line in p.stderr.splitlines() if ": error: " in line]
    assert len(lines) >= 3, p.stderr
    for line in lines:
        assert line.startswith(f"{bad}:"), line
        file_, line_no, col, rest = line.split(":", 3)
        assert int(line_no) > 0 and int(col) > 0
    assert "did you mean 'workers'?" in p.stderr
    assert "in 1 of 2 files" in p.stderr
    assert f"{good}: ok" in p.stdout


def test_validate_missing_file_exits_2():
    p = run("validate", "/nonexistent/spec.yaml", check_rc=2)
    assert "/nonexistent/spec.yaml: error: no such file" in p.stderr


def test_certs_init_writes_verifiable_certificates(tmp_path: Path):
    d = tmp_path / "certs"
    run("certs", "init", str(d), check_rc=0)
    for name in ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem"):
        assert (d / name).is_file(), name
    for key in ("server-key.pem", "client-key.pem", "ca-key.pem"):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600, key
    # Independent check with the openssl command line tool.
    v = subprocess.run(["openssl", "verify", "-CAfile", str(d / "ca.pem"), "-verify_hostname", "localhost",
                        str(d / "server.pem")], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    v = subprocess.run(["openssl", "verify", "-CAfile", str(d / "ca.pem"), "-verify_ip", "127.0.0.1",
                        "-purpose", "sslserver", str(d / "server.pem")], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    v = subprocess.run(["openssl", "verify", "-CAfile", str(d / "ca.pem"), "-purpose", "sslclient",
                        str(d / "client.pem")], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
    # A second init refuses to overwrite; --force replaces.
    p = run("certs", "init", str(d))
    assert p.returncode == 1 and "refusing to overwrite" in p.stderr
    run("certs", "init", "--force", str(d), check_rc=0)
    run("certs", "check", "--ca", str(d / "ca.pem"), "--host", "127.0.0.1", str(d / "server.pem"), check_rc=0)
    p = run("certs", "check", "--ca", str(d / "ca.pem"), "--host", "example.org", str(d / "server.pem"))
    assert p.returncode == 2 and "error:" in p.stderr


def test_token_issue_is_a_standard_hs256_jwt(tmp_path: Path):
    secret_file = tmp_path / "secret"
    run("token", "secret", str(secret_file), check_rc=0)
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip().encode()
    p = run("token", "issue", "--secret-file", str(secret_file), "--subject", "edge-plugin",
            "--scope", "publish:task.*", "--scope", "subscribe:*", "--ttl", "15m", check_rc=0)
    token = p.stdout.strip()
    header_b64, payload_b64, sig_b64 = token.split(".")
    header = json.loads(b64url_decode(header_b64))
    payload = json.loads(b64url_decode(payload_b64))
    assert header["alg"] == "HS256"
    expected = hmac.new(secret, f"{header_b64}.{payload_b64}".encode(), hashlib.sha256).digest()
    assert hmac.compare_digest(expected, b64url_decode(sig_b64))
    assert payload["sub"] == "edge-plugin"
    assert payload["scope"] == ["publish:task.*", "subscribe:*"]
    assert abs(payload["exp"] - (time.time() + 900)) < 60

    p = run("token", "verify", "--secret-file", str(secret_file), token, check_rc=0)
    assert json.loads(p.stdout) == payload  # every claim as the token holds it (docs/cli.md)
    p = run("token", "issue", "--secret-file", str(secret_file), "--subject", "s", "--scope", "admin",
            "--issuer", "site-a", check_rc=0)
    claims = json.loads(run("token", "verify", "--secret-file", str(secret_file), p.stdout.strip(), check_rc=0).stdout)
    assert claims["iss"] == "site-a" and isinstance(claims["iat"], int) and isinstance(claims["exp"], int)
    assert claims == json.loads(b64url_decode(p.stdout.strip().split(".")[1]))
    run("token", "verify", "--secret-file", str(secret_file), "--action", "publish", "--topic", "task.started",
        token, check_rc=0)
    p = run("token", "verify", "--secret-file", str(secret_file), "--action", "publish", "--topic", "control.x",
            token, check_rc=2)
    assert "[insufficient_scope]" in p.stderr


def test_token_refusals_have_distinct_codes(tmp_path: Path):
    secret_file = tmp_path / "secret"
    run("token", "secret", str(secret_file), check_rc=0)
    secret = secret_file.read_text().strip().encode()

    def sign(header: dict, payload: dict) -> str:
        enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
        signing = f"{enc(header)}.{enc(payload)}"
        sig = base64.urlsafe_b64encode(hmac.new(secret, signing.encode(), hashlib.sha256).digest()).rstrip(b"=")
        return f"{signing}.{sig.decode()}"

    now = int(time.time())
    good = {"sub": "x", "scope": ["admin"], "exp": now + 3600}
    cases = {
        "expired": sign({"alg": "HS256"}, {**good, "exp": now - 3600}),
        "not_yet_valid": sign({"alg": "HS256"}, {**good, "nbf": now + 3600}),
        "unsupported_algorithm": sign({"alg": "none"}, good).rsplit(".", 1)[0] + ".",
        "bad_signature": flip(sign({"alg": "HS256"}, good)),
        "malformed": "abc",
        "missing_claim": sign({"alg": "HS256"}, {"sub": "x"}),
    }
    run("token", "verify", "--secret-file", str(secret_file), sign({"alg": "HS256"}, good), check_rc=0)
    for code, token in cases.items():
        p = run("token", "verify", "--secret-file", str(secret_file), token)
        assert p.returncode == 2, (code, p.stderr)
        assert f"[{code}]" in p.stderr, (code, p.stderr)


def test_token_issue_rejects_bad_input(tmp_path: Path):
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    p = run("token", "issue", "--secret-file", str(weak), "--subject", "s", "--scope", "admin")
    assert p.returncode == 2 and "[bad_secret]" in p.stderr
    good = tmp_path / "secret"
    run("token", "secret", str(good), check_rc=0)
    p = run("token", "issue", "--secret-file", str(good), "--subject", "s", "--scope", "write:all")
    assert p.returncode == 2 and "use publish:<pattern>" in p.stderr
    p = run("token", "issue", "--secret-file", str(good), "--subject", "s", "--scope", "admin", "--ttl", "3y")
    assert p.returncode == 2 and "--ttl" in p.stderr


def test_cpp_loader_and_python_jsonschema_agree_on_every_spec():
    """The C++ loader (via `diaspora validate`) and the python-jsonschema reference
    checker give the same valid/invalid verdict for every spec in the corpus."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import spec_check

    specs = sorted((REPO / "tests" / "data" / "specs").glob("*/*.yaml"))
    specs += sorted((REPO / "examples" / "workflows").glob("*.yaml"))
    assert len(specs) > 40
    disagreements = []
    for spec in specs:
        cpp_ok = run("validate", "-q", str(spec)).returncode == 0
        py_ok = spec_check.check_spec(spec) == []
        if cpp_ok != py_ok:
            disagreements.append(f"{spec}: C++ {'valid' if cpp_ok else 'invalid'}, "
                                 f"Python {'valid' if py_ok else 'invalid'}")
    assert disagreements == []


def test_bench_relay_runs_the_benchmark_program_beside_the_cli(tmp_path: Path):
    """`diaspora bench relay` is diaspora-bench (built in bench/): its arguments, output and
    exit codes pass through the CLI unchanged."""
    if not (BIN / "diaspora-bench").exists():  # a build without benchmarks (the sanitizer builds)
        p = run("bench", "relay", check_rc=1)
        assert "DIASPORA_BUILD_BENCH" in p.stderr, p.stderr
        return
    p = run("bench", "relay", "--events", "2000", "--batch", "100", "--subscribers", "1", "--json", check_rc=0)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["events"] == 2000
    assert out["events_per_s"] > 0
    assert run("bench", "relay", "--producers", "0").returncode == 2  # diaspora-bench's own usage error
    assert "relay" in run("bench", "--help", check_rc=0).stdout
    # Without the program beside it, the CLI says what builds it.
    lone = tmp_path / "bin"
    lone.mkdir()
    shutil.copy2(DIASPORA, lone / "diaspora")
    p = subprocess.run([str(lone / "diaspora"), "bench", "relay"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "DIASPORA_BUILD_BENCH" in p.stderr


def test_validate_runs_the_resilience_engines_checks_at_the_key_at_fault(tmp_path: Path):
    """`diaspora validate` also compiles the policies (docs/specs.md): the engine-level rules
    are reported like the loader's, at the value of the key at fault."""
    spec = tmp_path / "s.yaml"
    spec.write_text("version: 1\nname: x\nsites:\n  - name: edge\n    engine: local\ntasks:\n  - name: t\n"
                    "    kind: sleep\npolicies:\n  - name: p\n    signal: site.throughput\n    action: restart\n")
    p = run("validate", str(spec), check_rc=2)
    assert f"{spec}:12:13: error: policies[0].action: policy 'p': action 'restart' acts on a task" in p.stderr, p.stderr
