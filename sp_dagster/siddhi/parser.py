"""Parse SiddhiQL text into the AST, turning lark's syntax errors into SiddhiQLErrors."""

from __future__ import annotations

import difflib
import functools
from importlib import resources
from typing import Any

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.errors import SiddhiQLError
from sp_dagster.siddhi.recovery import statements
from sp_dagster.siddhi.transformer import AstBuilder

_STARTS = ("app", "on_demand_query", "expression")
_ELEMENT_WORDS = {"define", "from", "partition"}
_EXPRESSION_STARTS = {"NAME", "NUMBER", "STRING", "LPAR", "MINUS", "NOT", "TRUE", "FALSE", "HASH"}
_OPERATORS = {"EQ", "NE", "GE", "LE", "GT", "LT", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "AND", "OR", "IN", "_IS"}
_TYPES = {"TYPE_STRING", "TYPE_INT", "TYPE_LONG", "TYPE_FLOAT", "TYPE_DOUBLE", "TYPE_BOOL", "TYPE_OBJECT"}
_DESCRIPTIONS = {
    "NAME": "a name",
    "QUOTED_NAME": "",
    "STRING": "a string",
    "NUMBER": "a number",
    "SCRIPT": "a function body in braces",
    "AT_SIGN": "an annotation",
    "$END": "the end of the text",
}


class _NamesEverywhere:
    """Let every lexer state match names, so a keyword is only ever read as a whole word.

    The contextual lexer only tries the terminals a parser state accepts; where no name is
    accepted, the keyword `in` would otherwise match the start of `into`. With NAME always
    present, lark reads a word whole and turns it into a keyword only when the state
    accepts that keyword; any other word stays a name, which the parser then reports.
    """

    always_accept = ("NAME",)

    def process(self, stream):
        return stream


@functools.cache
def _parser() -> Lark:
    grammar = resources.files("sp_dagster.siddhi").joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        start=list(_STARTS),
        transformer=AstBuilder(),
        postlex=_NamesEverywhere(),
        cache=True,  # the parse tables, in the temp directory: loading drops from ~0.3 s to ~0.02 s
    )


def parse(text: str, source: str | None = None) -> ast.App:
    """Parse a Siddhi app; raise SiddhiQLError (standing for every syntax error found).

    >>> from sp_dagster import parse
    >>> app = parse("@App:name('Shop') define stream Orders (id int, total double);")
    >>> app.name
    'Shop'
    """
    return _parse(text, "app", source)


def parse_on_demand_query(text: str, source: str | None = None) -> ast.OnDemandQuery:
    """Parse an on-demand (store) query such as `from T on price > 5 select symbol`."""
    return _parse(text, "on_demand_query", source)


def parse_expression(text: str, source: str | None = None) -> ast.Expression:
    """Parse a single SiddhiQL expression such as `price * 2 > 10`."""
    return _parse(text, "expression", source)


def _parse(text: str, start: str, source: str | None) -> Any:
    # Any: lark types parse() as a ParseTree, but with AstBuilder as its transformer it returns
    # the AST node of rule `start` (parse() and the other wrappers above name which)
    try:
        return _parser().parse(text, start=start)
    except (UnexpectedInput, SiddhiQLError) as exc:
        first = _translate(exc)
    errors = [first]
    if start == "app":
        errors += _later_errors(text, first)
    raise SiddhiQLError.combine(errors).attach(text, source)


def _later_errors(text: str, first: SiddhiQLError) -> list[SiddhiQLError]:
    """Syntax errors of the statements after the one that failed, each parsed on its own."""
    line_starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    failed_at = line_starts[first.line - 1] + first.column - 1 if 0 < first.line <= len(line_starts) else len(text)
    found = []
    for offset, chunk in statements(text):
        if offset <= failed_at:
            continue
        try:
            _parser().parse(chunk, start="app")
        except (UnexpectedInput, SiddhiQLError) as exc:
            found.append(_translate(exc))
    return found


def _translate(exc: Exception) -> SiddhiQLError:
    """A SiddhiQLError for any exception lark raises while parsing."""
    if isinstance(exc, SiddhiQLError):
        return exc
    if isinstance(exc, UnexpectedToken):
        return SiddhiQLError(_unexpected_token(exc), exc.line if exc.line != "?" else 0, _column(exc))
    if isinstance(exc, UnexpectedCharacters):
        return SiddhiQLError(_unexpected_character(exc.char), exc.line, exc.column)
    return SiddhiQLError(str(exc).splitlines()[0], getattr(exc, "line", 0), getattr(exc, "column", 0))


def _column(exc: UnexpectedToken) -> int:
    return exc.column if isinstance(exc.column, int) else 0


def _unexpected_character(char: str) -> str:
    if char in "'\"":
        return "This string is not closed before the end of the line."
    if char == "`":
        return "This quoted name is not closed before the end of the line."
    return f"Unexpected character '{char}'."


def _unexpected_token(exc: UnexpectedToken) -> str:
    token: Token = exc.token
    found = "end of text" if token.type == "$END" else f"'{token}'"
    expected = _expected(exc)
    starts_element = token.type == "AT_SIGN" or token.lower() in _ELEMENT_WORDS
    if "SEMICOLON" in expected and starts_element:
        return f"Missing ';' before {found}."
    if token.type == "$END" and "_END" in expected:
        return "This partition is not closed with 'end'."
    if expected and expected <= _TYPES:
        return f"Unknown attribute type {found}; use string, int, long, float, double, bool or object."
    misspelled = _close_keyword(token, expected)
    if misspelled:
        return f"Unexpected {found}; did you mean '{misspelled}'?"
    return f"Unexpected {found}; expected {_describe(expected)}."


def _close_keyword(token: Token, expected: set[str]) -> str | None:
    """The expected keyword `token` is a likely misspelling of (`slect` for `select`), if any."""
    if token.type != "NAME":
        return None
    descriptions = _terminal_descriptions()
    keywords = [descriptions[n].strip("'") for n in expected if descriptions.get(n, "").strip("'").isalpha()]
    close = difflib.get_close_matches(token.lower(), keywords, n=1, cutoff=0.75)
    return close[0] if close else None


def _expected(exc: UnexpectedToken) -> set[str]:
    """The terminals the parser would have accepted (exact, unlike LALR's merged lookaheads)."""
    parser = getattr(exc, "interactive_parser", None)
    try:
        return set(parser.accepts()) if parser is not None else set(exc.expected)
    except Exception:  # accepts() replays reductions; fall back to lark's own estimate
        return set(exc.expected)


def _describe(expected: set[str]) -> str:
    """The expected terminals as words: "an operator, ',' or 'insert'"."""
    words = []
    for group, word in ((_EXPRESSION_STARTS, "an expression"), (_OPERATORS, "an operator")):
        if len(expected & group) >= 4:
            words.append(word)
            expected = expected - group - {"QUOTED_NAME"}
    descriptions = _terminal_descriptions()
    words += sorted({descriptions.get(name, name) for name in expected} - {""}, key=_word_order)
    if len(words) > 8:
        words = words[:7] + [f"{len(words) - 7} more"]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _word_order(word: str) -> tuple[int, str]:
    return (0 if word.startswith("'") else 1, word)


@functools.cache
def _terminal_descriptions() -> dict[str, str]:
    descriptions = dict(_DESCRIPTIONS)
    for terminal in _parser().terminals:
        if terminal.name not in descriptions and terminal.pattern.type == "str":
            descriptions[terminal.name] = f"'{terminal.pattern.value}'"
    return descriptions
