"""Replay conformance cases (app, inputs, Siddhi's recorded output) and compare.
A case file is JSON lines (../shared/conformance/README.md); delivered events are compared with the
expected ones by Java type (same_value), as multisets where the case says the order is undefined.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sp_dagster.engine.aggregation.settings import property_settings
from sp_dagster.engine.errors import EngineError
from sp_dagster.engine.runtime import AppRuntime
from sp_dagster.engine.values import coerce, f32, java_class
from sp_dagster.errors import SpDagsterError
from sp_dagster.siddhi import SiddhiQLError


@dataclass
class Case:
    """One conformance case.

    The aggregation cases (../shared/conformance/aggregation/README.md) add on-demand retrievals
    run between inputs (`ondemand`), apps that must not build (`expected.app_error`), Siddhi
    properties (`siddhi_config`: shardId, partitionById, aggTimeZone) and several runtimes
    sharing one store (`runtimes`).
    """

    id: str
    category: str
    app: str
    inputs: list[dict]
    expected: dict
    notes: str = ""
    ondemand: list[dict] = field(default_factory=list)
    runtimes: list[dict] = field(default_factory=list)
    siddhi_config: dict | None = None

    @classmethod
    def from_json(cls, data: dict) -> Case:
        """A case from one parsed JSON line."""
        return cls(
            data["id"],
            data.get("category", ""),
            data["app"],
            data["inputs"],
            data["expected"],
            data.get("notes", ""),
            data.get("ondemand") or [],
            data.get("runtimes") or [],
            data.get("siddhi_config"),
        )


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
    ondemand: list[dict] = field(default_factory=list)
    app_error: str | None = None

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
                "ondemand": self.ondemand,
                "app_error": self.app_error,
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


@dataclass
class _Replay:
    """The runtimes of one case while it is replayed."""

    case: Case
    recorder: _Recorder
    connections: Any
    runtimes: dict = field(default_factory=dict)
    types: list = field(default_factory=list)

    def specs(self) -> list[dict]:
        return self.case.runtimes or [{"name": None}]

    def start(self) -> dict:
        """Build every runtime of the case and attach the observer (SiddhiQLError when one does not build)."""
        runtimes = {}
        try:
            for spec in self.specs():
                config = spec.get("siddhi_config", self.case.siddhi_config) or {}
                properties = {**(config.get("system_configs") or {}), **(config.get("properties") or {})}
                runtimes[spec["name"]] = AppRuntime(spec.get("app") or self.case.app, connections=self.connections, **property_settings(properties))
        except BaseException:
            for runtime in runtimes.values():
                runtime.shutdown()
            raise
        callback = self.case.expected.get("callback")
        if callback:
            kind, _, name = callback.partition(":")
            runtime = self.runtime(runtimes, self.case.expected.get("callback_runtime"))
            if kind == "query":
                runtime.add_query_callback(name, self.recorder.query)
                self.types = list(runtime.query_schema(name).types)
            else:
                runtime.add_callback(name, self.recorder.stream)
                self.types = list(runtime.schema(name).types)
        return runtimes

    def runtime(self, runtimes: dict, name: str | None) -> AppRuntime:
        return runtimes[name] if name is not None else next(iter(runtimes.values()))

    def restart(self) -> None:
        """Snapshot every runtime, build fresh ones and restore them (the old ones stop last, so a
        shared in-memory store outlives the swap)."""
        states = {name: runtime.snapshot() for name, runtime in self.runtimes.items()}
        fresh = self.start()
        for name, runtime in fresh.items():
            runtime.restore(states[name])
        self.shutdown()
        self.runtimes = fresh

    def shutdown(self) -> None:
        for runtime in self.runtimes.values():
            runtime.shutdown()


def replay(case: Case, restore_at: int | None = None) -> tuple[_Recorder, list[str], list[dict]]:
    """Run one case; return what the observer saw, the output attribute types and the on-demand results.

    With `restore_at`, the runtimes are snapshotted before input `restore_at` is sent, and fresh
    runtimes restored from the snapshots receive the rest.
    """
    from sp_dagster.engine.store.rdbms import Connections

    state = _Replay(case, _Recorder(), Connections())  # one shared store per jdbc URL for the whole case
    state.runtimes = state.start()
    retrievals = sorted(enumerate(case.ondemand), key=lambda item: (item[1].get("after_input", len(case.inputs)), item[0]))
    results: list[dict] = [{} for _ in case.ondemand]
    try:
        for index in range(len(case.inputs) + 1):
            if index == restore_at and index < len(case.inputs):
                state.restart()
            for number, retrieval in retrievals:
                if retrieval.get("after_input", len(case.inputs)) == index:
                    results[number] = _retrieve(state.runtime(state.runtimes, retrieval.get("runtime")), retrieval)
            if index == len(case.inputs):
                break
            event = case.inputs[index]
            runtime = state.runtime(state.runtimes, event.get("runtime"))
            schema = runtime.schema(event["stream"])
            row = [coerce(value, kind) for value, kind in zip(event["data"], schema.types)]
            timestamp = event.get("timestamp")
            runtime.send(event["stream"], [row], None if timestamp is None else [timestamp])
    finally:
        state.shutdown()
    return state.recorder, state.types, results


def _retrieve(runtime: AppRuntime, retrieval: dict) -> dict:
    """Run one on-demand query of a case: its rows and types, or its error."""
    from sp_dagster.engine.ondemand import run_on_demand

    time = retrieval.get("time")
    try:
        if time is not None and time > runtime.clock.now():
            runtime.advance_time(time)
        with runtime.lock:
            result = run_on_demand(runtime, retrieval["query"])
    except (SiddhiQLError, SpDagsterError) as exc:
        return {"rows": None, "types": None, "error": str(exc)}
    rows = [list(event.data) for event in result.events]
    return {"rows": rows, "types": column_types(rows, list(result.schema.types)), "error": None}


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
    """Compare one value as the conformance rules say (by the expected Java type).

    Float as 32-bit, Double exactly or within 1e-9 relative, integers, strings and booleans
    exactly, null only with null.
    """
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
    expected = case.expected
    refused = expected.get("app_error")
    try:
        recorder, kinds, retrievals = replay(case, restore_at)
    except SiddhiQLError as exc:
        if refused:
            return Outcome(case.id, True, app_error=str(exc))
        return Outcome(case.id, False, error=f"app rejected: {exc}", app_error=str(exc))
    except SpDagsterError as exc:
        if refused:
            return Outcome(case.id, True, app_error=str(exc))
        return Outcome(case.id, False, error=str(exc))
    if refused:
        return Outcome(case.id, False, error=f"the app built, but Siddhi refuses it: {refused}")
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
        ondemand=[{**r, "rows": _plain(r["rows"]) if r.get("rows") is not None else None} for r in retrievals],
    )
    diffs: list[str] = []
    if expected.get("callback"):
        ordered = expected.get("ordered", True)
        diffs += _compare_rows("in_events", recorder.in_events, expected.get("in_events") or [], expected.get("types"), ordered)
        diffs += _compare_rows("remove_events", recorder.remove_events, expected.get("remove_events") or [], expected.get("remove_types"), ordered)
        if expected.get("types") is not None and in_types != expected["types"]:
            diffs.append(f"types: expected {expected['types']}, got {in_types}")
        if expected.get("remove_types") is not None and remove_types != expected["remove_types"]:
            diffs.append(f"remove_types: expected {expected['remove_types']}, got {remove_types}")
        wanted_invocations = expected.get("callback_invocations")
        if wanted_invocations is not None and recorder.invocations != wanted_invocations:
            diffs.append(f"callback_invocations: expected {wanted_invocations}, got {recorder.invocations}")
    for number, (wanted, got) in enumerate(zip(case.ondemand, retrievals)):
        diffs += _compare_retrieval(f"ondemand[{number}]", wanted, got)
    outcome.differences = diffs
    outcome.passed = not diffs
    return outcome


def _compare_retrieval(what: str, wanted: dict, got: dict) -> list[str]:
    """Differences between one expected on-demand result and what the runtime returned."""
    if wanted.get("expected_error"):
        return [] if got.get("error") else [f"{what}: expected it to fail ({wanted['expected_error']}), got {got.get('rows')}"]
    if got.get("error"):
        return [f"{what}: {wanted['query']!r} failed: {got['error']}"]
    expected_rows = wanted.get("expected_rows") or []
    diffs = _compare_rows(what, got["rows"], expected_rows, wanted.get("types"), wanted.get("ordered", True))
    if expected_rows and wanted.get("types") is not None and got["types"] != wanted["types"]:
        diffs.append(f"{what} types: expected {wanted['types']}, got {got['types']}")
    return diffs


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
