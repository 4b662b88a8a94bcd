"""The instance core, free of Spark: an instance's plan, its engine runtime, the loop that reads, runs and publishes, and its checkpoints."""
