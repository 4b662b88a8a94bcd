"""What every window shares: parameter checking, its clock and timers, held events."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import overload

from sp_dagster.engine.clock import Clock, Scheduler, TimerQueue
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import EXPIRED, RESET, TIMER, StreamEvent
from sp_dagster.engine.expressions import Executor
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.siddhi import ast


@dataclass
class WindowContext:
    """What a window instance is given: the clock, its query's scheduler, what the output wants."""

    clock: Clock
    scheduler: Scheduler | None
    expects_expired: bool
    node: ast.Window
    schema: Schema
    findable: bool = False  # a join or named window looks into it: keep the last batch


@dataclass
class Param:
    """One window argument: its AST node and compiled executor."""

    node: ast.Expression
    executor: Executor


class WindowProcessor(Processor):
    """Base of the windows. `mode` is Siddhi's processing mode: slide, batch or group."""

    name = ""
    mode = "slide"
    uses_timers = False
    #: a kernel that holds this window's events column-wise (sp_dagster.engine.batch); the
    #: window calls settle() before it reads or changes them, which makes them events again
    pending = None

    def settle(self) -> None:
        """Take back the events a kernel holds for this window."""
        if self.pending is not None:
            self.pending.settle(self)

    def __init__(self, params: list[Param], context: WindowContext):
        self.params = params
        self.context = context
        self.clock = context.clock
        self.expects_expired = context.expects_expired
        self.timers: TimerQueue | None = None
        if self.uses_timers:
            assert context.scheduler is not None, "a window with timers is given its query's scheduler"
            self.timers = context.scheduler.queue(self.on_timer)
        self.configure()

    def configure(self) -> None:
        """Read and check the parameters (raise app errors)."""

    # -- parameter helpers

    def error(self, message: str, index: int | None = None):
        """A load error at the window, or at its parameter `index`."""
        node = self.params[index].node if index is not None and index < len(self.params) else self.context.node
        return app_error(f"{self.name} window: {message}", node)

    def arity(self, *allowed: int) -> None:
        """Check the number of parameters."""
        if len(self.params) not in allowed:
            wanted = " or ".join(str(n) for n in allowed)
            raise self.error(f"takes {wanted} parameter{'' if allowed == (1,) else 's'}, but found {len(self.params)}")

    def constant(self, index: int, types: tuple[str, ...], what: str):
        """The constant value of parameter `index`, which must have one of `types`."""
        param = self.params[index]
        if not param.executor.constant:
            raise self.error(f"{what} must be a constant", index)
        if param.executor.type not in types:
            raise self.error(f"{what} must be {' or '.join(types)}, but found {param.executor.type}", index)
        return param.executor.value

    def duration(self, index: int, what: str) -> int:
        """A time parameter: an int or long constant, or a time literal (ms)."""
        return self.constant(index, ("int", "long"), what)

    def attribute(self, index: int, types: tuple[str, ...], what: str) -> Executor:
        """A parameter that must be a stream attribute of one of `types`."""
        param = self.params[index]
        if not isinstance(param.node, ast.Variable):
            raise self.error(f"{what} must be a stream attribute", index)
        if param.executor.type not in types:
            raise self.error(f"{what} must be of type {' or '.join(types)}, but found {param.executor.type}", index)
        return param.executor

    # -- runtime

    def on_timer(self, when: int) -> None:
        """A scheduled time has come: process a TIMER event."""
        self.process([StreamEvent(when, None, TIMER)])

    def held(self) -> Iterable[StreamEvent]:
        """The events the window holds now (what joins and named windows look into)."""
        return ()

    def forward(self, chunk: list[StreamEvent]) -> None:
        """Pass a non-empty chunk on."""
        if chunk:
            self.next.process(chunk)

    def snapshot(self):
        state = self.dump()
        if self.timers is not None:
            state = {"window": state, "timers": self.timers.snapshot()}
        return state

    def restore(self, state) -> None:
        if self.timers is not None:
            self.timers.restore(state["timers"])
            state = state["window"]
        self.load(state)

    def dump(self):
        """The window's own plain-data state."""
        return None

    def load(self, state) -> None:
        """Inverse of dump()."""

    def stop(self) -> None:
        if self.timers is not None:
            self.timers.scheduler.discard(self.timers)


class BatchWindow(WindowProcessor):
    """Base of windows that emit batches: the open batch, the last one (to expire), a RESET."""

    mode = "batch"
    stream_current = False

    def start_batches(self) -> None:
        """Empty buffers (call from configure, once stream_current is known)."""
        self.current: list | None = None if self.stream_current else []
        self.expired: list | None = [] if (self.expects_expired or self.context.findable) else None
        self.reset = None

    def note(self, event: StreamEvent) -> None:
        """Remember a RESET for the open batch (from its first event)."""
        if self.reset is None:
            self.reset = event.copy(RESET)

    def flush(self, out: list, now: int, stamp_reset: bool = True) -> None:
        """Emit the previous batch as expired, a RESET, then the open batch as current."""
        if self.expects_expired and self.expired:
            for expired in self.expired:
                expired.timestamp = now
            out.extend(self.expired)
            self.expired = []
        if self.reset is not None:
            if stamp_reset:
                self.reset.timestamp = now
            out.append(self.reset)
            self.reset = None
        if self.current:
            if self.expired is not None:
                self.expired.extend(e.copy(EXPIRED) for e in self.current)
            out.extend(self.current)
            self.current = []

    def held(self):
        return self.expired or ()

    def dump_batches(self) -> list:
        """The buffers as plain data."""
        return [dump_events(self.current), dump_events(self.expired), dump_events([self.reset] if self.reset else [])]

    def load_batches(self, state: list) -> None:
        """Inverse of dump_batches()."""
        current, expired, reset = state
        self.current, self.expired = load_events(current), load_events(expired)
        self.reset = load_events(reset)[0] if reset else None


def dump_events(events: Iterable[StreamEvent] | None):
    """Events as plain data (None stays None)."""
    return None if events is None else [e.dump() for e in events]


@overload
def load_events(state: list) -> list[StreamEvent]: ...
@overload
def load_events(state: None) -> None: ...
def load_events(state: list | None) -> list[StreamEvent] | None:
    """Inverse of dump_events()."""
    return None if state is None else [StreamEvent.load(s) for s in state]
