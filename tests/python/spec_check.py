#!/usr/bin/python3
"""Reference checker for Diaspora workflow specs and CloudEvents files.

A small, independent re-implementation (in Python) of what the C++ loader does,
used by the test corpus to keep the schemas, the corpus files and the C++ side
honest:

    check_spec(path)  -> list[str]   # YAML workflow spec: schema, then semantic checks
    check_event(path) -> list[str]   # JSON CloudEvent: envelope, then Diaspora payload

An empty list means the file is valid.  Spec errors are formatted like the C++
loader's: ``FILE:LINE:COL: error: <key path>: <message>`` (1-based positions of
the offending YAML node), so the ``# expect:`` lines of the bad corpus can be
checked against this module too.

CLI:  .venv/bin/python tests/python/spec_check.py FILE...
      (*.json files are checked as events, everything else as specs;
       exit status 1 if any file has errors)
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO_ROOT / "schemas"
WORKFLOW_SCHEMA = SCHEMA_DIR / "workflow.schema.json"
EVENT_SCHEMA = SCHEMA_DIR / "event.schema.json"
EVENT_TYPE_DIR = SCHEMA_DIR / "events"
DIASPORA_PREFIX = "org.diaspora."

_schema_cache: dict[Path, dict] = {}


def load_schema(path: Path) -> dict:
    path = Path(path)
    if path not in _schema_cache:
        with open(path, encoding="utf-8") as f:
            _schema_cache[path] = json.load(f)
    return _schema_cache[path]


def _validator(schema: dict) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


# --------------------------------------------------------------------------
# Paths and positions
# --------------------------------------------------------------------------

def format_path(parts) -> str:
    """['sites', 1, 'engine'] -> 'sites[1].engine'; [] -> '(root)'."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out or "(root)"


def _node_at(root, parts, key: bool = False):
    """The YAML node for a data path (or, with key=True, the node of the last key)."""
    node = root
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(p):
                    # An empty value (`engine:` and nothing after it) is placed at its key.
                    empty = isinstance(v, yaml.ScalarNode) and v.tag.endswith(":null") and v.value == ""
                    node = k if ((last and key) or empty) else v
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and p < len(node.value):
            node = node.value[p]
        else:
            return node
    return node


def _pos(node) -> tuple[int, int]:
    if node is None:
        return (1, 1)
    return (node.start_mark.line + 1, node.start_mark.column + 1)


# --------------------------------------------------------------------------
# Message texts (the same forms as the C++ validator)
# --------------------------------------------------------------------------

def json_type(value) -> str:
    """JSON type name of a loaded value (a float with no fraction counts as integer)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value == value and abs(value) != float("inf") and value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance where an adjacent transposition counts as one edit
    (the same approximation of Damerau distance as the C++ side)."""
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev[j - 1])
        prev = cur
    return prev[-1]


def suggest(word: str, known) -> str | None:
    """The known word closest to `word` within distance 2, else one that `word` is a
    prefix of (or that is a prefix of `word`), for words of 3+ characters."""
    best, best_d = None, 3
    for k in known:
        d = _edit_distance(word, k)
        if d < best_d:
            best, best_d = k, d
    if best is None and len(word) >= 3:
        for k in known:
            if k.startswith(word) or word.startswith(k):
                return k
    return best


def _number_text(v) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return json.dumps(v)


def _schema_errors(data, schema: dict):
    """Yields (path parts, at_key, message) for every schema error, worded like the
    C++ validator (core/src/json_schema.cpp): a schema's errorMessage replaces the
    generic text of a failed value keyword at the same level."""
    validator = _validator(schema)
    value_keywords = {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
                      "exclusiveMaximum", "minLength", "maxLength", "pattern", "oneOf", "anyOf"}
    errors = list(validator.iter_errors(data))
    # Like the C++ side, a failed "type" stops the other keywords of the same schema
    # (and its subschemas) from reporting on the same value.
    type_failed = [(list(e.absolute_path), list(e.absolute_schema_path)[:-1])
                   for e in errors if e.validator == "type"]

    def shadowed(e) -> bool:
        if e.validator == "type":
            return False
        p, sp = list(e.absolute_path), list(e.absolute_schema_path)
        return any(p == tp and sp[:len(tsp)] == tsp for tp, tsp in type_failed)

    for err in errors:
        if shadowed(err):
            continue
        path = list(err.absolute_path)
        kw = err.validator
        sch = err.schema if isinstance(err.schema, dict) else {}
        hint = sch.get("errorMessage")
        inst = err.instance
        vv = err.validator_value
        schema_path = list(err.schema_path)
        if len(schema_path) >= 2 and schema_path[-2] == "propertyNames":
            # jsonschema reports a bad key at the object; the C++ side at the key.
            generic = hint if hint else err.message
            yield path + [inst], True, f"key '{inst}' {generic}"
            continue
        if kw == "additionalProperties" and vv is False and isinstance(inst, dict):
            props = sch.get("properties", {})
            pats = sch.get("patternProperties", {})
            for k in inst:
                if k in props or any(re.search(p, str(k)) for p in pats):
                    continue
                msg = f"unknown key '{k}'"
                s = suggest(str(k), list(props))
                if s:
                    msg += f"; did you mean '{s}'?"
                yield path + [k], True, msg
            continue
        if kw == "required":
            for k in vv:
                if isinstance(inst, dict) and k not in inst:
                    yield path, False, f"missing required key '{k}'"
            continue
        if kw == "uniqueItems":
            seen = []
            for i, item in enumerate(inst):
                for j, other in enumerate(seen):
                    if item == other and json_type(item) == json_type(other):
                        yield path + [i], False, f"duplicate item {json.dumps(item)} (same as item {j})"
                        break
                seen.append(item)
            continue
        if kw == "not" and isinstance(vv, dict) and list(vv) == ["required"]:
            keys = [f"'{k}'" for k in vv["required"]]
            yield path, False, (", ".join(keys[:-1]) + " and " + keys[-1]) + " cannot be used together"
            continue

        if kw == "type":
            types = vv if isinstance(vv, list) else [vv]
            generic = f"expected {' or '.join(types)}, got {json_type(inst)}"
            if "object" in types or "array" in types:
                yield path, False, generic
                continue
        elif kw == "enum":
            generic = "must be one of: " + ", ".join(json.dumps(v) for v in vv)
            if isinstance(inst, str):
                s = suggest(inst, [v for v in vv if isinstance(v, str)])
                if s:
                    generic += f"; did you mean '{s}'?"
        elif kw == "const":
            generic = f"must be {json.dumps(vv)}"
        elif kw == "minimum":
            generic = f"must be >= {_number_text(vv)}"
        elif kw == "maximum":
            generic = f"must be <= {_number_text(vv)}"
        elif kw == "exclusiveMinimum":
            generic = f"must be > {_number_text(vv)}"
        elif kw == "exclusiveMaximum":
            generic = f"must be < {_number_text(vv)}"
        elif kw == "minLength":
            generic = "must not be empty" if vv == 1 else f"must be at least {vv} characters long"
        elif kw == "maxLength":
            generic = f"must be at most {vv} characters long"
        elif kw == "pattern":
            generic = f"must match the pattern {json.dumps(vv)}"
        elif kw == "minItems":
            generic = "must not be empty" if vv == 1 else f"must have at least {vv} items"
        elif kw == "maxItems":
            generic = f"must have at most {vv} items"
        elif kw == "oneOf":
            generic = f"must match exactly one of {len(vv)} alternatives"
        elif kw == "not":
            generic = "must not match the forbidden schema"
        else:
            generic = err.message
        yield path, False, hint if (hint and kw in value_keywords) else generic


# --------------------------------------------------------------------------
# Workflow specs
# --------------------------------------------------------------------------

def _semantic_errors(spec: dict):
    """Yields (path parts, message) for the cross-reference checks."""
    sites = spec.get("sites", []) or []
    tasks = spec.get("tasks", []) or []
    policies = spec.get("policies", []) or []
    rehearsal = spec.get("rehearsal", []) or []
    faults = spec.get("faults", []) or []

    def dup_check(groups):
        seen = {}
        for section, items in groups:
            for i, item in enumerate(items):
                n = item.get("name")
                path = [section, i, "name"]
                if n in seen:
                    yield path, n, seen[n]
                else:
                    seen[n] = path

    for g in ([("sites", sites)], [("policies", policies)],
              [("tasks", tasks), ("rehearsal", rehearsal)]):
        for path, n, first in dup_check(g):
            yield path, ("dup", n, first)

    site_names = {s["name"] for s in sites}
    job_names = {t["name"] for t in tasks} | {r["name"] for r in rehearsal}

    for i, t in enumerate(tasks):
        allowed = t.get("allowed_sites")
        for field in ("preferred_sites", "allowed_sites"):
            for j, s in enumerate(t.get(field, []) or []):
                if s not in site_names:
                    yield ["tasks", i, field, j], f"unknown site '{s}'"
                elif field == "preferred_sites" and allowed is not None and s not in allowed:
                    yield ["tasks", i, field, j], f"preferred site '{s}' is not in allowed_sites"

    for i, p in enumerate(policies):
        for j, tname in enumerate(p.get("targets", []) or []):
            if tname not in site_names and tname not in job_names:
                yield ["policies", i, "targets", j], f"unknown target '{tname}'"
        for j, s in enumerate(p.get("to_sites", []) or []):
            if s not in site_names:
                yield ["policies", i, "to_sites", j], f"unknown site '{s}'"
        if p.get("action") in ("migrate", "speculate") and len(sites) < 2:
            yield ["policies", i, "action"], f"action '{p['action']}' needs at least two sites"

    for section, items in (("rehearsal", rehearsal), ("faults", faults)):
        for i, item in enumerate(items):
            if "site" in item and item["site"] not in site_names:
                yield [section, i, "site"], f"unknown site '{item['site']}'"
    task_names = {t["name"] for t in tasks}
    for i, r in enumerate(rehearsal):
        if "stream" in r and r["stream"] not in task_names:
            yield ["rehearsal", i, "stream"], f"unknown task '{r['stream']}'"
        if r.get("dataset") == "ptycho-stream" and "stream" not in r:
            yield ["rehearsal", i, "dataset"], "ptycho-stream needs 'stream': the task whose data.arrived scans the job trains on"
        if r.get("dataset") != "ptycho-stream" and "stream" in r:
            yield ["rehearsal", i, "stream"], "'stream' is for dataset ptycho-stream only"
    for i, f in enumerate(faults):
        if "task" in f and f["task"] not in job_names:
            yield ["faults", i, "task"], f"unknown task '{f['task']}'"


def check_spec(path) -> list[str]:
    """Errors of a workflow spec file; [] when it is valid."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return [f"{name}: error: cannot read: {e}"]
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return [f"{name}:{line}:{col}: error: YAML syntax error: {e.problem or e}"]
    except yaml.YAMLError as e:
        return [f"{name}:1:1: error: YAML error: {e}"]
    if root is None:
        return [f"{name}:1:1: error: (root): empty document (expected a mapping)"]

    def fmt(parts, at_key, msg):
        line, col = _pos(_node_at(root, parts, key=at_key))
        return f"{name}:{line}:{col}: error: {format_path(parts)}: {msg}"

    errors = [fmt(p, k, m) for p, k, m in _schema_errors(data, load_schema(WORKFLOW_SCHEMA))]
    if errors:
        return errors
    for parts, msg in _semantic_errors(data):
        if isinstance(msg, tuple):  # duplicate name
            _, n, first = msg
            fl, fc = _pos(_node_at(root, first))
            msg = f"duplicate name '{n}' (first defined at {fl}:{fc})"
        errors.append(fmt(parts, False, msg))
    return errors


# --------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------

def _finite_float(text: str) -> float:
    """A JSON number as a float; one beyond a double's range (1e999) is refused, as the
    C++ decoder refuses it: JSON could not carry it back."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text} is out of the range of a double")
    return v


def check_event(path) -> list[str]:
    """Errors of a CloudEvent (JSON format) file; [] when it is valid."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            event = json.load(f, parse_float=_finite_float)
    except (OSError, ValueError) as e:
        return [f"{path}: error: not JSON: {e}"]

    errors = [f"{format_path(p)}: {m}"
              for p, _k, m in _schema_errors(event, load_schema(EVENT_SCHEMA))]
    if not isinstance(event, dict):
        return errors
    etype = event.get("type")
    if isinstance(etype, str) and etype.startswith(DIASPORA_PREFIX):
        schema_file = EVENT_TYPE_DIR / f"{etype}.schema.json"
        if not schema_file.is_file():
            errors.append(f"type: unknown Diaspora event type '{etype}'")
        elif "data" in event:
            errors += [f"data{('.' + format_path(p)) if p else ''}: {m}"
                       .replace(".[", "[")
                       for p, _k, m in _schema_errors(event["data"], load_schema(schema_file))]
    return errors


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: spec_check.py FILE...  (*.json: events; others: workflow specs)", file=sys.stderr)
        return 2
    bad = 0
    for arg in argv:
        errs = check_event(arg) if arg.endswith(".json") else check_spec(arg)
        for e in errs:
            print(e if e.startswith(arg) else f"{arg}: error: {e}")
        if errs:
            bad += 1
        else:
            print(f"{arg}: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
