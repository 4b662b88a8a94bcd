"""The Dagster layer's errors."""

from sp_dagster.errors import SpDagsterError


class DemoError(SpDagsterError):
    """`sp-dagster up` could not bring the system up (what failed, and where its log is)."""


class TranslatorError(SpDagsterError):
    """A translator gave two assets one key."""


class ComponentError(SpDagsterError):
    """A defs.yaml of SpDagsterComponent names a path that does not exist."""
