"""Windows, found by name (`#window.length(10)` -> WINDOWS["length"])."""

from __future__ import annotations

from sp_dagster.engine.windows import external, frequent, length, session, sort, time
from sp_dagster.engine.windows.base import Param, WindowContext, WindowProcessor

WINDOWS: dict[str, type[WindowProcessor]] = {
    **length.WINDOWS,
    **time.WINDOWS,
    **external.WINDOWS,
    **sort.WINDOWS,
    **session.WINDOWS,
    **frequent.WINDOWS,
}

__all__ = ["WINDOWS", "Param", "WindowContext", "WindowProcessor"]
