"""Dagster, the user's window: resources, the app-repository sensor, deploy/undeploy/rebalance jobs,
partial apps as assets with lineage, health observations and checks, manager and worker runs,
and the one-command demo (`sp-dagster up` / `down`)."""
