"""The engine: runs a Siddhi app's queries with Siddhi's semantics, in process, over Arrow batches.
No Spark, Kafka or Dagster here: workers wrap AppRuntime; tests and `sp-dagster run` use it directly.
"""

from sp_dagster.engine.errors import EngineError
from sp_dagster.engine.events import Event
from sp_dagster.engine.runtime import AppRuntime

__all__ = ["AppRuntime", "EngineError", "Event"]
