"""Aggregators (sum, avg, count, ...), found by name, with Siddhi's retraction semantics.
A current event adds its value, an expired event removes it, a RESET event (a batch window
starting over) clears every group; each state class mirrors Siddhi's own, quirks included, so
outputs match value for value.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from sp_dagster.engine.events import CURRENT, EXPIRED
from sp_dagster.engine.executor import Executor
from sp_dagster.engine.values import LONG_MAX, LONG_MIN, java_float_to_int, wrap_long
from sp_dagster.siddhi import ast
from sp_dagster.siddhi.functions import AGGREGATORS as SPECS

#: Magnitudes below which a long sum subtracts exactly through doubles (Siddhi's overload).
_EXACT = 2**53


class AggregationContext:
    """The aggregators of one selector instance, the group key and their latest values.

    State is kept per group-by key: `apply` is given the key of the event's group. The selector
    first applies an event to every aggregator (`apply`), then evaluates the output
    expressions, whose aggregator calls read the values `apply` left in `values`. So a row can
    also be built later from values kept aside (batch mode builds only the rows it emits).
    """

    def __init__(self, track_future: bool = True):
        self.key = None
        self.track_future = track_future  # keep min/max candidates for retraction
        self.aggregators: list[Aggregator] = []
        self.processes: list = []  # each aggregator's bound process(event, key)
        self.values: list = []

    def compile(self, node: ast.FunctionCall, args: list[Executor]) -> Executor:
        """An executor for aggregator call `node` over argument executors `args`."""
        aggregator = AGGREGATORS[node.name](node, args, self)
        index = len(self.aggregators)
        self.aggregators.append(aggregator)
        self.processes.append(aggregator.process)
        executor = Executor(aggregator.type, lambda e: self.values[index])
        executor.aggregators = (aggregator,)
        executor.reads = ("values", index)
        return executor

    def apply(self, event, key) -> list:
        """Apply a current or expired event to every aggregator of group `key`; their values."""
        self.key = key
        self.values = values = [process(event, key) for process in self.processes]
        return values

    def reset(self) -> None:
        """A RESET event: every aggregator starts over for every group."""
        for aggregator in self.aggregators:
            aggregator.reset()

    def snapshot(self) -> list:
        """The state of every aggregator (plain data)."""
        return [aggregator.snapshot() for aggregator in self.aggregators]

    def restore(self, state: list) -> None:
        """Restore what snapshot() returned."""
        for aggregator, saved in zip(self.aggregators, state):
            aggregator.restore(saved)


class Aggregator:
    """Base: one state object per group key, created on first use, dropped when empty.

    Argument counts and types were checked by the parser's validation; the output type is
    the parser's (sp_dagster.siddhi.functions).
    """

    def __init__(self, node: ast.FunctionCall, args: list[Executor], context: AggregationContext):
        self.node = node
        self.arg_type = args[0].type if args else None
        returns = SPECS[node.name].returns
        assert returns is not None  # every aggregator's spec gives its result type
        type_ = returns([a.type for a in args], node.args)
        assert type_ is not None  # validation has checked the arguments, whose types the executors know
        self.type: str = type_
        self.arg = args[0].row if args else None
        self.read: Callable = args[0].row if args else _no_argument  # arg, for aggregators that have one
        self.context = context
        self.states: dict = {}

    def new_state(self):
        """A fresh state for a group."""
        raise NotImplementedError

    def process(self, event, key):
        """Apply `event` (current: add, expired: remove) to group `key`; return the value."""
        states = self.states
        state = states.get(key)
        if state is None:
            state = states[key] = self.new_state()
        kind = event.type
        arg = self.arg
        value = None if arg is None else arg(event)
        return self._apply(state, kind, value, key)

    def _apply(self, state, kind: int, value, key):
        if kind == CURRENT:
            result = state.add(value)
        elif kind == EXPIRED:
            result = state.remove(value)
        else:
            return state.current()
        if state.empty():
            del self.states[key]
        return result

    def reset(self) -> None:
        """Reset every group (forever aggregators keep their value)."""
        for key in list(self.states):
            state = self.states[key]
            state.reset()
            if state.empty():
                del self.states[key]

    def snapshot(self):
        """Plain-data state of every group."""
        return [(key, state.dump()) for key, state in self.states.items()]

    def restore(self, saved) -> None:
        """Inverse of snapshot()."""
        self.states = {}
        for key, dumped in saved:
            state = self.new_state()
            state.load(dumped)
            self.states[key] = state


def _no_argument(event):
    raise TypeError("this aggregator takes no argument")


class State:
    """Base of aggregator states: plain attributes, dumped in __slots__ order (bases first)."""

    __slots__ = ()

    @classmethod
    def fields(cls) -> list[str]:
        """Every slot of this class and its bases."""
        return [name for klass in reversed(cls.__mro__) for name in getattr(klass, "__slots__", ())]

    def add(self, value):
        """A current event's value arrives; return the aggregate."""
        raise NotImplementedError

    def remove(self, value):
        """An expired event's value leaves; return the aggregate."""
        raise NotImplementedError

    def reset(self) -> None:
        """Start over (a RESET event)."""
        raise NotImplementedError

    def current(self):
        """The aggregate now."""
        raise NotImplementedError

    def empty(self) -> bool:
        """True when the state holds nothing (the group can be forgotten)."""
        raise NotImplementedError

    def dump(self) -> list:
        """Plain-data form of this state."""
        return [_plain(getattr(self, name)) for name in self.fields()]

    def load(self, values: list) -> None:
        """Inverse of dump()."""
        for name, value in zip(self.fields(), values):
            setattr(self, name, value)


def _plain(value):
    if isinstance(value, deque):
        return list(value)
    if isinstance(value, dict):
        return list(value.items())
    return value


# --------------------------------------------------------------------------- sum, avg, count


class SumLongState(State):
    """A group's sum of long values and how many were added (the batch path's aggregators write it back)."""

    __slots__ = ("sum", "count")

    def __init__(self):
        self.sum, self.count = 0, 0

    def add(self, v):
        if v is None:
            return self.current()
        self.sum = wrap_long(self.sum + v)
        self.count += 1
        return self.sum

    def remove(self, v):
        if v is None:
            return self.current()
        # Siddhi's long sum subtracts through a double overload
        self.sum = self.sum - v if abs(self.sum) < 2**53 and abs(v) < 2**53 else java_float_to_int(float(self.sum) - float(v), 64)
        self.count -= 1
        return None if self.count == 0 else self.sum

    def reset(self):
        self.sum, self.count = 0, 0

    def current(self):
        return None if self.count == 0 else self.sum

    def empty(self):
        return self.count == 0 and self.sum == 0


class SumDoubleState(SumLongState):
    """A group's sum of double values, added in arrival order."""

    __slots__ = ()

    def __init__(self):
        self.sum, self.count = 0.0, 0

    def add(self, v):
        if v is None:
            return self.current()
        self.sum += v
        self.count += 1
        return self.sum

    def remove(self, v):
        if v is None:
            return self.current()
        self.sum -= v
        self.count -= 1
        return None if self.count == 0 else self.sum

    def reset(self):
        self.sum, self.count = 0.0, 0


class Sum(Aggregator):
    """sum(x): long for int/long, double for float/double; null when empty."""

    def __init__(self, node, args, context):
        super().__init__(node, args, context)
        # the common cases (an add or remove of a value) inline; Aggregator.process is the reference
        self.process = self._process_long if self.arg_type in ("int", "long") else self._process_double

    def new_state(self):
        return SumLongState() if self.arg_type in ("int", "long") else SumDoubleState()

    def _process_long(self, event, key):
        states = self.states
        state = states.get(key)
        if state is None:
            state = states[key] = self.new_state()
        kind = event.type
        value = self.read(event)
        if value is None:
            return self._apply(state, kind, value, key)
        if kind == CURRENT:
            total = state.sum + value
            if total < LONG_MIN or total > LONG_MAX:
                total = wrap_long(total)
            state.sum = total
            count = state.count = state.count + 1
            if count == 0 and total == 0:
                del states[key]
            return total
        if kind != EXPIRED:
            return state.current()
        total = state.sum
        # Siddhi's long sum subtracts through a double overload
        total = total - value if -_EXACT < total < _EXACT and -_EXACT < value < _EXACT else java_float_to_int(float(total) - float(value), 64)
        state.sum = total
        count = state.count = state.count - 1
        if count == 0:
            if total == 0:
                del states[key]
            return None
        return total

    def _process_double(self, event, key):
        states = self.states
        state = states.get(key)
        if state is None:
            state = states[key] = self.new_state()
        kind = event.type
        value = self.read(event)
        if value is None:
            return self._apply(state, kind, value, key)
        if kind == CURRENT:
            state.sum += value
            count = state.count = state.count + 1
        elif kind == EXPIRED:
            state.sum -= value
            count = state.count = state.count - 1
        else:
            return state.current()
        if count == 0:
            if state.sum == 0:
                del states[key]
            if kind == EXPIRED:
                return None
        return state.sum


class AvgState(State):
    """A group's running mean and how many values it holds."""

    __slots__ = ("value", "count")

    def __init__(self):
        self.value, self.count = 0.0, 0

    def add(self, v):
        if v is None:
            return self.current()
        self.count += 1
        self.value += v
        return self.value / self.count

    def remove(self, v):
        if v is None:
            return self.current()
        self.count -= 1
        self.value -= v
        return None if self.count == 0 else self.value / self.count

    def reset(self):
        self.value, self.count = 0.0, 0

    def current(self):
        return None if self.count == 0 else self.value / self.count

    def empty(self):
        return self.value == 0.0 and self.count == 0


class Avg(Aggregator):
    """avg(x): a double; null when empty."""

    def new_state(self):
        return AvgState()

    def process(self, event, key):
        """Aggregator.process with the add or remove of a value inline."""
        states = self.states
        state = states.get(key)
        if state is None:
            state = states[key] = self.new_state()
        kind = event.type
        value = self.read(event)
        if value is None:
            return self._apply(state, kind, value, key)
        if kind == CURRENT:
            count = state.count = state.count + 1
            total = state.value = state.value + value
            result = total / count
        elif kind == EXPIRED:
            count = state.count = state.count - 1
            total = state.value = state.value - value
            result = None if count == 0 else total / count
        else:
            return state.current()
        if count == 0 and total == 0.0:
            del states[key]
        return result


class CountState(State):
    """A group's count of current events."""

    __slots__ = ("count",)

    def __init__(self):
        self.count = 0

    def add(self, v):
        self.count += 1
        return self.count

    def remove(self, v):
        self.count -= 1
        return self.count

    def reset(self):
        self.count = 0

    def current(self):
        return self.count

    def empty(self):
        return self.count == 0


class Count(Aggregator):
    """count(): a long; 0 when empty."""

    def __init__(self, node, args, context):
        super().__init__(node, args, context)
        self.arg = None

    def new_state(self):
        return CountState()

    def process(self, event, key):
        """Aggregator.process with the count inline."""
        states = self.states
        state = states.get(key)
        if state is None:
            state = states[key] = self.new_state()
        kind = event.type
        if kind == CURRENT:
            count = state.count = state.count + 1
        elif kind == EXPIRED:
            count = state.count = state.count - 1
        else:
            return state.count
        if count == 0:
            del states[key]
        return count


class _DistinctCount(State):
    __slots__ = ("values",)

    def __init__(self):
        self.values = {}

    def add(self, v):
        self.values[v] = self.values.get(v, 0) + 1
        return len(self.values)

    def remove(self, v):
        left = self.values.get(v, 0) - 1
        if left > 0:
            self.values[v] = left
        else:
            self.values.pop(v, None)
        return len(self.values)

    def reset(self):
        self.values = {}

    def current(self):
        return len(self.values)

    def empty(self):
        return not self.values

    def load(self, values):
        self.values = dict(values[0])


class DistinctCount(Aggregator):
    """distinctCount(x): how many distinct values (a long); 0 when empty."""

    def new_state(self):
        return _DistinctCount()


# --------------------------------------------------------------------------- min, max


class _Extreme(State):
    __slots__ = ("value", "candidates", "largest")

    def __init__(self, largest: bool, track: bool):
        self.value = None
        self.candidates = deque() if track else None
        self.largest = largest

    def _beats(self, a, b) -> bool:
        return a > b if self.largest else a < b

    def add(self, v):
        if v is None:
            return self.value
        if self.candidates is not None:
            # a monotonic deque, exactly as Siddhi keeps it
            while self.candidates and self._beats(v, self.candidates[-1]):
                self.candidates.pop()
            self.candidates.append(v)
        if self.value is None or self._beats(v, self.value):
            self.value = v
        return self.value

    def remove(self, v):
        if v is None:
            return self.value
        if self.candidates is not None:
            try:
                self.candidates.remove(v)
            except ValueError:
                pass
            self.value = self.candidates[0] if self.candidates else None
        elif self.value is not None and self.value == v:
            self.value = None
        return self.value

    def reset(self):
        if self.candidates is not None:
            self.candidates.clear()
        self.value = None

    def current(self):
        return self.value

    def empty(self):
        return not self.candidates and self.value is None

    def load(self, values):
        value, candidates, largest = values
        self.value, self.largest = value, largest
        self.candidates = deque(candidates) if candidates is not None else None


class Max(Aggregator):
    """max(x): the largest value in the window; same type as x."""

    largest = True

    def new_state(self):
        return _Extreme(self.largest, self.context.track_future)


class Min(Max):
    """min(x): the smallest value in the window; same type as x."""

    largest = False


class _Forever(State):
    __slots__ = ("value", "largest")

    def __init__(self, largest: bool):
        self.value = None
        self.largest = largest

    def add(self, value):
        if value is not None and (self.value is None or (value > self.value if self.largest else value < self.value)):
            self.value = value
        return self.value

    remove = add

    def reset(self):
        pass

    def current(self):
        return self.value

    def empty(self):
        return self.value is None


class MaxForever(Aggregator):
    """maxForever(x): the largest value ever seen (expiry and reset keep it)."""

    largest = True

    def new_state(self):
        return _Forever(self.largest)


class MinForever(MaxForever):
    """minForever(x): the smallest value ever seen."""

    largest = False


# --------------------------------------------------------------------------- stdDev, and, or


class _StdDev(State):
    __slots__ = ("mean", "deviation", "sum", "count")

    def __init__(self):
        self.mean = self.deviation = self.sum = 0.0
        self.count = 0

    def add(self, v):
        if v is None:
            return self.current()
        v = float(v)
        self.count += 1
        if self.count == 1:
            self.sum = self.mean = v
            self.deviation = 0.0
            return 0.0
        old_mean = self.mean
        self.sum += v
        self.mean = self.sum / self.count
        self.deviation += (v - old_mean) * (v - self.mean)
        return _sqrt(self.deviation / self.count)

    def remove(self, v):
        if v is None:
            return self.current()
        v = float(v)
        self.count -= 1
        if self.count == 0:
            self.sum = self.mean = self.deviation = 0.0
            return None
        old_mean = self.mean
        self.sum -= v
        self.mean = self.sum / self.count
        self.deviation -= (v - old_mean) * (v - self.mean)
        if self.count == 1:
            return 0.0
        return _sqrt(self.deviation / self.count)

    def reset(self):
        self.mean = self.deviation = self.sum = 0.0
        self.count = 0

    def current(self):
        if self.count == 0:
            return None
        if self.count == 1:
            return 0.0
        return _sqrt(self.deviation / self.count)

    def empty(self):
        return self.count == 0 and self.sum == 0.0 and self.mean == 0.0 and self.deviation == 0.0


def _sqrt(value: float) -> float:
    return math.sqrt(value) if value >= 0 else math.nan


class StdDev(Aggregator):
    """stdDev(x): the population standard deviation (a double); null when empty."""

    def new_state(self):
        return _StdDev()


class _Logical(State):
    __slots__ = ("true", "false", "conjunction")

    def __init__(self, conjunction: bool):
        self.true = self.false = 0
        self.conjunction = conjunction

    def add(self, v):
        if v is not None:
            if v:
                self.true += 1
            else:
                self.false += 1
        return self.current()

    def remove(self, v):
        if v is not None:
            if v:
                self.true -= 1
            else:
                self.false -= 1
        return self.current()

    def reset(self):
        self.true = self.false = 0

    def current(self):
        if self.conjunction:
            return self.true > 0 and self.false == 0
        return self.true > 0

    def empty(self):
        return self.true == 0 and self.false == 0


class And(Aggregator):
    """and(b): true when every value in the window is true (false when empty)."""

    conjunction = True

    def new_state(self):
        return _Logical(self.conjunction)


class Or(And):
    """or(b): true when any value in the window is true (false when empty)."""

    conjunction = False


AGGREGATORS: dict[str, type[Aggregator]] = {
    "sum": Sum,
    "avg": Avg,
    "count": Count,
    "distinctCount": DistinctCount,
    "min": Min,
    "max": Max,
    "minForever": MinForever,
    "maxForever": MaxForever,
    "stdDev": StdDev,
    "and": And,
    "or": Or,
}
