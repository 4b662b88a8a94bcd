"""SiddhiQLError: where a mistake is (line, column, a caret under it) and one sentence on what."""

from __future__ import annotations

from collections.abc import Iterable

from sp_dagster.errors import SpDagsterError
from sp_dagster.siddhi.secrets import mask_secrets


class SiddhiQLError(SpDagsterError):
    """A mistake in SiddhiQL text.

    `message` is one sentence; `line` and `column` are 1-based (0 when unknown); `excerpt`
    is the offending source line with a caret under the column. One error may stand for
    several: `errors` holds every error of the app (just itself for a single one), and the
    error's own fields are those of the first.
    """

    def __init__(
        self,
        message: str,
        line: int = 0,
        column: int = 0,
        *,
        text: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.source = source
        self.excerpt = excerpt(text, line, column) if text is not None else ""
        self.errors: tuple[SiddhiQLError, ...] = (self,)

    @classmethod
    def combine(cls, errors: Iterable[SiddhiQLError]) -> SiddhiQLError:
        """One error standing for all of `errors` (at least one), sorted by position."""
        ordered = sorted(errors, key=lambda e: (e.line, e.column))
        if not ordered:
            raise ValueError("combine() needs at least one error")
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        combined = cls(first.message, first.line, first.column, source=first.source)
        combined.excerpt = first.excerpt
        combined.errors = tuple(ordered)
        return combined

    def attach(self, text: str | None, source: str | None = None) -> SiddhiQLError:
        """Set the source text (for the excerpt) and name on this error and all it stands for."""
        for error in {id(e): e for e in (self, *self.errors)}.values():
            if text is not None and error.line:
                error.excerpt = excerpt(text, error.line, error.column)
            if source is not None:
                error.source = source
        return self

    @property
    def location(self) -> str:
        """`source:line:column` (parts that are unknown are left out)."""
        parts = [self.source] if self.source else []
        if self.line:
            parts += [str(self.line), str(self.column)]
        return ":".join(parts)

    def describe(self) -> str:
        """This error alone: `location: message` and the caret-marked excerpt below it."""
        head = f"{self.location}: {self.message}" if self.location else self.message
        return f"{head}\n{self.excerpt}" if self.excerpt else head

    def __str__(self) -> str:
        return "\n".join(error.describe() for error in self.errors)


def excerpt(text: str, line: int, column: int) -> str:
    """The source line `line` of `text`, indented, with a caret under `column`."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return ""
    source_line = lines[line - 1]
    shown = mask_secrets(source_line).expandtabs(4)  # an error never shows a password written in the app
    before = mask_secrets(source_line[: max(column - 1, 0)]).expandtabs(4)[: len(shown)]
    gutter = f"{line:>4} | "
    return f"{gutter}{shown}\n{' ' * (len(gutter) - 2)}| {' ' * len(before)}^"
