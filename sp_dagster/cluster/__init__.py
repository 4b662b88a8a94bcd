"""The control plane: a relational database shared by managers and workers (SQLAlchemy 2).
It holds leader election with a fencing term, membership and heartbeats, deployments and the
placement of their instances, state revisions and an event log; SQLite, MySQL/MariaDB and
PostgreSQL behave the same. How it works: docs/concepts/control-plane.md.
"""

# What the other layers call:
# - the deploy step: record_deployment, remove_deployment, get_deployment, list_deployments, list_instances
#   (with InstanceSpec, instance_id_for), and request_rebalance;
# - a worker: NodeSession (register, heartbeat, fencing, its assignments, status reports), and RevisionStore
#   for its state (in the seeds' persistence table; owner-fenced saves);
# - a manager: Manager (the loop behind `sp-dagster manager`);
# - anyone: ControlPlane (open a database), current_leader, cluster_status.
from sp_dagster.cluster.allocation import (
    Allocation,
    AllocationAlgorithm,
    AllocationRequest,
    BalancedAllocation,
    InstanceInfo,
    NodeInfo,
    load_algorithm,
)
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import LeaderInfo, current_leader, request_rebalance
from sp_dagster.cluster.fencing import NodeSession, NodeStatus
from sp_dagster.cluster.manager import Manager
from sp_dagster.cluster.membership import NodeRecord, list_nodes
from sp_dagster.cluster.status import cluster_status
from sp_dagster.cluster.store.assignments import AssignedInstance, NodeAssignments, assignments_for
from sp_dagster.cluster.store.deployments import (
    DeploymentRecord,
    InstanceRecord,
    InstanceSpec,
    RecordResult,
    get_deployment,
    instance_id_for,
    list_deployments,
    list_instances,
    record_deployment,
    remove_deployment,
    report_instance_status,
)
from sp_dagster.cluster.store.revisions import Revision, RevisionStore

__all__ = [
    "AssignedInstance",
    "Allocation",
    "AllocationAlgorithm",
    "AllocationRequest",
    "BalancedAllocation",
    "ControlPlane",
    "DeploymentRecord",
    "InstanceInfo",
    "InstanceRecord",
    "InstanceSpec",
    "LeaderInfo",
    "Manager",
    "NodeAssignments",
    "NodeInfo",
    "NodeRecord",
    "NodeSession",
    "NodeStatus",
    "RecordResult",
    "Revision",
    "RevisionStore",
    "assignments_for",
    "cluster_status",
    "current_leader",
    "get_deployment",
    "instance_id_for",
    "list_deployments",
    "list_instances",
    "list_nodes",
    "load_algorithm",
    "record_deployment",
    "remove_deployment",
    "report_instance_status",
    "request_rebalance",
]
