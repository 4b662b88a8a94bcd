"""Dropping an undeployed app's state (`sp-dagster undeploy --drop-state`).
The state is dropped only once no live worker runs the app's instances, so no last checkpoint lands
after the drop; the drop is then recorded in the control plane (cluster.store.drops), and what this
machine reaches is deleted (docs/concepts/delivery.md, "State across change").
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from sp_dagster.deploy.errors import DeployError
from sp_dagster.wording import counted


def wait_until_released(plane, instance_ids: list[str], timeout: float, poll: float = 0.5) -> None:
    """Wait until no live worker runs any of these instances; DeployError naming who still does."""
    from sp_dagster.cluster.membership import ALIVE, read_nodes

    wanted, deadline = set(instance_ids), time.monotonic() + timeout
    while True:
        with plane.transaction() as conn:
            holders = {n.node_id: sorted(wanted & set((n.metrics or {}).get("running", ()))) for n in read_nodes(conn) if n.state == ALIVE}
        holders = {node: ids for node, ids in holders.items() if ids}
        if not holders:
            return
        if time.monotonic() > deadline:
            held = "; ".join(f"{node} runs {', '.join(ids)}" for node, ids in sorted(holders.items()))
            raise DeployError(f"the state was not dropped: after {timeout:.0f} s {held}; run `undeploy --drop-state` again once they stop")
        time.sleep(poll)


def checkpoint_directories(config, instance_ids: list[str]) -> list[Path]:
    """Every checkpoint directory of these instances this machine holds: under the file store's location and
    under `$SP_DAGSTER_HOME/worker-*/` (the workers' local ones, when they share this machine)."""
    from sp_dagster.config.yamlsource import default_home

    roots = [Path(default_home()).expanduser()]
    if config.persistence.enabled and config.persistence.persistence_store == "file":
        roots.append(Path(config.persistence.config.location).expanduser())
    found = []
    for root in roots:
        for checkpoints in [root / "checkpoints", *root.glob("worker-*/checkpoints")]:
            found += [checkpoints / i for i in instance_ids if (checkpoints / i).is_dir()]
    return found


def drop_state(plane, config, instance_ids: list[str], timeout: float = 120.0) -> str:
    """Drop the state of removed instances once no worker runs them; says what went.

    Once the deployment is removed, its workers stop its instances, each with a last checkpoint; this waits
    until every live worker has said (in its heartbeat's `running` list) that it no longer runs any of them.
    The recorded drop makes the app's next deployment start each instance empty at its committed offsets,
    whichever machine this runs on and whatever revisions or checkpoints it cannot reach; what it can reach
    goes too: the instances' revisions in the persistence table and their checkpoint directories.
    """
    from sp_dagster.cluster.store.drops import record_drops
    from sp_dagster.cluster.store.revisions import RevisionStore

    wait_until_released(plane, instance_ids, timeout)
    record_drops(plane, instance_ids, int(time.time() * 1000))
    store = RevisionStore.from_config(config, plane)
    try:
        revisions = store.delete(instance_ids)
    finally:
        store.close()
    directories = checkpoint_directories(config, instance_ids)
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
    return (
        f"dropped the state of {counted(len(instance_ids), 'instance')}: a redeploy starts them empty at their committed offsets "
        f"({counted(revisions, 'revision')} and {counted(len(directories), 'checkpoint directory', 'checkpoint directories')} deleted here)"
    )


def remove_app(plane, config, app: str, *, delete_topics: bool = False, drop: bool = False) -> list[str]:
    """Undeploy `app` (deleting its topics and, with `drop`, its state); the lines `sp-dagster undeploy` prints."""
    from sp_dagster.cluster.store.deployments import list_instances
    from sp_dagster.deploy.steps import undeploy
    from sp_dagster.messaging import transport_for

    instances = [i.instance_id for i in list_instances(plane, app)]
    transport = transport_for(config.messaging) if delete_topics else None
    try:
        deleted = undeploy(plane, app, transport=transport, delete_topics=delete_topics)
    finally:
        if transport is not None:
            transport.close()
    lines = [f"undeployed {app}" + (f"; deleted topics {', '.join(deleted)}" if deleted else "; topics kept")]
    return lines + [drop_state(plane, config, instances) if drop else "its state is kept: a redeploy resumes it (--drop-state drops it)"]
