"""Checks the schemas and the test corpus with the reference checker (spec_check.py).

    cd <repo> && .venv/bin/python -m pytest -q tests/python

* every schema under schemas/ is a valid draft 2020-12 schema;
* tests/data/specs/good/*.yaml and examples/workflows/*.yaml have no errors;
* tests/data/specs/bad/*.yaml each have errors, and every `# expect: <substring>`
  line at the top of the file is found in the reported errors (the same lines are
  checked against the C++ loader's output by the C++ tests);
* tests/data/events/valid/*.json have no errors, tests/data/events/invalid/*.json do.
"""

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import spec_check  # noqa: E402

ROOT = spec_check.REPO_ROOT
DATA = ROOT / "tests" / "data"

SCHEMAS = sorted((ROOT / "schemas").rglob("*.json"))
GOOD_SPECS = sorted((DATA / "specs" / "good").glob("*.yaml")) + \
    sorted((ROOT / "examples" / "workflows").glob("*.yaml"))
BAD_SPECS = sorted((DATA / "specs" / "bad").glob("*.yaml"))
VALID_EVENTS = sorted((DATA / "events" / "valid").glob("*.json"))
INVALID_EVENTS = sorted((DATA / "events" / "invalid").glob("*.json"))

EXPECT_RE = re.compile(r"^#\s*expect:\s?(.*?)\s*$")


def _ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


def expectations(path: Path) -> list[str]:
    """The `# expect:` lines of the comment block that opens a bad spec."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        m = EXPECT_RE.match(line)
        if m:
            out.append(m.group(1))
    return out


def test_corpus_is_not_empty():
    assert len(SCHEMAS) >= 2
    assert len(GOOD_SPECS) >= 8
    assert len(BAD_SPECS) >= 20
    assert len(VALID_EVENTS) >= 14
    assert len(INVALID_EVENTS) >= 20
    for name in ("quickstart", "ptycho-stream", "dask-resilient"):
        assert (ROOT / "examples" / "workflows" / f"{name}.yaml").is_file()


@pytest.mark.parametrize("path", SCHEMAS, ids=_ids(SCHEMAS))
def test_schema_is_valid(path):
    schema = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema.get("$schema") == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", GOOD_SPECS, ids=_ids(GOOD_SPECS))
def test_good_spec(path):
    assert spec_check.check_spec(path) == []


@pytest.mark.parametrize("path", BAD_SPECS, ids=_ids(BAD_SPECS))
def test_bad_spec(path):
    expected = expectations(path)
    assert expected, f"{path.name}: no '# expect:' line at the top"
    errors = spec_check.check_spec(path)
    assert errors, f"{path.name} was accepted"
    report = "\n".join(errors)
    for substring in expected:
        assert substring in report, f"expected {substring!r} in:\n{report}"


@pytest.mark.parametrize("path", VALID_EVENTS, ids=_ids(VALID_EVENTS))
def test_valid_event(path):
    assert spec_check.check_event(path) == []


def _event_reasons() -> dict:
    """tests/data/events/invalid/EXPECT.tsv: what each file's refusal must name."""
    out = {}
    for line in (DATA / "events" / "invalid" / "EXPECT.tsv").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, *reasons = line.split("\t")
            out[name] = reasons[-1]  # the Python checker's wording when it has its own column
    return out


@pytest.mark.parametrize("path", INVALID_EVENTS, ids=_ids(INVALID_EVENTS))
def test_invalid_event(path):
    errors = spec_check.check_event(path)
    assert errors != []
    reason = _event_reasons()[path.name]
    assert any(reason in e for e in errors), (reason, errors)


def test_every_invalid_event_has_its_reason():
    assert set(_event_reasons()) == {p.name for p in INVALID_EVENTS}


def test_every_diaspora_event_type_has_a_valid_example():
    types = {p.name[: -len(".schema.json")] for p in (ROOT / "schemas" / "events").glob("*.schema.json")}
    seen = set()
    for p in VALID_EVENTS:
        event = json.loads(p.read_text(encoding="utf-8"))
        seen.add(event.get("type"))
    assert types - seen == set()


def test_semantic_checks_run_only_on_schema_valid_specs(tmp_path):
    spec = tmp_path / "s.yaml"
    # schema-invalid (unknown key) and semantically invalid (unknown site):
    # only the schema error is reported.
    spec.write_text("version: 1\nname: x\nsites:\n  - name: a\n    engine: local\n    bogus: 1\n"
                    "faults:\n  - at: 1s\n    kind: kill-worker\n    site: b\n")
    errors = spec_check.check_spec(spec)
    assert len(errors) == 1 and "unknown key 'bogus'" in errors[0]


def test_error_format_has_file_line_column(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("version: 1\nname: x\nsites:\n  - name: a\n    engine: lcoal\n")
    (error,) = spec_check.check_spec(spec)
    assert error.startswith(f"{spec}:5:13: error: sites[0].engine: must be one of: ")
    assert error.endswith("did you mean 'local'?")
