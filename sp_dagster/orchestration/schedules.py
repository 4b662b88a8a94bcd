"""Schedules: rebalancing and health checks, every N minutes from the deployment.yaml's dagster section."""

from __future__ import annotations

import dagster as dg

from sp_dagster.wording import counted


def cron_every(minutes: int) -> str:
    """A cron expression firing every `minutes` (a divisor of 60, or whole hours dividing a day)."""
    if minutes < 60:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    hours = minutes // 60
    return "0 * * * *" if hours == 1 else "0 0 * * *" if hours == 24 else f"0 */{hours} * * *"


def build_rebalance_schedule(job, minutes: int) -> dg.ScheduleDefinition:
    """Runs the rebalance job every `minutes`."""
    return dg.ScheduleDefinition(
        name="rebalance_schedule",
        job=job,
        cron_schedule=cron_every(minutes),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Rebalance placements every {counted(minutes, 'minute')} (dagster.rebalanceInterval).",
    )


def build_health_schedule(job, minutes: int) -> dg.ScheduleDefinition:
    """Runs the health checks every `minutes`."""
    return dg.ScheduleDefinition(
        name="health_schedule",
        job=job,
        cron_schedule=cron_every(minutes),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Observe the partial apps and check their workers and lag every {counted(minutes, 'minute')} (dagster.healthInterval).",
    )
