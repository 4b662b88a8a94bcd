"""Which attributes an expression may name, and what each reference resolves to."""

from __future__ import annotations

from dataclasses import dataclass, field

from sp_dagster.siddhi import ast

Attributes = tuple[ast.AttributeDef, ...]


@dataclass(frozen=True)
class Source:
    """Something a query reads, named by any of `qualifiers`: a stream, alias, event or table."""

    qualifiers: frozenset[str]
    attributes: Attributes
    inner: bool = False  # an inner stream of a partition, named as `#S`
    event: bool = False  # a pattern/sequence event (`e1`), which may be indexed
    label: str = ""  # the name to suggest when a reference must be qualified

    def attribute(self, name: str) -> ast.AttributeDef | None:
        """The attribute called `name`, or None."""
        return next((a for a in self.attributes if a.name == name), None)


@dataclass(frozen=True)
class Resolution:
    """What a reference resolved to: its type, or an error sentence (both None: unknown)."""

    type: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Scope:
    """The sources a query's expressions can name.

    `local` is the source whose attributes unqualified names find first (the stream a
    filter sits on); `outputs` are the query's output attributes, found first by
    unqualified names in `having`, `order by` and table conditions; `incomplete` is set when
    some input could not be resolved, so that failed lookups stay silent instead of
    repeating that error.
    """

    sources: tuple[Source, ...] = ()
    local: Source | None = None
    outputs: Attributes = ()
    incomplete: bool = False
    events: frozenset[str] = field(default=frozenset())

    def with_source(self, source: Source) -> Scope:
        """This scope with one more source (e.g. the table of an `in` condition)."""
        return Scope(self.sources + (source,), self.local, self.outputs, self.incomplete, self.events)

    def with_outputs(self, outputs: Attributes) -> Scope:
        """This scope where unqualified names look in the query's outputs first."""
        return Scope(self.sources, self.local, outputs, self.incomplete, self.events)

    def resolve(self, variable: ast.Variable) -> Resolution:
        """The type of the attribute `variable` names, or why it names none."""
        if variable.stream is not None:
            return self._qualified(variable)
        for first in (self.outputs, self.local.attributes if self.local else ()):
            found = next((a for a in first if a.name == variable.name), None)
            if found is not None:
                return Resolution(found.type)
        matches = [s for s in self.sources if s.attribute(variable.name) is not None]
        if len(matches) == 1:
            attribute = matches[0].attribute(variable.name)
            assert attribute is not None  # matches has the sources that have it
            return Resolution(attribute.type)
        if matches:
            labels = [s.label for s in matches]
            if all(labels) and len(set(labels)) == len(labels):
                how = "write " + " or ".join(f"{label}.{variable.name}" for label in labels)
            else:
                how = "give the inputs names with 'as' and qualify it"
            return Resolution(error=f"Attribute '{variable.name}' is ambiguous here; {how}.")
        return self._missing(f"No input of this query has an attribute '{variable.name}'.")

    def _qualified(self, variable: ast.Variable) -> Resolution:
        # `#S.x` names only an inner stream; `S.x` names a stream, alias or event called S.
        assert variable.stream is not None  # resolve() sends only qualified names here
        candidates = [s for s in self.sources if variable.stream in s.qualifiers and (s.inner or not variable.inner)]
        if not candidates:
            shown = ("#" if variable.inner else "") + variable.stream
            return self._missing(f"'{shown}' is not a stream, alias or event read by this query.")
        if len(candidates) > 1 and len({c.attributes for c in candidates}) > 1:
            return Resolution(error=f"'{variable.stream}' names more than one input here; use an alias.")
        found = candidates[0].attribute(variable.name)
        if found is None:
            return self._missing(f"'{variable.stream}' has no attribute '{variable.name}'.")
        return Resolution(found.type)

    def _missing(self, error: str) -> Resolution:
        return Resolution() if self.incomplete else Resolution(error=error)

    def is_event(self, name: str) -> bool:
        """True when `name` is a pattern/sequence event of this query (as in `e2 is null`)."""
        return name in self.events
