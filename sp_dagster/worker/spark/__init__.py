"""The Spark runtimes of instances: continuous long-running tasks, micro-batch queries, and the Kafka and NATS sources and sinks they read and write through."""
