"""The AppRuntime settings of incremental aggregations, from Siddhi properties or deployment.yaml.
`shard_id` tags the rows a runtime writes, `partition_by_id` makes every aggregation distributed,
`agg_time_zone` places hour/day/month/year boundaries.
"""

from __future__ import annotations


def property_settings(properties: dict | None) -> dict:
    """AppRuntime keyword arguments for Siddhi properties (shardId, partitionById, aggTimeZone).

    `AppRuntime(text, **property_settings({"shardId": "n1"}))`: Siddhi's own property names.
    """
    properties = properties or {}
    return {
        "shard_id": properties.get("shardId"),
        "partition_by_id": str(properties.get("partitionById", "false")).lower() == "true",
        "agg_time_zone": properties.get("aggTimeZone"),
    }


def runtime_settings(config) -> dict:
    """AppRuntime keyword arguments for a deployment config: datasources, shard id, partitionById.

    `AppRuntime(text, **runtime_settings(config))`, as a worker and `sp-dagster query --conf` build
    it. The shard id is `siddhi.properties.shardId`, else the node id `wso2.carbon.id`;
    partitionById is `siddhi.properties.partitionById`.
    """
    return {
        "datasources": config.datasources,
        "shard_id": config.shard_id,
        "partition_by_id": config.siddhi.properties.partition_by_id,
    }
