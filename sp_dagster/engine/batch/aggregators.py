"""sum, count and avg per group over a sequence of adds and removes, computed at once, value for value.
Counts and integer sums are running sums per group; double sums (and avg's value) are added in
the event path's order with its roundings, and every group's final state is written back.
"""

from __future__ import annotations

import numpy as np

from sp_dagster.engine.aggregators import Avg, AvgState, Count, CountState, Sum, SumDoubleState, SumLongState

#: Aggregator classes this module computes.
SUPPORTED = (Sum, Count, Avg)
#: Largest magnitude an integer sum may reach and stay exact both ways.
EXACT = 2**52


def integer_sum(aggregator) -> bool:
    """True for sum() over int or long (a long result)."""
    return isinstance(aggregator, Sum) and aggregator.arg_type in ("int", "long")


class Ops:
    """Adds and removes in the order the event path applies them: group code, sign, values.

    The event path applies each add (+1) or remove (-1) to its group's state in turn.
    """

    def __init__(self, groups: np.ndarray, signs: np.ndarray, keys: list, values: list[np.ndarray | None]):
        self.groups = groups
        self.signs = signs
        self.keys = keys  # group code -> group key
        self.values = values  # per aggregator: the argument of every op (None for count())
        self.order = np.argsort(groups, kind="stable")
        sorted_groups = groups[self.order]
        self.starts = np.searchsorted(sorted_groups, np.arange(len(keys)), side="left")
        self.ends = np.searchsorted(sorted_groups, np.arange(len(keys)), side="right")
        self.rank = np.empty(len(groups), np.int64)
        self.rank[self.order] = np.arange(len(groups)) - self.starts[sorted_groups]

    def running_int(self, initial: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """initial[group] plus the deltas of the group so far, after every op (exact integers)."""
        sorted_deltas = deltas[self.order]
        total = np.cumsum(sorted_deltas)
        before = np.where(self.starts > 0, total[np.maximum(self.starts - 1, 0)], 0)
        out = np.empty(len(deltas), np.int64)
        out[self.order] = total - np.repeat(before - initial, self.ends - self.starts)
        return out

    def running_float(self, initial: np.ndarray, deltas: np.ndarray) -> np.ndarray:
        """initial[group] + delta + delta ... added one at a time in op order, after every op.

        One row per group in a matrix, cumulated along the row: the same additions, in the same
        order and with the same roundings, as the event path makes.
        """
        count = len(self.keys)
        width = int((self.ends - self.starts).max(initial=0)) + 1
        matrix = np.zeros((count, width), np.float64)
        matrix[:, 0] = initial
        matrix[self.groups, self.rank + 1] = deltas
        np.cumsum(matrix, axis=1, out=matrix)
        return matrix[self.groups, self.rank + 1]


def compute(aggregator, ops: Ops, values: np.ndarray | None, stores: list | None = None):
    """(value after every op, apply) for one aggregator; apply() writes the final states back.

    `stores[code]` is (states dict, key) of group `code`: by default the aggregator's own
    states under ops.keys (partitions pass every group's instance's dict).
    """
    if stores is None:
        stores = [(aggregator.states, key) for key in ops.keys]
    olds = [states.get(key) for states, key in stores]
    counts0 = np.array([_count(s) for s in olds], np.int64)
    counts = ops.running_int(counts0, ops.signs)
    if isinstance(aggregator, Count):
        result, sums, sums0 = counts, None, None
    elif integer_sum(aggregator):
        sums0 = np.array([_sum(s, 0) for s in olds], np.int64)
        sums = ops.running_int(sums0, ops.signs * values)
        result = sums
    else:
        assert values is not None  # only count() comes without argument values
        sums0 = np.array([_sum(s, 0.0) for s in olds], np.float64)
        sums = ops.running_float(sums0, np.where(ops.signs > 0, values, -values))
        if isinstance(aggregator, Avg):
            with np.errstate(divide="ignore", invalid="ignore"):  # after removes that empty a group: unread
                result = sums / counts
        else:
            result = sums

    def apply() -> None:
        _write_back(aggregator, ops, counts, sums, stores)

    return result, apply


def _count(state) -> int:
    return 0 if state is None else state.count


def _sum(state, zero):
    if state is None:
        return zero
    return state.value if isinstance(state, AvgState) else state.sum


def _new_state(aggregator, count: int, total):
    if isinstance(aggregator, Count):
        state = CountState()
        state.count = count
    elif isinstance(aggregator, Avg):
        state = AvgState()
        state.value, state.count = float(total), count
    else:
        state = SumLongState() if integer_sum(aggregator) else SumDoubleState()
        state.sum, state.count = (int(total) if integer_sum(aggregator) else float(total)), count
    return state


def _write_back(aggregator, ops: Ops, counts: np.ndarray, sums: np.ndarray | None, stores: list) -> None:
    """Final states in the event path's dict order: survivors first, groups made anew after, by when.

    The event path forgets a group when its state empties and makes it anew later.
    """
    empty = counts == 0
    if sums is not None:
        empty &= sums == 0
    remade = []
    for code, (states, key) in enumerate(stores):
        first, last = ops.starts[code], ops.ends[code]
        if first == last:
            continue
        positions = ops.order[first:last]  # this group's ops, in op order
        emptied = np.flatnonzero(empty[positions])
        existed = key in states
        if existed and not len(emptied):
            _update(states[key], counts[positions[-1]], None if sums is None else sums[positions[-1]])
            continue
        states.pop(key, None)
        if len(emptied) and emptied[-1] == len(positions) - 1:
            continue  # empty at the end: forgotten
        made = positions[emptied[-1] + 1] if len(emptied) else positions[0]
        final = positions[-1]
        remade.append((made, states, key, _new_state(aggregator, int(counts[final]), 0 if sums is None else sums[final])))
    for _, states, key, state in sorted(remade, key=lambda item: item[0]):
        states[key] = state


def _update(state, count, total) -> None:
    state.count = int(count)
    if total is None:
        return
    if isinstance(state, AvgState):
        state.value = float(total)
    elif isinstance(state, SumLongState) and not isinstance(state, SumDoubleState):
        state.sum = int(total)
    else:
        state.sum = float(total)
