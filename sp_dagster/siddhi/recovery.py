"""Split an app's text into its top-level statements, so each can be re-parsed on its own.
After a syntax error the parser cannot go on, yet users want every mistake at once: the
statements after the failing one are parsed separately.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Strings, comments and quoted names are skipped whole; words and the few characters that
# matter for nesting are the only other tokens looked at.
_TOKEN = re.compile(
    r'"""(?:[^"\\]|\\.|"(?!""))*"""|"[^"\n]*"|\'[^\'\n]*\'|`[^`\n]*`'
    r"|--[^\n]*|//[^\n]*|/\*.*?(?:\*/|$)"
    r"|[A-Za-z_][A-Za-z_0-9]*|[();]",
    re.S,
)


def statements(text: str) -> Iterator[tuple[int, str]]:
    """Each top-level statement as (offset in `text`, chunk padded to its original place)."""
    depth = 0
    in_partition = False
    start = 0
    previous = ""
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token.startswith(("--", "//", "/*")):
            continue
        lowered = token.lower()
        if token == "(":
            depth += 1
        elif token == ")":
            depth = max(depth - 1, 0)
        elif lowered == "begin" and depth == 0 and previous == ")":  # `partition with (...) begin`
            in_partition = True
        elif lowered == "end" and depth == 0 and in_partition:
            in_partition = False
        elif token == ";" and depth == 0 and not in_partition:
            yield from _chunk(text, start, match.start())
            start = match.end()
        previous = token
    yield from _chunk(text, start, len(text))


def _chunk(text: str, start: int, end: int) -> Iterator[tuple[int, str]]:
    """The statement `text[start:end]` padded with the newlines and spaces that preceded it, so positions in its
    errors are those of the app (nothing for a blank one)."""
    body = text[start:end]
    if not body.strip():
        return
    line_start = text.rfind("\n", 0, start) + 1
    padding = "\n" * text.count("\n", 0, start) + " " * (start - line_start)
    yield start, padding + body
