"""The `autoscaling` sensor: applies each execution group's parallelism advice through `rescale` runs.
Off unless `deployment.config.autoscaling.enabled`; cooldown, cap and the record of every
decision are cluster.autoscaling's (docs/operations/scaling.md, Autoscaling).
"""

from __future__ import annotations

import dagster as dg

from sp_dagster.errors import SpDagsterError
from sp_dagster.orchestration.ops import with_resource_keys
from sp_dagster.orchestration.resources import ControlPlaneResource
from sp_dagster.wording import counted

RESCALE_TAG = "sp-dagster/rescale"


def build_autoscaling_sensor(
    rescale_job: dg.JobDefinition,
    *,
    control_plane_key: str = "control_plane",
    interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """The sensor launching `rescale_job` when a group's advice holds (reads the control plane under `control_plane_key`)."""

    def autoscaling(context: dg.SensorEvaluationContext, control_plane: ControlPlaneResource):
        """Decide per group; one run request per applied decision."""
        from sp_dagster.cluster.advising import group_advice
        from sp_dagster.cluster.autoscaling import Decision, plan_rescales

        try:
            config = control_plane.config()
            settings = config.deployment.autoscaling
            if not settings.enabled:
                return dg.SkipReason(f"autoscaling is off: set deployment.config.autoscaling.enabled: true in {config.source} to apply the advice")
            if (client := control_plane.client()) is not None:  # the leader decides and records, with its own settings
                decisions = [Decision(**d) for d in client.autoscaling()]
            else:
                plane = control_plane.plane
                decisions = plan_rescales(plane, group_advice(plane, settings), settings)
        except SpDagsterError as exc:
            return dg.SkipReason(str(exc))
        for decision in decisions:
            context.log.info(f"{decision.app} {decision.group}: {'applying' if decision.applied else 'holding back'}: {decision.reason}")
        applied = [d for d in decisions if d.applied]
        if not applied:
            held = f" or is held back ({counted(len(decisions), 'group')})" if decisions else ""
            return dg.SkipReason(f"every group runs at its advised parallelism{held}")
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"rescale:{d.app}:{d.group}:{d.parallel}->{d.advised}:{context.cursor or 0}",
                    run_config={"ops": {"scale_app": {"config": {"app": d.app, "group": d.group, "parallel": d.advised}}}},
                    tags={RESCALE_TAG: f"{d.app}/{d.group}"},
                )
                for d in applied
            ],
            cursor=str(int(context.cursor or 0) + 1),
        )

    return dg.sensor(
        name="autoscaling",
        job=rescale_job,
        minimum_interval_seconds=interval_seconds,
        default_status=default_status,
        description="Rescales execution groups to their advised parallelism (deployment.config.autoscaling; off by default).",
    )(with_resource_keys(autoscaling, {"control_plane": control_plane_key}))
