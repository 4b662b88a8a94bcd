"""Patterns (`->`) and sequences (`,`): partial matches moved along a chain of states.
compile_states flattens the state tree into steps; PatternProcessor moves partial matches along
them with Siddhi's rules for `every`, `within`, counted states and absent states (`not S for T`),
which docs/concepts/engine.md lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

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
    def __init__(self, node: ast.StreamState | ast.AbsentState, slot: int, schema: Schema):
        self.node = node
        self.stream = node.stream.stream
        self.slot = slot
        self.schema = schema
        self.condition: Callable[[PatternEvent], object] | None = None
        self.absent = isinstance(node, ast.AbsentState)
        self.event: str | None
        self.waiting: int | None
        if isinstance(node, ast.AbsentState):
            self.event = None
            self.waiting = node.waiting.millis if node.waiting is not None else None
        else:
            self.event = node.event
            self.waiting = None


class _Step:
    def __init__(self, kind: str, states: list[_State], low: int = 1, high: int | None = 1):
        self.kind = kind  # "one", "count", "and", "or"
        self.states = states
        self.low = low
        self.high = high
        self.absent = [s for s in states if s.absent]  # absent states ("absent", or a side of and/or)
        self.present = [s for s in states if not s.absent]


#: What an absent state of a partial match waits for: a deadline (int), or these marks.
DONE, DEAD = "done", "dead"  # the quiet period has passed / the state's `or` branch was killed
#: A partial's waits on an absent step: absent state slot -> deadline, DONE or DEAD.
Waits = dict[int, int | str]


class Partial:
    """Events per state; `start` for within, `time` of the last step taken (None: not begun),
    `waits` (absent state slot -> deadline, DONE or DEAD) on an absent step, and `seen`, the
    events a sequence partial has lived through on an absent step.

    A counted state shares its list of events with the next step from the minimum count on,
    until that next step matches."""

    __slots__ = ("slots", "start", "time", "waits", "seen")

    def __init__(self, slots: list[list], start: int | None = None, time: int | None = None, waits: Waits | None = None, seen: int = 0):
        self.slots = slots
        self.start = start
        self.time = time
        self.waits = waits
        self.seen = seen

    def copy(self) -> Partial:
        return Partial([list(s) for s in self.slots], self.start, self.time, dict(self.waits) if self.waits else None, self.seen)


def compile_states(node: ast.StateInput, schemas: dict[str, Schema]):
    """(steps, every groups, states) of a pattern or sequence.

    A step is a stream state, possibly counted (`<m:n>`, `+`, `*`, `?`), an absent state, or two
    states joined by `and`/`or`; an every group is the (first, last) step `every` marks.
    """
    steps: list[_Step] = []
    groups: list[tuple[int, int]] = []
    states: list[_State] = []

    def state(element: ast.StreamState | ast.AbsentState) -> _State:
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
            left, right = element.left, element.right
            if not isinstance(left, (ast.StreamState, ast.AbsentState)) or not isinstance(right, (ast.StreamState, ast.AbsentState)):
                raise app_error("'and'/'or' joins two stream states here", element)
            steps.append(_Step(element.op, [state(left), state(right)]))
        elif isinstance(element, ast.AbsentState):
            steps.append(_Step("absent", [state(element)]))
        elif isinstance(element, ast.StreamState):
            quantifier = element.quantifier
            if quantifier is None:
                steps.append(_Step("one", [state(element)]))
            else:
                steps.append(_Step("count", [state(element)], quantifier.min or 0, quantifier.max))
        else:
            raise app_error(f"unexpected pattern element {type(element).__name__}", element)

    walk(node.element)
    return steps, groups, states


class PatternScope(Scope):
    """Names in a pattern: `e1.x`, `e2[last].x`, `e1[0].x`, bare `x` (the event under test).

    A counted state named without an index is its last event in a state's condition (the event
    the match has reached there) and its first in the selector, as Siddhi resolves them."""

    def __init__(self, states: list[_State], own: _State | None, context=None, aggregation=None):
        super().__init__(context, aggregation)
        self.states = states
        self.own = own
        self.unindexed: ast.EventIndex = ast.Last() if own is not None else 0
        self.by_name: dict[str, _State] = {}
        for s in states:
            for name in filter(None, (s.event, s.stream)):
                self.by_name.setdefault(name, s)

    def variable(self, node: ast.Variable) -> Executor:
        if node.stream is None:
            if self.own is not None and self.own.schema.index(node.name) is not None:
                return _candidate(self.own.schema, node.name)
            target = next((s for s in self.states if not s.absent and s.schema.index(node.name) is not None), None)
            index = self.unindexed
        else:
            target = self.by_name.get(node.stream)
            index = self.unindexed if node.index is None else node.index
            if target is None:
                raise app_error(f"'{node.stream}' is not a state of this pattern", node)
            if node.index is None and target is self.own:
                if target.schema.index(node.name) is None:
                    raise app_error(f"'{node.stream}' has no attribute '{node.name}'", node)
                return _candidate(target.schema, node.name)
        position = target.schema.index(node.name) if target is not None else None
        if target is None or position is None:
            raise app_error(f"no state of this pattern has attribute '{node.name}'", node)
        kind = target.schema.types[position]
        slot = target.slot

        def row(e):
            event = _pick(e.slots[slot], index)
            return event.data[position] if event is not None else None

        return Executor(kind, row)

    def event_ref(self, node) -> Executor | None:
        """An executor for `e1` / `e2[last]` (the event itself, or None), else None."""
        if isinstance(node, ast.StreamRef):
            name, index = node.stream, self.unindexed if node.index is None else node.index
        elif isinstance(node, ast.Variable) and node.stream is None and node.name in self.by_name:
            name, index = node.name, self.unindexed
        else:
            return None
        target = self.by_name.get(name)
        if target is None:
            raise app_error(f"'{name}' is not a state of this pattern", node)
        slot = target.slot
        return Executor("object", lambda e: _pick(e.slots[slot], index))


def _candidate(schema: Schema, name: str) -> Executor:
    position = schema.index(name)
    assert position is not None  # the callers have found `name` in the schema
    return Executor(schema.types[position], lambda e: e.candidate.data[position])


def _pick(events: list, index: ast.EventIndex):
    """The event at `index` of a state's events (None when it has none there)."""
    if not events:
        return None
    if isinstance(index, ast.Last):
        k = len(events) - 1 - index.offset
        return events[k] if k >= 0 else None
    return events[index] if index < len(events) else None


class PatternProcessor(Processor):
    """Runs the partial matches of one pattern or sequence and emits each completed match."""

    def __init__(self, node: ast.StateInput, schemas: dict[str, Schema], context, schedulers=None):
        self.sequence = node.kind == "sequence"
        self.within = node.within.millis if node.within is not None else None
        self.steps, groups, self.states = compile_states(node, schemas)
        for s in self.states:
            for handler in s.node.stream.handlers:
                assert isinstance(handler, ast.Filter)  # compile_states lets only filters follow a state's stream
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
        self.selector: Processor | None = None  # where matches completed by a timer go (PatternInput sets it)
        self.clock = context.clock
        self.now = self.clock.now()  # the time being processed: an event's, a timer's, or the start
        self.step_of = {s.slot: i for i, step in enumerate(self.steps) for s in step.states}
        self.absent_at = [bool(step.absent) for step in self.steps]
        # one timer queue per timed absent state, as Siddhi has a scheduler per absent processor
        self.timers = {}
        for s in self.states:
            if s.waiting is not None:
                assert schedulers is not None  # a query with a timed absent state is given its schedulers
                scheduler = schedulers("pattern")
                self.timers[s.slot] = scheduler.queue(lambda when, slot=s.slot: self._on_timer(slot, when))
        self.pending: list[tuple[Partial, int]] = []
        self._arm(Partial([[] for _ in self.states]), 0, self.pending, [])

    def scope(self, context) -> PatternScope:
        """The scope of the selector: every state by alias."""
        return PatternScope(self.states, None, context)

    # -- matching

    def _arm(self, partial: Partial, step: int, into: list, out: list) -> None:
        """Put `partial` at `step` (emitting it when past the last step)."""
        if step == len(self.steps):
            out.append(partial)
            return
        current = self.steps[step]
        if current.absent:
            partial = self._waiting(partial, current)
        if not any(p is partial and i == step for p, i in into):
            into.append((partial, step))
        if current.kind == "count" and current.low == 0 and not partial.slots[current.states[0].slot]:
            self._arm(partial, step + 1, into, out)

    def _waiting(self, partial: Partial, current: _Step) -> Partial:
        """A copy of `partial` waiting on an absent step: a deadline (and timer) per timed state.

        The deadline is `now` (the engine clock then) + T, as in Siddhi's
        AbsentStreamPreStateProcessor and AbsentLogicalPreStateProcessor.
        """
        waiting = partial.copy()
        waiting.waits = {}
        waiting.seen = 0
        for s in current.absent:
            if s.waiting is not None:
                deadline = self.now + s.waiting
                waiting.waits[s.slot] = deadline
                queue = self.timers[s.slot]
                if not queue.times or queue.times[-1] != deadline:
                    queue.notify_at(deadline)
        return waiting

    def _place(self, partial: Partial, step: int, into: list) -> None:
        """Re-arm `partial` at `step` (an every group's start)."""
        if self.steps[step].absent:
            self._arm(partial, step, into, [])
        else:
            into.append((partial, step))

    def _fresh(self, partial: Partial, start: int) -> Partial:
        fresh = partial.copy()
        for step in self.steps[start:]:
            for s in step.states:
                fresh.slots[s.slot] = []
        if start == 0:
            fresh.start = None
            fresh.time = None
        return fresh

    def _matches(self, state: _State, partial: Partial, event: StreamEvent, stream: str) -> bool:
        if state.stream != stream:
            return False
        if state.condition is None:
            return True
        return state.condition(PatternEvent(event.timestamp, partial.slots, event)) is True

    def is_fresh(self, partial: Partial) -> bool:
        """True for a partial match that has taken no step yet."""
        return partial.time is None and not any(partial.slots)

    def receive_event(self, stream: str, event: StreamEvent) -> list[Partial]:
        """Advance the partial matches with one event; return the completed ones."""
        if self.timers:
            self._fire_due()
        now = self.now = event.timestamp
        pending, rearm = [], []
        for partial, step in self.pending:
            if self.within is not None and partial.start is not None and now - partial.start > self.within:
                self._expired(partial, step, rearm)
                continue
            pending.append((partial, step))
        for partial, step in rearm:
            if not any(p is partial for p, _ in pending):
                pending.append((partial, step))
        out: list[Partial] = []
        kept: list[tuple[Partial, int]] = []
        moved: set[int] = set()
        if not self.sequence:
            self._step_all(pending, event, stream, kept, out, moved)
        else:
            busy = [(p, i) for p, i in pending if not self.is_fresh(p)]
            fresh = [(p, i) for p, i in pending if self.is_fresh(p) and not self.steps[i].absent]
            quiet = [(p, i) for p, i in pending if self.is_fresh(p) and self.steps[i].absent]
            self._step_all(busy, event, stream, kept, out, moved)
            self._step_all(quiet, event, stream, kept, out, moved)
            self._step_all(fresh, event, stream, kept, out, moved)
            kept = self._one_per_step(kept)
            self._keep_start(kept)
        self.pending = kept
        return out

    def _one_per_step(self, kept: list) -> list:
        """A sequence's step holds one partial match: when a new start lands on a step an older
        partial still holds (a counted step it keeps taking), the older one stays (Siddhi's
        sequence addState replaces, the older partial is placed last)."""
        held: set[int] = set()
        one = []
        for partial, step in kept:
            if step and not self.steps[step].absent and not self.is_fresh(partial):
                if step in held:
                    continue
                held.add(step)
            one.append((partial, step))
        return one

    def _keep_start(self, kept: list) -> None:
        """A sequence under `every` keeps one fresh partial at its first step."""
        if self.sequence and 0 in self.group_at_start and not any(i == 0 and self.is_fresh(p) for p, i in kept):
            self._arm(Partial([[] for _ in self.states]), 0, kept, [])

    def _expired(self, partial: Partial, step: int, rearm: list) -> None:
        """`partial` is older than `within`: an every group it began inside starts again."""
        start = self.group_of.get(step)
        if start is not None and start < len(self.steps) and self._outside_start(partial, start):
            self._place(self._fresh(partial, start), start, rearm)

    def _step_all(self, entries, event, stream, kept, out, moved) -> None:
        decisions = [self._decide(partial, step, event, stream) for partial, step in entries]
        absent = self.absent_at
        # a partial on several steps (a counted one and those after it) takes the event at the
        # furthest step it matches; its branches behind end there
        furthest: dict[int, int] = {}
        for (partial, step), matched in zip(entries, decisions):
            if matched is not None and not absent[step] and furthest.get(id(partial), -1) < step:
                furthest[id(partial)] = step
        for (partial, step), matched in zip(entries, decisions):
            if id(partial) in moved:
                continue
            if absent[step]:
                self._step_absent(partial, step, matched, event, kept, out)
                continue
            if matched is None:
                # a sequence without `every` must begin with the first event: its start dies too
                if not self.sequence or (self.is_fresh(partial) and 0 in self.group_at_start):
                    kept.append((partial, step))
                continue
            if furthest[id(partial)] == step:
                self._advance(partial, step, matched, event, kept, out, moved)

    def _rearm(self, partial: Partial, end: int, kept: list) -> None:
        start = self.group_ending[end]
        if not (self.sequence and start == 0):  # a sequence keeps one fresh start itself
            self._place(self._fresh(partial, start), start, kept)

    def _outside_start(self, partial: Partial, start: int) -> bool:
        return any(partial.slots[s.slot] for s in self.steps[start].states)

    def _decide(self, partial: Partial, step: int, event: StreamEvent, stream: str):
        current = self.steps[step]
        if current.absent:
            return self._decide_absent(partial, current, event, stream)
        for state in current.states:
            if current.kind == "and" and partial.slots[state.slot]:
                continue
            if self._matches(state, partial, event, stream):
                return state
        return None

    def _decide_absent(self, partial: Partial, current: _Step, event: StreamEvent, stream: str):
        waits = cast(Waits, partial.waits)  # a partial on an absent step has its waits
        for state in current.states:
            if state.absent:
                if waits.get(state.slot) in (DONE, DEAD):
                    continue  # its quiet period is over, or its branch is dead
            elif current.kind == "and" and partial.slots[state.slot]:
                continue
            if self._matches(state, partial, event, stream):
                return state
        return None

    def _advance(self, partial, step, state, event, kept, out, moved) -> None:
        current = self.steps[step]
        counted = current.kind == "count"
        copied = False
        if step > 0 and self.steps[step - 1].kind == "count" and not (counted and partial.slots[state.slot]):
            # leaving a counted step (its list was shared with this one until now): it ends there
            moved.add(id(partial))
            kept[:] = [(p, i) for p, i in kept if p is not partial]
            if step - 1 in self.group_ending:
                self._rearm(partial, step - 1, kept)
            partial, copied = partial.copy(), True
        if counted:
            partial.slots[state.slot].append(event)
            partial.time = event.timestamp
            if partial.start is None:
                partial.start = event.timestamp
            count = len(partial.slots[state.slot])
            if current.high is None or count < current.high:
                kept.append((partial, step))
            if count >= current.low:
                if self.sequence or count == current.low or copied:  # a copy entering is on no later step yet
                    self._arm(partial, step + 1, kept, out)
            return
        target = partial if current.kind == "and" or copied else partial.copy()
        target.slots[state.slot] = [event]
        target.time = event.timestamp
        if target.start is None:
            target.start = event.timestamp
        if current.kind == "and":
            # one event can be both sides of an `and` (Siddhi's sides take it one after the other)
            for other in current.states:
                if not target.slots[other.slot] and self._matches(other, target, event, state.stream):
                    target.slots[other.slot] = [event]
            if not all(target.slots[s.slot] for s in current.states):
                kept.append((target, step))
                return
        self._arm(target, step + 1, kept, out)
        if step in self.group_ending:
            self._rearm(target, step, kept)

    # -- absent steps

    def _step_absent(self, partial, step, matched, event, kept, out) -> None:
        """One event against a partial on a step with absent states."""
        current = self.steps[step]
        fresh = self.is_fresh(partial)
        lingering = self.sequence and not fresh
        if lingering and partial.seen:
            return  # a sequence has moved on past it (Siddhi's reset before each event)
        if matched is None:
            if lingering:
                partial.seen = 1
            kept.append((partial, step))
            return
        if matched.absent:  # an event that should not have come
            others = current.present or any(partial.waits.get(s.slot) != DEAD for s in current.absent if s is not matched)
            if current.kind == "or" and others:
                partial.waits[matched.slot] = DEAD  # only this branch of the `or` dies
                if lingering:
                    partial.seen = 1
                kept.append((partial, step))
            elif fresh and step == 0:
                self._restart(kept)
            return
        target = partial if current.kind == "and" else partial.copy()
        target.slots[matched.slot] = [event]
        target.time = event.timestamp
        if target.start is None:
            target.start = event.timestamp
        if current.kind == "and" and not self._complete(target, current):
            if lingering:
                target.seen = 1
            kept.append((target, step))
            return
        self._finish(target, step, kept, out)

    def _complete(self, partial: Partial, current: _Step) -> bool:
        """An `and` step with absent sides: every event side has come, every quiet period passed."""
        if not all(partial.slots[s.slot] for s in current.present):
            return False
        waits = cast(Waits, partial.waits)  # a partial on an absent step has its waits
        return all(s.waiting is None or waits.get(s.slot) == DONE for s in current.absent)

    def _finish(self, partial: Partial, step: int, kept: list, out: list) -> None:
        """`partial` has completed the absent step `step`: on to the next step (or out)."""
        partial.waits = None
        partial.seen = 0
        self._arm(partial, step + 1, kept, out)
        if step in self.group_ending:
            self._rearm(partial, step, kept)

    def _restart(self, kept: list) -> None:
        """A fresh first-step partial was killed: a pattern arms a new one from now (Siddhi
        re-arms a lone absent first state, and any first state under `every`); a sequence's
        `every` start is re-armed by _keep_start, else it stays dead."""
        if not self.sequence and (self.steps[0].kind == "absent" or 0 in self.group_at_start):
            self._arm(Partial([[] for _ in self.states]), 0, kept, [])

    def _fire_due(self) -> None:
        """Fire the deadlines the clock has passed (the wall clock's thread may lag an event)."""
        for queue in self.timers.values():
            if queue.times and queue.times[0] <= self.clock.now():
                queue.fire()

    def _on_timer(self, slot: int, when: int) -> None:
        """The deadline `when` of absent state `slot` has come: fire the partials due."""
        self.now = when
        at = self.step_of[slot]
        current = self.steps[at]
        entries = self.pending
        if self.sequence and any(i == at and not self.is_fresh(p) and not p.seen for p, i in entries):
            # a newer partial waits here: the older ones lived through an event (Siddhi resets them)
            entries = [(p, i) for p, i in entries if not (i == at and not self.is_fresh(p) and p.seen)]
        kept, out, rearm = [], [], []
        for partial, step in entries:
            waits = cast(Waits, partial.waits)  # read only on the absent step `at`, where it is set
            if step != at or not isinstance(deadline := waits.get(slot), int) or deadline > when:
                kept.append((partial, step))
                continue
            if self.within is not None and partial.start is not None and when - partial.start > self.within:
                self._expired(partial, step, rearm)
                continue
            waits[slot] = DONE
            if current.kind == "and" and not self._complete(partial, current):
                kept.append((partial, step))
                continue
            partial.time = when
            self._finish(partial, step, kept, out)
        for partial, step in rearm:
            if not any(p is partial for p, _ in kept):
                kept.append((partial, step))
        self._keep_start(kept)
        self.pending = kept
        if out:
            selector = self.selector
            assert selector is not None  # PatternInput sets it before the query runs
            for match in out:  # one chunk per match, as Siddhi sends each
                selector.process([PatternEvent(when, match.slots)])

    def process(self, chunk):
        raise NotImplementedError  # fed per stream by PatternInput

    # -- state

    def snapshot(self):
        partials, index, entries = [], {}, []
        for partial, step in self.pending:
            if id(partial) not in index:
                index[id(partial)] = len(partials)
                waits = None if partial.waits is None else sorted(partial.waits.items())
                partials.append([partial.start, [dump_events(s) for s in partial.slots], partial.time, waits, partial.seen])
            entries.append((index[id(partial)], step))
        timers = [[slot, queue.snapshot()] for slot, queue in self.timers.items()]
        return [partials, entries, timers]

    def restore(self, state) -> None:
        partials = []
        for saved in state[0]:
            start, slots, *more = saved  # snapshots from before absent states hold two fields
            time, waits, seen = more or (None, None, 0)
            partials.append(Partial([load_events(s) for s in slots], start, time, None if waits is None else dict(waits), seen))
        self.pending = [(partials[i], step) for i, step in state[1]]
        for slot, times in state[2] if len(state) > 2 else ():
            self.timers[slot].restore(times)

    def stop(self) -> None:
        for queue in self.timers.values():
            queue.scheduler.discard(queue)


def _both(first, second):
    return lambda e: first(e) is True and second(e) is True


class PatternInput:
    """Receives one input stream of a pattern and sends completed matches to the selector."""

    def __init__(self, processor: PatternProcessor, stream: str, selector):
        self.processor = processor
        self.stream = stream
        self.selector = selector
        self.together = len(processor.streams) == 1  # one stream: a match chunk per event
        processor.selector = selector

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
