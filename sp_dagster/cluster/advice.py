"""Advised parallelism of one execution group, from a short history of its load (a pure function).
The advice differs from the running parallelism only when every sample of the stabilisation window
puts the group's utilisation outside a band around the target, on the same side, so steady load
never flaps; the rules are under "Parallelism advice" in docs/operations/scaling.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sp_dagster.config.model import AutoscalingConfig
from sp_dagster.wording import counted

BAND = 0.1  # utilisation within targetUtilization +/- BAND holds the running parallelism
BUSY_FLOOR = 0.05  # a busy fraction below this is not trusted to measure capacity
BACKLOG_S = 1.0  # a lag above this many seconds of the group's processing is a backlog, not events in flight
EFFECTIVE = 0.1  # a scale-up that added less than this share of the capacity it should have is not repeated (Flink's default)


@dataclass(frozen=True)
class LoadSample:
    """The load of one execution group at one moment, as the leader sampled it."""

    at_ms: int
    parallel: int  # instances of the group when sampled
    arrival_per_s: float | None  # events/s into its input topics since the previous sample (None: not known yet)
    processed_per_s: float  # the sum of its instances' rows_per_s
    busy: tuple[float, ...]  # each reporting instance's busy fraction
    lag: int  # events of its input topics not processed yet


@dataclass(frozen=True)
class Advice:
    """The advised parallelism of a group and why."""

    advised: int
    reason: str


@dataclass(frozen=True)
class _Need:
    instances: int  # instances at the target utilisation, within [1, max]
    utilization: float  # of the parallelism sampled at


def _need(sample: LoadSample, settings: AutoscalingConfig, max_parallel: int | None) -> _Need | None:
    """The instances one sample needs, or None when its capacity cannot be measured.

    Its target rate (arrival rate into its input topics, plus its backlog over `catchUpSeconds`) over what
    one instance processes per busy second (the group's processed rate over the sum of its instances' busy
    fractions, that sum floored at BUSY_FLOOR per instance so a near-idle group cannot over-estimate its
    capacity), at `targetUtilization`.
    """
    target = (sample.processed_per_s if sample.arrival_per_s is None else sample.arrival_per_s) + sample.lag / settings.catch_up_seconds
    if target <= 0:
        return _Need(1, 0.0)  # idle: nothing arrives, nothing waits
    if sample.processed_per_s <= 0 or not sample.busy:
        return None  # events wait but nothing was processed: its capacity is not known
    per_instance = sample.processed_per_s / max(sum(sample.busy), BUSY_FLOOR * len(sample.busy))
    instances = max(1, math.ceil(target / (per_instance * settings.target_utilization) - 1e-9))
    return _Need(min(instances, max_parallel) if max_parallel else instances, target / (per_instance * sample.parallel))


def advise(history: Sequence[LoadSample], parallel: int, max_parallel: int | None, settings: AutoscalingConfig, now_ms: int) -> Advice:
    """The advised parallelism within [1, max_parallel] (None: no maximum) of a group running `parallel` instances, from its samples (oldest first).

    It differs from `parallel` only when every sample of the last `stabilizationSeconds` puts the group's
    utilisation outside a band of BAND around the target, on the same side. A group scales down only while no
    instance of any of those samples is busy above the band, and not while a backlog drains (more than
    BACKLOG_S of its processing waits): a smaller group would drain it slower, and the next window would ask
    for a second step down. So steady load never flaps, and a load that ends is followed by one step down. A
    scale-up is not repeated while the samples kept from before the last one show it was ineffective
    (`_ineffective_scale_up`).
    """
    samples = [s for s in history if s.parallel == parallel]  # samples of another parallelism say nothing of this one
    if not samples:
        return Advice(parallel, "no load samples at this parallelism yet")
    window_ms = settings.stabilization_seconds * 1000
    if now_ms - samples[0].at_ms < window_ms:
        return Advice(
            parallel, f"stabilising: {(now_ms - samples[0].at_ms) / 1000:.0f} of {settings.stabilization_seconds} s of samples at parallel {parallel}"
        )
    window = [s for s in samples if s.at_ms >= now_ms - window_ms] or samples[-1:]
    needs = [_need(s, settings, max_parallel) for s in window]
    if any(n is None for n in needs):
        return Advice(parallel, "capacity not measurable: events waited while the group processed none")
    known = [n for n in needs if n is not None]
    target, low, high = settings.target_utilization, settings.target_utilization - BAND, settings.target_utilization + BAND
    span = f"utilisation {min(n.utilization for n in known):.2f}-{max(n.utilization for n in known):.2f} over {len(known)} samples of {settings.stabilization_seconds} s"
    cap = f" (capped at the maximum {max_parallel})" if max_parallel and any(n.instances == max_parallel for n in known) else ""
    if all(n.utilization > high for n in known):
        advised = max(parallel, min(n.instances for n in known))
        if advised == parallel:
            return Advice(parallel, f"saturated ({span}), but already at the maximum parallelism {max_parallel}")
        if ineffective := _ineffective_scale_up(history, window):
            return Advice(parallel, f"holding: {span} above {high:.2f}, but {ineffective}")
        return Advice(advised, f"scale up: {span} above {high:.2f}{cap}")
    if all(n.utilization < low for n in known):
        busiest = max((b for s in window for b in s.busy), default=0.0)
        if busiest > high:
            return Advice(parallel, f"holding: {span} below {low:.2f}, but an instance was {busiest:.2f} busy (above {high:.2f})")
        newest = window[-1]
        if newest.lag > max(newest.processed_per_s, 1.0) * BACKLOG_S:
            return Advice(parallel, f"holding: {span} below {low:.2f}, but {counted(newest.lag, 'event')} wait: draining them first")
        advised = min(parallel, max(n.instances for n in known))
        if advised < parallel:
            return Advice(advised, f"scale down: {span} below {low:.2f}; {counted(advised, 'instance')} stay below {target:.2f}")
    return Advice(parallel, f"holding: {span} (target {target:.2f} +/- {BAND:g})")


def _capacity(samples: Sequence[LoadSample]) -> float | None:
    """Events/s a group's instances move when all are busy, the median over `samples` busy enough to tell (None: none is)."""
    found = [s.processed_per_s / sum(s.busy) * s.parallel for s in samples if s.processed_per_s > 0 and s.busy and sum(s.busy) >= BUSY_FLOOR * len(s.busy)]
    return statistics.median(found) if found else None


def _ineffective_scale_up(history: Sequence[LoadSample], window: Sequence[LoadSample]) -> str | None:
    """Why scaling up again would not help: the last scale-up (from the parallelism sampled just before
    the current one, still in the history) added less than EFFECTIVE of the capacity it should have; None otherwise.

    Flink's scaling-effectiveness detection: where instances share a bottleneck (cores, a broker), more of
    them only add cost.
    """
    parallel = window[-1].parallel
    earlier = [s for s in history if s.at_ms < window[0].at_ms and s.parallel != parallel]
    if not earlier or earlier[-1].parallel >= parallel:
        return None  # no scale-up to judge: none kept, or the last change was a scale-down
    came_from = earlier[-1].parallel
    before, now = _capacity([s for s in earlier if s.parallel == came_from]), _capacity(window)
    if before is None or now is None:
        return None
    expected = before * (parallel - came_from) / came_from
    if now - before >= EFFECTIVE * expected:
        return None
    return (
        f"scaling up from {came_from} to {parallel} added {max(0.0, now - before):.0f} of the {expected:.0f} events/s it should have "
        f"({max(0.0, now - before) / expected:.0%}, under {EFFECTIVE:.0%}): more instances do not add capacity here"
    )
