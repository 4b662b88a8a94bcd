"""Stream schemas: attribute names and Siddhi types, with their Arrow form."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from sp_dagster.engine.values import ARROW_TYPES

#: Where a Schema keeps its Arrow schema once made (in its name index, under a key no name can be).
_ARROW = object()


@dataclass(frozen=True)
class Schema:
    """The attributes of a stream, in order."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    _index: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({name: i for i, name in enumerate(self.names)})
        object.__setattr__(self, "arrow_capable", all(t in ARROW_TYPES for t in self.types))

    @classmethod
    def of(cls, attributes: Iterable[tuple[str, str]]) -> Schema:
        """A schema from (name, type) pairs."""
        pairs = list(attributes)
        return cls(tuple(n for n, _ in pairs), tuple(t for _, t in pairs))

    def index(self, name: str) -> int | None:
        """The position of attribute `name`, or None."""
        return self._index.get(name)

    def __len__(self) -> int:
        return len(self.names)

    #: True when every attribute has an Arrow type (no `object` attributes); set in __post_init__
    arrow_capable: bool = field(default=False, init=False, compare=False, repr=False)

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of this stream (made once)."""
        made = self._index.get(_ARROW)
        if made is None:
            made = self._index[_ARROW] = pa.schema([pa.field(n, ARROW_TYPES[t]) for n, t in zip(self.names, self.types)])
        return made

    def describe(self) -> str:
        """`(a int, b string)`."""
        return "(" + ", ".join(f"{n} {t}" for n, t in zip(self.names, self.types)) + ")"
