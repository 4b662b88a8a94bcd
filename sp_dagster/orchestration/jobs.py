"""The jobs: deploy, rescale, undeploy, rebalance, and long-running manager and worker runs.
A manager or worker run starts `sp-dagster manager` / `sp-dagster worker` as a child process whose
log lines become the run's log, runs until it is terminated (SIGTERM), and is exempt from
max-runtime monitoring.
"""

import functools

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from sp_dagster.orchestration import ops
from sp_dagster.orchestration.processes import LONG_RUNNING_TAGS, cli_command, run_attached
from sp_dagster.orchestration.resources import ControlPlaneResource, load_conf, spark_config_of


def build_deploy_jobs(control_plane_key: str = "control_plane", messaging_key: str = "messaging") -> list[dg.JobDefinition]:
    """The deploy, undeploy and rebalance jobs, reading the control plane and the messaging layer under these resource keys."""
    op = _ops(control_plane_key, messaging_key)
    # Deploy, rescale, undeploy and rebalance run their ops in one process (in_process_executor): each step is
    # short and the next needs the previous one's result.

    @dg.job(name="deploy", executor_def=dg.in_process_executor, description="Deploy one SiddhiQL app: parse, plan, create topics, record, place, run.")
    def deploy_job():
        """Deploy one app file."""
        _deploy_steps(op, op["load_app"]())

    @dg.job(name="undeploy", executor_def=dg.in_process_executor, description="Remove a deployment (by app name, or the one a deleted file held).")
    def undeploy_job():
        """Remove one deployment."""
        op["refresh_asset_graph"](op["undeploy_app"](op["resolve_app"]()))

    @dg.job(name="rebalance", executor_def=dg.in_process_executor, description="Ask the leader manager to rebalance placements and report what moved.")
    def rebalance_job():
        """Rebalance placements."""
        op["report_rebalance"](op["request_rebalance"]())

    return [deploy_job, undeploy_job, rebalance_job]


def build_rescale_job(control_plane_key: str = "control_plane", messaging_key: str = "messaging") -> dg.JobDefinition:
    """The rescale job (one group of a deployed app at a new parallelism; what the autoscaling sensor launches): the deploy
    job's steps after a first one that rewrites the recorded app (deploy.scaling)."""
    op = _ops(control_plane_key, messaging_key)

    @dg.job(
        name="rescale",
        executor_def=dg.in_process_executor,
        description="Run one execution group of a deployed app at a new parallelism (sp-dagster scale); launched by the autoscaling sensor.",
    )
    def rescale_job():
        """Deploy the recorded app with one group rescaled."""
        _deploy_steps(op, op["scale_app"]())

    return rescale_job


def _deploy_steps(op: dict[str, dg.OpDefinition], loaded) -> None:
    """A loaded app's deploy, from planning to running (inside a job's body)."""
    topology = op["plan_app"](loaded)
    topics = op["create_topics"](topology)
    app = op["record_deployment"](loaded, topology, topics)
    op["refresh_asset_graph"](app)
    op["wait_until_running"](op["wait_until_placed"](app))


@functools.cache  # one set of ops per keys: jobs in one repository must share their op definitions
def _ops(control_plane_key: str, messaging_key: str) -> dict[str, dg.OpDefinition]:
    keys = {"control_plane": control_plane_key, "messaging": messaging_key}
    return {name: ops.rekeyed_op(getattr(ops, name), keys) for name in _DEPLOY_OPS}


_DEPLOY_OPS = (
    "load_app",
    "scale_app",
    "plan_app",
    "create_topics",
    "record_deployment",
    "refresh_asset_graph",
    "wait_until_placed",
    "wait_until_running",
    "resolve_app",
    "undeploy_app",
    "request_rebalance",
    "report_rebalance",
)
deploy_job, undeploy_job, rebalance_job = build_deploy_jobs()
rescale_job = build_rescale_job()


class NodeRunConfig(dg.Config):
    """Which node to run and with which deployment.yaml."""

    node_id: str | None = Field(default=None, description="the node's id (default: the file's wso2.carbon.id)")
    conf: str | None = Field(default=None, description="its deployment.yaml (default: the code location's)")
    stop_timeout: float = Field(default=30.0, description="seconds between SIGTERM and SIGKILL when the run is terminated")


def _already_running(control_plane: ControlPlaneResource, kind: str, node_id: str) -> str | None:
    """Why a node with this id must not be started again (it heartbeats), or None."""
    from sp_dagster.errors import ControlPlaneError

    try:
        status = control_plane.status()
    except ControlPlaneError:  # no cluster yet: nothing runs
        return None
    config = control_plane.config()
    if kind == "manager":
        rows, max_age = status["managers"], config.cluster.strategy_config.heartbeat_interval * config.cluster.strategy_config.heartbeat_max_retry
    else:
        rows, max_age = status["nodes"], config.deployment.heartbeat_interval * config.deployment.heartbeat_max_retry
    for row in rows:
        if row["node"] == node_id and row["state"] == "alive" and row["last_heartbeat_ago_ms"] < max_age:
            return f"{kind} {node_id} already runs (heartbeat {row['last_heartbeat_ago_ms'] / 1000:.1f} s ago); stop it first or pick another id"
    return None


def _run_node(context, control_plane: ControlPlaneResource, kind: str, conf: str, node_id: str | None, stop_timeout: float) -> None:
    with ops.user_errors():
        node_id = node_id or load_conf(conf, role=kind).node_id
    busy = _already_running(control_plane, kind, node_id)
    if busy:
        raise dg.Failure(description=busy, allow_retries=False)
    code = run_attached(context.log, cli_command(kind, "--conf", conf, "--id", node_id), stop_timeout=stop_timeout)
    if code != 0:
        raise dg.Failure(description=f"{kind} {node_id} exited with code {code}; its last lines are in this run's log")
    context.log.info(f"{kind} {node_id} stopped")


def worker_conf_for(conf: str, spark_config: dict[str, str], directory) -> str:
    """`conf` itself when its Spark settings are `spark_config`; else a copy with them, written in `directory`."""
    from pathlib import Path

    import yaml

    if spark_config_of(load_conf(conf, role="worker")) == {k: str(v) for k, v in spark_config.items()}:
        return conf
    document = yaml.safe_load(Path(conf).read_text(encoding="utf-8")) or {}
    settings = {k: str(v) for k, v in spark_config.items()}
    spark: dict[str, object] = {"master": settings.pop("spark.master", "local[*]")}
    if "spark.app.name" in settings:
        spark["appName"] = settings.pop("spark.app.name")
    spark["conf"] = settings
    document["spark"] = spark
    path = Path(directory) / f"worker-{Path(conf).stem}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return str(path)


def build_node_jobs(manager_conf: str, worker_conf: str, control_plane_key: str = "control_plane", spark_key: str = "spark") -> list[dg.JobDefinition]:
    """The manager and worker jobs, defaulting to these deployment.yaml files, with their resources under these keys."""
    keys = {"control_plane": control_plane_key, "spark": spark_key}

    @dg.op(description="Run a manager node until the run is terminated (leader election, membership, placement).", tags=LONG_RUNNING_TAGS)
    @functools.partial(ops.with_resource_keys, keys=keys)
    def run_manager(context: dg.OpExecutionContext, config: NodeRunConfig, control_plane: ControlPlaneResource) -> None:
        """`sp-dagster manager` as a child of this run."""
        _run_node(context, control_plane, "manager", config.conf or manager_conf, config.node_id, config.stop_timeout)

    @dg.op(description="Run a worker node until the run is terminated (its assigned partial apps run as Spark queries).", tags=LONG_RUNNING_TAGS)
    @functools.partial(ops.with_resource_keys, keys=keys)
    def run_worker(context: dg.OpExecutionContext, config: NodeRunConfig, control_plane: ControlPlaneResource, spark: LazyPySparkResource) -> None:
        """`sp-dagster worker` as a child of this run, with the Spark resource's settings."""
        from sp_dagster.config.yamlsource import default_home

        conf = config.conf or worker_conf
        with ops.user_errors():
            conf = worker_conf_for(conf, spark.spark_config, f"{default_home()}/dagster/runs/{context.run_id}")
        _run_node(context, control_plane, "worker", conf, config.node_id, config.stop_timeout)

    @dg.job(
        name="manager", tags=LONG_RUNNING_TAGS, executor_def=dg.in_process_executor, description="A long-running manager node; terminate the run to stop it."
    )
    def manager_job():
        """One manager node, until terminated."""
        run_manager()

    @dg.job(name="worker", tags=LONG_RUNNING_TAGS, executor_def=dg.in_process_executor, description="A long-running worker node; terminate the run to stop it.")
    def worker_job():
        """One worker node, until terminated."""
        run_worker()

    return [manager_job, worker_job]
