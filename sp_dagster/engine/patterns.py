"""Patterns (`->`) and sequences (`,`): partial matches moved along a chain of states.

The state tree is flattened into steps (a stream state, possibly counted `<m:n>`, `+`, `*`,
`?`, or two stream states joined by `and`/`or`); `every` marks a group of steps that is
re-armed with a fresh partial match when a partial match leaves it (or expires inside it).
A partial match holds, per state, the events it has taken; a counted state shares its list
with the next step from the minimum count on, until that next step matches. In a pattern,
events that do not match are skipped; in a sequence, a partial match that an event does not
advance is dropped, and an `every` start is re-armed only when no partial match is under way.
`within` drops partial matches older than the limit (event time) before each event.
"""

from __future__ import annotations

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import CURRENT, StreamEvent, as_events
from sp_dagster.engine.expressions import Executor, Scope, compile_expression
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.windows.base import dump_events, load_events
from sp_dagster.siddhi import ast


class PatternEvent(StreamEvent):
    """A partial match as expressions see it: the events per state, and the one being tested."""

    __slots__ = ("slots", "candidate")

    def __init__(self, timestamp, slots, candidate=None, type=CURRENT):
        super().__init__(timestamp, None, type)
        self.slots = slots
        self.candidate = candidate


class _State:
    def __init__(self, node: ast.StreamState, slot: int, schema: Schema):
        self.node = node
        self.stream = node.stream.stream
        self.slot = slot
        self.schema = schema
        self.condition = None


class _Step:
    def __init__(self, kind: str, states: list[_State], low: int = 1, high: int | None = 1):
        self.kind = kind  # "one", "count", "and", "or"
        self.states = states
        self.low = low
        self.high = high


class _Partial:
    __slots__ = ("slots", "start")

    def __init__(self, slots: list[list], start: int | None = None):
        self.slots = slots
        self.start = start

    def copy(self) -> _Partial:
        return _Partial([list(s) for s in self.slots], self.start)


def compile_states(node: ast.StateInput, schemas: dict[str, Schema]):
    """(steps, every groups, states) of a pattern or sequence."""
    steps: list[_Step] = []
    groups: list[tuple[int, int]] = []
    states: list[_State] = []

    def state(element: ast.StreamState) -> _State:
        if any(not isinstance(h, ast.Filter) for h in element.stream.handlers):
            raise app_error("only filters can follow a stream in a pattern or sequence", element.stream)
        result = _State(element, len(states), schemas[element.stream.stream])
        states.append(result)
        return result

    def walk(element) -> None:
        if isinstance(element, ast.StateChain):
            for item in element.elements:
                walk(item)
        elif isinstance(element, ast.EveryState):
            start = len(steps)
            walk(element.element)
            groups.append((start, len(steps) - 1))
        elif isinstance(element, ast.LogicalState):
            if not isinstance(element.left, ast.StreamState) or not isinstance(element.right, ast.StreamState):
                raise app_error("'and'/'or' joins two stream states here", element)
            steps.append(_Step(element.op, [state(element.left), state(element.right)]))
        elif isinstance(element, ast.StreamState):
            quantifier = element.quantifier
            if quantifier is None:
                steps.append(_Step("one", [state(element)]))
            else:
                steps.append(_Step("count", [state(element)], quantifier.min or 0, quantifier.max))
        else:
            raise app_error("absent states (not ... for) are not supported by the engine yet (issue 9)", element)

    walk(node.element)
    return steps, groups, states


class PatternScope(Scope):
    """Names in a pattern: `e1.x`, `e2[last].x`, `e1[0].x`, bare `x` (the event under test)."""

    def __init__(self, states: list[_State], own: _State | None, context=None, aggregation=None):
        super().__init__(context, aggregation)
        self.states = states
        self.own = own
        self.by_name: dict[str, _State] = {}
        for s in states:
            for name in filter(None, (s.node.event, s.stream)):
                self.by_name.setdefault(name, s)

    def variable(self, node: ast.Variable) -> Executor:
        if node.stream is None:
            if self.own is not None and self.own.schema.index(node.name) is not None:
                return _candidate(self.own.schema, node.name)
            target = next((s for s in self.states if s.schema.index(node.name) is not None), None)
            index = None
        else:
            target = self.by_name.get(node.stream)
            index = node.index
            if target is None:
                raise app_error(f"'{node.stream}' is not a state of this pattern", node)
            if index is None and target is self.own:
                if target.schema.index(node.name) is None:
                    raise app_error(f"'{node.stream}' has no attribute '{node.name}'", node)
                return _candidate(target.schema, node.name)
        if target is None or target.schema.index(node.name) is None:
            raise app_error(f"no state of this pattern has attribute '{node.name}'", node)
        position = target.schema.index(node.name)
        kind = target.schema.types[position]
        slot = target.slot

        def row(e):
            event = _pick(e.slots[slot], index)
            return event.data[position] if event is not None else None

        return Executor(kind, row)

    def event_ref(self, node) -> Executor | None:
        """An executor for `e1` / `e2[last]` (the event itself, or None), else None."""
        if isinstance(node, ast.StreamRef):
            name, index = node.stream, node.index
        elif isinstance(node, ast.Variable) and node.stream is None and node.name in self.by_name:
            name, index = node.name, None
        else:
            return None
        target = self.by_name.get(name)
        if target is None:
            raise app_error(f"'{name}' is not a state of this pattern", node)
        slot = target.slot
        return Executor("object", lambda e: _pick(e.slots[slot], index))


def _candidate(schema: Schema, name: str) -> Executor:
    position = schema.index(name)
    return Executor(schema.types[position], lambda e: e.candidate.data[position])


def _pick(events: list, index):
    if not events:
        return None
    if index is None:
        return events[-1]
    if isinstance(index, ast.Last):
        k = len(events) - 1 - index.offset
        return events[k] if k >= 0 else None
    return events[index] if index < len(events) else None


class PatternProcessor(Processor):
    """Runs the partial matches of one pattern or sequence and emits each completed match."""

    def __init__(self, node: ast.StateInput, schemas: dict[str, Schema], context):
        self.sequence = node.kind == "sequence"
        self.within = node.within.millis if node.within is not None else None
        self.steps, groups, self.states = compile_states(node, schemas)
        for s in self.states:
            for handler in s.node.stream.handlers:
                condition = compile_expression(handler.condition, PatternScope(self.states, s, context)).row
                previous = s.condition
                s.condition = condition if previous is None else _both(previous, condition)
        self.group_at_start = {start: end for start, end in groups}
        self.group_ending = {end: start for start, end in groups}
        self.group_of = {}
        for start, end in groups:
            for i in range(start, end + 1):
                self.group_of.setdefault(i, start)
        self.streams = sorted({s.stream for s in self.states})
        self.pending: list[tuple[_Partial, int]] = []
        self._arm(_Partial([[] for _ in self.states]), 0, self.pending, [])

    def scope(self, context) -> PatternScope:
        """The scope of the selector: every state by alias."""
        return PatternScope(self.states, None, context)

    # -- matching

    def _arm(self, partial: _Partial, step: int, into: list, out: list) -> None:
        """Put `partial` at `step` (emitting it when past the last step)."""
        if step == len(self.steps):
            out.append(partial)
            return
        if not any(p is partial and i == step for p, i in into):
            into.append((partial, step))
        if self.steps[step].kind == "count" and self.steps[step].low == 0 and not partial.slots[self.steps[step].states[0].slot]:
            self._arm(partial, step + 1, into, out)

    def _fresh(self, partial: _Partial, start: int) -> _Partial:
        fresh = partial.copy()
        for step in self.steps[start:]:
            for s in step.states:
                fresh.slots[s.slot] = []
        if start == 0:
            fresh.start = None
        return fresh

    def _matches(self, state: _State, partial: _Partial, event: StreamEvent, stream: str) -> bool:
        if state.stream != stream:
            return False
        if state.condition is None:
            return True
        return state.condition(PatternEvent(event.timestamp, partial.slots, event)) is True

    def _is_fresh(self, partial: _Partial) -> bool:
        return not any(partial.slots)

    def receive_event(self, stream: str, event: StreamEvent) -> list[_Partial]:
        """Advance the partial matches with one event; return the completed ones."""
        now = event.timestamp
        pending, rearm = [], []
        for partial, step in self.pending:
            if self.within is not None and partial.start is not None and now - partial.start > self.within:
                start = self.group_of.get(step)
                if start is not None and start < len(self.steps) and self._outside_start(partial, start):
                    rearm.append((self._fresh(partial, start), start))
                continue
            pending.append((partial, step))
        for partial, step in rearm:
            if not any(p is partial for p, _ in pending):
                pending.append((partial, step))
        out: list[_Partial] = []
        kept: list[tuple[_Partial, int]] = []
        moved: set[int] = set()
        if not self.sequence:
            self._step_all(pending, event, stream, kept, out, moved)
        else:
            busy = [(p, i) for p, i in pending if not self._is_fresh(p)]
            fresh = [(p, i) for p, i in pending if self._is_fresh(p)]
            self._step_all(busy, event, stream, kept, out, moved)
            if any(not self._is_fresh(p) for p, _ in kept):
                kept.extend(fresh)
            else:
                self._step_all(fresh, event, stream, kept, out, moved)
            if 0 in self.group_at_start and not any(i == 0 and self._is_fresh(p) for p, i in kept):
                self._arm(_Partial([[] for _ in self.states]), 0, kept, [])
        self.pending = kept
        return out

    def _step_all(self, entries, event, stream, kept, out, moved) -> None:
        decisions = [self._decide(partial, step, event, stream) for partial, step in entries]
        for (partial, step), matched in zip(entries, decisions):
            if id(partial) in moved:
                continue
            if matched is None:
                if not self.sequence or self._is_fresh(partial):
                    kept.append((partial, step))
                continue
            self._advance(partial, step, matched, event, kept, out, moved)

    def _rearm(self, partial: _Partial, end: int, kept: list) -> None:
        start = self.group_ending[end]
        if not (self.sequence and start == 0):  # a sequence keeps one fresh start itself
            kept.append((self._fresh(partial, start), start))

    def _outside_start(self, partial: _Partial, start: int) -> bool:
        return any(partial.slots[s.slot] for s in self.steps[start].states)

    def _decide(self, partial: _Partial, step: int, event: StreamEvent, stream: str):
        current = self.steps[step]
        for state in current.states:
            if current.kind == "and" and partial.slots[state.slot]:
                continue
            if self._matches(state, partial, event, stream):
                return state
        return None

    def _advance(self, partial, step, state, event, kept, out, moved) -> None:
        current = self.steps[step]
        if current.kind == "count":
            partial.slots[state.slot].append(event)
            if partial.start is None:
                partial.start = event.timestamp
            count = len(partial.slots[state.slot])
            if current.high is None or count < current.high:
                kept.append((partial, step))
            if count >= current.low:
                if self.sequence or count == current.low:
                    self._arm(partial, step + 1, kept, out)
            return
        if step > 0 and self.steps[step - 1].kind == "count":
            moved.add(id(partial))
            kept[:] = [(p, i) for p, i in kept if p is not partial]
            if step - 1 in self.group_ending:
                self._rearm(partial, step - 1, kept)
        if current.kind == "and":
            target = partial
            target.slots[state.slot] = [event]
            if target.start is None:
                target.start = event.timestamp
            if not all(target.slots[s.slot] for s in current.states):
                kept.append((target, step))
                return
        else:
            target = partial.copy()
            target.slots[state.slot] = [event]
            if target.start is None:
                target.start = event.timestamp
        self._arm(target, step + 1, kept, out)
        if step in self.group_ending:
            self._rearm(target, step, kept)

    def process(self, chunk):
        raise NotImplementedError  # fed per stream by PatternInput

    # -- state

    def snapshot(self):
        partials, index, entries = [], {}, []
        for partial, step in self.pending:
            if id(partial) not in index:
                index[id(partial)] = len(partials)
                partials.append([partial.start, [dump_events(s) for s in partial.slots]])
            entries.append((index[id(partial)], step))
        return [partials, entries]

    def restore(self, state) -> None:
        partials = [_Partial([load_events(s) for s in slots], start) for start, slots in state[0]]
        self.pending = [(partials[i], step) for i, step in state[1]]


def _both(first, second):
    return lambda e: first(e) is True and second(e) is True


class PatternInput:
    """Receives one input stream of a pattern and sends completed matches to the selector."""

    def __init__(self, processor: PatternProcessor, stream: str, selector):
        self.processor = processor
        self.stream = stream
        self.selector = selector
        self.together = len(processor.streams) == 1  # one stream: a match chunk per event
    def receive(self, chunk) -> None:
        """Feed each event of the chunk to the pattern, in order."""
        for event in as_events(chunk):
            matches = []
            for partial in self.processor.receive_event(self.stream, event):
                last = max((e.timestamp for s in partial.slots for e in s), default=event.timestamp)
                matches.append(PatternEvent(last, partial.slots))
                if not self.together:
                    self.selector.process(matches)
                    matches = []
            if matches:
                self.selector.process(matches)
