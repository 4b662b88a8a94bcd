"""The advice function: steady load never flaps, saturation scales up, a busy instance blocks scale-down, backlog drains, bounds,
an ineffective scale-up is not repeated."""

import math
import random

from sp_dagster.cluster.advice import BAND, BUSY_FLOOR, LoadSample, advise
from sp_dagster.config.model import AutoscalingConfig

SETTINGS = AutoscalingConfig(target_utilization=0.7, catch_up_seconds=300, stabilization_seconds=120)
STEP_MS = 5000


def group_load(parallel: int, arrival: float, capacity: float, lag: int = 0, at_ms: int = 0, noise: float = 0.0, rng=None) -> LoadSample:
    """A sample of a group whose instances each process up to `capacity` events/s, fed `arrival` events/s (lag grows when they cannot keep up)."""
    jitter = 1 + (rng.uniform(-noise, noise) if rng else 0.0)
    processed = min(arrival * jitter, capacity * parallel)
    busy = tuple(processed / parallel / capacity for _ in range(parallel))
    return LoadSample(at_ms, parallel, arrival * jitter, processed, busy, lag)


def run(load, parallel: int, seconds: int, max_parallel: int | None = None, settings=SETTINGS) -> list[int]:
    """Apply each advice at once (as an autoscaler would) over `seconds` of 5 s samples; the parallelism after each sample."""
    history, seen = [], []
    for at_ms in range(0, seconds * 1000, STEP_MS):
        history.append(load(parallel, at_ms))
        parallel = advise(history, parallel, max_parallel, settings, at_ms).advised
        seen.append(parallel)
    return seen


def changes(series: list[int]) -> int:
    return sum(1 for a, b in zip(series, series[1:]) if a != b)


def test_steady_load_never_flaps():
    for seed in range(20):
        rng = random.Random(seed)
        arrival = rng.uniform(50, 5000)
        series = run(lambda p, t: group_load(p, arrival, capacity=400, at_ms=t, noise=0.15, rng=rng), rng.randint(1, 8), 3600)
        assert changes(series) <= 1, (seed, arrival, series)
        final = series[-1]
        assert arrival / (final * 400) <= (SETTINGS.target_utilization + BAND) * 1.15  # settled where it keeps up


def test_saturation_scales_up_once_the_window_agrees():
    history = [group_load(1, 1000, capacity=300, lag=100 * i, at_ms=i * STEP_MS) for i in range(30)]
    early = advise(history[:10], 1, None, SETTINGS, history[9].at_ms)
    assert early.advised == 1 and "stabilising" in early.reason
    advice = advise(history, 1, None, SETTINGS, history[-1].at_ms)
    assert advice.advised == math.ceil((1000 + history[-1].lag / 300) / (300 * 0.7)), advice
    assert advice.reason.startswith("scale up")


def test_a_busy_instance_blocks_scale_down():
    skewed = [LoadSample(i * STEP_MS, 4, 200.0, 200.0, (0.9, 0.05, 0.05, 0.05), 0) for i in range(30)]
    advice = advise(skewed, 4, None, SETTINGS, skewed[-1].at_ms)
    assert advice.advised == 4 and "0.90 busy" in advice.reason
    even = [LoadSample(i * STEP_MS, 4, 200.0, 200.0, (0.2625,) * 4, 0) for i in range(30)]
    assert advise(even, 4, None, SETTINGS, even[-1].at_ms).advised == 2


def test_backlog_drains_within_catch_up():
    for lag in (0, 30_000, 300_000, 3_000_000):
        history = [group_load(2, 500, capacity=400, lag=lag, at_ms=i * STEP_MS) for i in range(30)]
        advised = advise(history, 2, None, SETTINGS, history[-1].at_ms).advised
        # at the advised parallelism the group takes in the arrivals and the backlog within catchUpSeconds, busy no more than the band allows
        spare = advised * 400 * (SETTINGS.target_utilization + BAND) - 500
        assert lag == 0 or spare * SETTINGS.catch_up_seconds >= lag, (lag, advised)
        if advised > 2:
            assert (advised - 1) * 400 * SETTINGS.target_utilization - 500 < lag / SETTINGS.catch_up_seconds  # and no more than that


def test_bounds():
    flood = [group_load(3, 1e6, capacity=100, at_ms=i * STEP_MS) for i in range(30)]
    capped = advise(flood, 3, 8, SETTINGS, flood[-1].at_ms)
    assert capped.advised == 8 and "maximum 8" in capped.reason
    at_max = [group_load(8, 1e6, capacity=100, at_ms=i * STEP_MS) for i in range(30)]
    assert advise(at_max, 8, 8, SETTINGS, at_max[-1].at_ms).advised == 8
    idle = [LoadSample(i * STEP_MS, 5, 0.0, 0.0, (0.0,) * 5, 0) for i in range(30)]
    assert advise(idle, 5, 8, SETTINGS, idle[-1].at_ms).advised == 1


def test_near_zero_busy_does_not_over_estimate_capacity():
    # 100 events/s reported with almost no busy time: taken at face value one instance could take 10^6/s
    history = [LoadSample(i * STEP_MS, 4, 100.0, 100.0, (0.0001,) * 4, 0) for i in range(30)]
    advised = advise(history, 4, None, SETTINGS, history[-1].at_ms).advised
    assert advised == math.ceil(100 / (100 / (BUSY_FLOOR * 4) * 0.7))  # at most the capacity the floor allows
    assert advise(history, 4, None, AutoscalingConfig(stabilization_seconds=120), history[-1].at_ms).advised >= 1


def test_unknown_capacity_and_other_parallelism_hold():
    stuck = [LoadSample(i * STEP_MS, 2, 50.0, 0.0, (0.0, 0.0), 1000 + i) for i in range(30)]
    advice = advise(stuck, 2, None, SETTINGS, stuck[-1].at_ms)
    assert advice.advised == 2 and "not measurable" in advice.reason
    before_rescale = [group_load(1, 1000, capacity=300, at_ms=i * STEP_MS) for i in range(30)]
    assert advise(before_rescale, 3, None, SETTINGS, before_rescale[-1].at_ms).advised == 3  # samples of parallel 1 say nothing of 3


def test_no_step_down_while_a_backlog_drains_then_one_step_to_what_the_load_needs():
    """A load that ends leaves a backlog: the group keeps its instances until it is drained, then goes down in one step."""
    draining = [LoadSample(i * STEP_MS, 4, 0.0, 900.0, (0.3,) * 4, 30_000 - 4500 * i) for i in range(6)]
    advice = advise(draining, 4, None, SETTINGS, draining[-1].at_ms + SETTINGS.stabilization_seconds * 1000)
    assert advice.advised == 4 and "wait: draining them first" in advice.reason, advice
    drained = draining + [LoadSample((6 + i) * STEP_MS, 4, 0.0, 0.0, (0.0,) * 4, 0) for i in range(30)]
    advice = advise(drained, 4, None, SETTINGS, drained[-1].at_ms)
    assert advice.advised == 1 and advice.reason.startswith("scale down"), advice
    # Events in flight (under a second of processing) are no backlog: a lighter steady load still steps down.
    light = [LoadSample(i * STEP_MS, 4, 200.0, 200.0, (0.2625,) * 4, 150) for i in range(30)]
    assert advise(light, 4, None, SETTINGS, light[-1].at_ms).advised == 2


def shared_cores(cores: int, per_core: float):
    """Load samples of a group whose instances share `cores`: beyond that many instances, each added moves nothing."""
    return lambda parallel, arrival, at_ms: group_load(parallel, arrival, capacity=per_core * min(parallel, cores) / parallel, at_ms=at_ms)


def test_scaling_up_stops_once_the_last_step_added_no_capacity():
    load = shared_cores(2, 400.0)
    series = run(lambda p, t: load(p, 2000.0, t), 1, 1800)  # no maximum: only the evidence can stop it
    assert series[-1] > 2 and changes(series) == 2, series  # 1 -> 8 (400 -> 800 events/s: 14% of the 2,800 due) -> 29 (none added): held
    history = [load(16, 2000.0, i * STEP_MS) for i in range(30)]
    earlier = [load(8, 2000.0, -(30 - i) * STEP_MS) for i in range(30)]
    advice = advise(earlier + history, 16, None, SETTINGS, history[-1].at_ms)
    assert advice.advised == 16 and "scaling up from 8 to 16 added 0 of the 800 events/s it should have (0%, under 10%)" in advice.reason, advice


def test_a_scale_up_that_added_capacity_does_not_stop_the_next():
    # 500 events/s: two instances; then 2,000: eight. Each instance moves 400 whatever the parallelism.
    series = run(lambda p, t: group_load(p, 500.0 if t < 300_000 else 2000.0, capacity=400, at_ms=t), 1, 900)
    assert series[-1] == 8 and 2 in series, series


def test_the_last_change_being_a_scale_down_is_not_judged():
    earlier = [group_load(4, 2000.0, capacity=400, at_ms=-(30 - i) * STEP_MS) for i in range(30)]
    history = [group_load(2, 2000.0, capacity=400, at_ms=i * STEP_MS) for i in range(30)]
    assert advise(earlier + history, 2, None, SETTINGS, history[-1].at_ms).reason.startswith("scale up")
