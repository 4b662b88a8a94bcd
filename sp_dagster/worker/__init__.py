"""Workers: long-running Spark applications that run partial-app instances as streaming queries."""
