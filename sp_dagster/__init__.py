"""sp-dagster: distributed SiddhiQL streaming apps on Kafka and Spark, orchestrated by Dagster."""
