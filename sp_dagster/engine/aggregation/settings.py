"""The AppRuntime settings of incremental aggregations, from Siddhi properties or deployment.yaml.

    AppRuntime(text, **runtime_settings(config))              # a worker, `sp-dagster query --conf`
    AppRuntime(text, **property_settings({"shardId": "n1"}))  # Siddhi's own property names

`shard_id` tags the rows this runtime writes (`siddhi.properties.shardId`, else the node id
`wso2.carbon.id`), `partition_by_id` makes every aggregation distributed
(`siddhi.properties.partitionById`), `agg_time_zone` places hour/day/month/year boundaries.
"""

from __future__ import annotations


def property_settings(properties: dict | None) -> dict:
    """AppRuntime keyword arguments for Siddhi properties (shardId, partitionById, aggTimeZone)."""
    properties = properties or {}
    return {
        "shard_id": properties.get("shardId"),
        "partition_by_id": str(properties.get("partitionById", "false")).lower() == "true",
        "agg_time_zone": properties.get("aggTimeZone"),
    }


def runtime_settings(config) -> dict:
    """AppRuntime keyword arguments for a deployment config: datasources, shard id, partitionById."""
    return {
        "datasources": config.datasources,
        "shard_id": config.shard_id,
        "partition_by_id": config.siddhi.properties.partition_by_id,
    }
