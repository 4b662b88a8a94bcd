"""Autoscaling decisions: advice that differs from what runs is applied unless the group cools down or hit its hourly cap;
every decision is kept in the control plane, a held-back one once while its advice stays the same."""

from __future__ import annotations

from sp_dagster.cluster.autoscaling import AUTOSCALE, HOUR_MS, decide, latest_decisions, plan_rescales
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.events import recent_events
from sp_dagster.config.model import AutoscalingConfig

SETTINGS = AutoscalingConfig(enabled=True, cooldown_seconds=300, max_rescales_per_hour=2)
NOW = 10 * HOUR_MS


def group(parallel: int, advised: int, name: str = "work") -> dict:
    return {"group": name, "parallel": parallel, "advised": advised, "reason": "scale up: 0.95 busy"}


def test_advice_equal_to_what_runs_decides_nothing():
    assert decide("A", group(2, 2), [], SETTINGS, NOW) is None


def test_advice_is_applied_when_the_group_is_neither_cooling_down_nor_capped():
    decision = decide("A", group(1, 3), [NOW - 400_000], SETTINGS, NOW)
    assert decision is not None and decision.applied and (decision.parallel, decision.advised) == (1, 3)
    assert decision.reason == "scale up 1 -> 3: scale up: 0.95 busy"
    assert decide("A", group(3, 2), [], SETTINGS, NOW).reason.startswith("scale down 3 -> 2")  # type: ignore[union-attr]


def test_a_recent_rescale_holds_the_next_back_for_the_cooldown():
    decision = decide("A", group(2, 3), [NOW - 100_000], SETTINGS, NOW)
    assert decision is not None and not decision.applied
    assert decision.reason == "cooling down: the last rescale was 100 s ago (200 s left)"


def test_no_more_than_the_hourly_cap():
    earlier = [NOW - 40 * 60_000, NOW - 20 * 60_000]  # both past the cooldown, both within the hour
    decision = decide("A", group(2, 3), earlier, SETTINGS, NOW)
    assert decision is not None and not decision.applied and decision.reason == "2 rescales in the last hour, the most maxRescalesPerHour allows"
    assert decide("A", group(2, 3), [NOW - HOUR_MS - 1, NOW - 20 * 60_000], SETTINGS, NOW).applied  # type: ignore[union-attr]


def test_decisions_are_recorded_and_read_back_for_the_cooldown(tmp_path):
    plane = ControlPlane(f"sqlite:///{tmp_path / 'plane.db'}")
    plane.migrate()
    try:
        advice = {"apps": [{"app": "A", "groups": [group(1, 3), group(2, 2, "other")]}]}
        (first,) = plan_rescales(plane, advice, SETTINGS)
        assert first.applied and first.group == "work"
        # The run has not rescaled it yet, so the advice still differs: held back by the cooldown, recorded once.
        for _ in range(3):
            (again,) = plan_rescales(plane, advice, SETTINGS)
            assert not again.applied and again.reason.startswith("cooling down")
        kept = [e.detail for e in recent_events(plane, kinds=(AUTOSCALE,))]
        assert [(d["group"], d["applied"]) for d in kept] == [("work", True), ("work", False)]
        latest = latest_decisions(plane)
        assert set(latest) == {("A", "work")}
        assert latest["A", "work"].actor == "autoscaling" and latest["A", "work"].detail["advised"] == 3
    finally:
        plane.close()
