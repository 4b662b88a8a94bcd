"""Replay conformance cases (app, inputs, Siddhi's recorded output) and compare.

A case file is JSON lines; see ../shared/conformance/README.md. For each case: build the
runtime, attach the observer the case names (`query:<name>` or `stream:<name>`), send the
inputs in order, then compare the delivered events with the expected ones by Java type:
Float as 32-bit, Double exactly or within 1e-9 relative, integers, strings and booleans
exactly, null only with null; as multisets where the case says the order is undefined.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sp_dagster.engine.errors import EngineError
from sp_dagster.engine.runtime import AppRuntime
from sp_dagster.engine.values import coerce, f32, java_class
from sp_dagster.errors import SpDagsterError
from sp_dagster.siddhi import SiddhiQLError


@dataclass
class Case:
    """One conformance case."""

    id: str
    category: str
    app: str
    inputs: list[dict]
    expected: dict
    notes: str = ""

    @classmethod
    def from_json(cls, data: dict) -> Case:
        """A case from one parsed JSON line."""
        return cls(data["id"], data.get("category", ""), data["app"], data["inputs"], data["expected"], data.get("notes", ""))


@dataclass
class Outcome:
    """What replaying a case produced, and whether it matched."""

    id: str
    passed: bool
    in_events: list = field(default_factory=list)
    remove_events: list = field(default_factory=list)
    types: list | None = None
    remove_types: list | None = None
    invocations: int = 0
    differences: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict:
        """The `--json` form: id, passed, actual events and types, error."""
        return {
            "id": self.id,
            "passed": self.passed,
            "actual": {
                "in_events": self.in_events,
                "remove_events": self.remove_events,
                "types": self.types,
                "remove_types": self.remove_types,
                "callback_invocations": self.invocations,
            },
            "error": self.error if self.error is not None else ("; ".join(self.differences) or None),
        }


def load_cases(path: str | Path) -> list[Case]:
    """Every case of a JSONL file (EngineError on a malformed line)."""
    cases = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                cases.append(Case.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise EngineError(f"{path}:{number}: not a conformance case: {exc}") from None
    return cases


class _Recorder:
    def __init__(self):
        self.in_events: list = []
        self.remove_events: list = []
        self.in_kinds: list[list] = []
        self.invocations = 0

    def query(self, timestamp, in_events, remove_events):
        self.invocations += 1
        for event in in_events or ():
            self.in_events.append(list(event.data))
        for event in remove_events or ():
            self.remove_events.append(list(event.data))

    def stream(self, events):
        self.invocations += 1
        for event in events:
            self.in_events.append(list(event.data))


def replay(case: Case, restore_at: int | None = None) -> tuple[_Recorder, list[str]]:
    """Run one case; return what the observer saw and the output attribute types.

    With `restore_at`, the runtime is snapshotted before input `restore_at` is sent, shut
    down, and a fresh runtime restored from the snapshot receives the rest.
    """
    recorder = _Recorder()
    kind, _, name = case.expected["callback"].partition(":")

    def start() -> tuple[AppRuntime, list[str]]:
        runtime = AppRuntime(case.app)
        if kind == "query":
            runtime.add_query_callback(name, recorder.query)
            return runtime, list(runtime.query_schema(name).types)
        runtime.add_callback(name, recorder.stream)
        return runtime, list(runtime.schema(name).types)

    runtime, types = start()
    try:
        for index, event in enumerate(case.inputs):
            if index == restore_at:
                state = runtime.snapshot()
                runtime.shutdown()
                runtime, types = start()
                runtime.restore(state)
            schema = runtime.schema(event["stream"])
            row = [coerce(value, kind) for value, kind in zip(event["data"], schema.types)]
            timestamp = event.get("timestamp")
            runtime.send(event["stream"], [row], None if timestamp is None else [timestamp])
    finally:
        runtime.shutdown()
    return recorder, types


def column_types(rows: list[list], kinds: list[str]) -> list[str] | None:
    """Java class per column: that of the first non-null value in the column ('null' if none)."""
    if not rows:
        return None
    result = []
    for index, kind in enumerate(kinds):
        value = next((row[index] for row in rows if row[index] is not None), None)
        result.append(java_class(value, kind))
    return result


def same_value(actual: Any, expected: Any, java_type: str | None) -> bool:
    """Compare one value as the conformance rules say (by the expected Java type)."""
    if expected is None or actual is None:
        return expected is None and actual is None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if java_type == "Float":
            return f32(float(actual)) == f32(float(expected)) or (math.isnan(actual) and math.isnan(expected))
        if java_type == "Double" or isinstance(expected, float) or isinstance(actual, float):
            a, e = float(actual), float(expected)
            if math.isnan(a) or math.isnan(e):
                return math.isnan(a) and math.isnan(e)
            return a == e or abs(a - e) <= 1e-9 * max(abs(a), abs(e))
        return actual == expected
    return actual == expected


def _same_row(actual: list, expected: list, types: list | None) -> bool:
    if len(actual) != len(expected):
        return False
    return all(same_value(a, e, types[i] if types and i < len(types) else None) for i, (a, e) in enumerate(zip(actual, expected)))


def _compare_rows(what: str, actual: list, expected: list, types: list | None, ordered: bool) -> list[str]:
    if ordered:
        diffs = []
        for index in range(max(len(actual), len(expected))):
            a = actual[index] if index < len(actual) else "<missing>"
            e = expected[index] if index < len(expected) else "<missing>"
            if not (isinstance(a, list) and isinstance(e, list) and _same_row(a, e, types)):
                diffs.append(f"{what}[{index}]: expected {e}, got {a}")
        return diffs
    unmatched = list(actual)
    missing = []
    for row in expected:
        match = next((i for i, a in enumerate(unmatched) if _same_row(a, row, types)), None)
        if match is None:
            missing.append(row)
        else:
            unmatched.pop(match)
    diffs = [f"{what}: expected (any order) {row}, not delivered" for row in missing]
    diffs += [f"{what}: unexpected {row}" for row in unmatched]
    return diffs


def run_case(case: Case, restore_at: int | None = None) -> Outcome:
    """Replay and compare one case (optionally through a snapshot and restore, see replay)."""
    try:
        recorder, kinds = replay(case, restore_at)
    except SiddhiQLError as exc:
        return Outcome(case.id, False, error=f"app rejected: {exc}")
    except SpDagsterError as exc:
        return Outcome(case.id, False, error=str(exc))
    expected = case.expected
    in_types = column_types(recorder.in_events, kinds)
    remove_types = column_types(recorder.remove_events, kinds)
    outcome = Outcome(
        case.id,
        True,
        _plain(recorder.in_events),
        _plain(recorder.remove_events),
        in_types,
        remove_types,
        recorder.invocations,
    )
    ordered = expected.get("ordered", True)
    diffs = _compare_rows("in_events", recorder.in_events, expected.get("in_events") or [], expected.get("types"), ordered)
    diffs += _compare_rows(
        "remove_events", recorder.remove_events, expected.get("remove_events") or [], expected.get("remove_types"), ordered
    )
    if expected.get("types") is not None and in_types != expected["types"]:
        diffs.append(f"types: expected {expected['types']}, got {in_types}")
    if expected.get("remove_types") is not None and remove_types != expected["remove_types"]:
        diffs.append(f"remove_types: expected {expected['remove_types']}, got {remove_types}")
    wanted_invocations = expected.get("callback_invocations")
    if wanted_invocations is not None and recorder.invocations != wanted_invocations:
        diffs.append(f"callback_invocations: expected {wanted_invocations}, got {recorder.invocations}")
    outcome.differences = diffs
    outcome.passed = not diffs
    return outcome


def _plain(rows: list[list]) -> list[list]:
    return [[v if not (isinstance(v, float) and not math.isfinite(v)) else str(v) for v in row] for row in rows]


def run_file(path: str | Path, only: str | None = None) -> Iterator[Outcome]:
    """Replay every case of a file (or just the one with id `only`)."""
    cases = load_cases(path)
    if only is not None:
        cases = [c for c in cases if c.id == only]
        if not cases:
            raise EngineError(f"{path} has no case '{only}'")
    for case in cases:
        yield run_case(case)


def summary(outcomes: list[Outcome]) -> str:
    """`N passed, N failed`."""
    passed = sum(1 for o in outcomes if o.passed)
    return f"{passed} passed, {len(outcomes) - passed} failed"
