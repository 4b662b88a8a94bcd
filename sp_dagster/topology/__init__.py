"""Topology planning: a distributed SiddhiQL app becomes execution groups, topics and partial apps.
Pure functions over the parsed app (sp_dagster.siddhi); nothing here touches Kafka or Spark.
"""

from sp_dagster.topology.errors import TopologyError
from sp_dagster.topology.model import (
    ALL,
    FIELD_GROUPING,
    ROUND_ROBIN,
    ExecutionGroup,
    PartialApp,
    Publication,
    Subscription,
    TopicSpec,
    Topology,
)
from sp_dagster.topology.planner import plan
from sp_dagster.topology.topics import partition_numbers, topic_name

__all__ = [
    "ALL",
    "FIELD_GROUPING",
    "ROUND_ROBIN",
    "ExecutionGroup",
    "PartialApp",
    "Publication",
    "Subscription",
    "TopicSpec",
    "Topology",
    "TopologyError",
    "partition_numbers",
    "plan",
    "topic_name",
]
