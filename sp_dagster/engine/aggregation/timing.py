"""Time for incremental aggregations: bucket starts, roll-over times, `within` and `per` values.
Seconds and minutes are fixed lengths; hours, days, months and years start at the local boundary
of the aggregation's time zone (`aggTimeZone`, GMT by default), as Siddhi's
IncrementalTimeConverterUtil does.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sp_dagster.engine.errors import EngineError

#: Siddhi's durations, smallest first; the aggregation tables are named `<A>_<DURATION>`.
DURATIONS = ("SECONDS", "MINUTES", "HOURS", "DAYS", "MONTHS", "YEARS")
#: The parser's duration names (ast.DURATIONS) to Siddhi's.
FROM_AST = {"second": "SECONDS", "minute": "MINUTES", "hour": "HOURS", "day": "DAYS", "month": "MONTHS", "year": "YEARS"}
_PER_NAMES = {
    "SECONDS": ("sec", "second", "seconds"),
    "MINUTES": ("min", "minute", "minutes"),
    "HOURS": ("hour", "hours"),
    "DAYS": ("day", "days"),
    "MONTHS": ("month", "months"),
    "YEARS": ("year", "years"),
}
_FIXED = {"SECONDS": 1000, "MINUTES": 60_000}
GMT = UTC


def zone(name: str | None):
    """The tzinfo of an `aggTimeZone` value (None: GMT); EngineError when it names no zone."""
    if name is None or name.upper() in ("GMT", "UTC", "Z"):
        return GMT
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise EngineError(f"Given timeZone '{name}' for aggregations is invalid. Please provide a valid time zone.") from None


def normalize_per(value) -> str | None:
    """Siddhi's duration for a `per` value ('sec', 'minutes', 'Hours', ...), or None."""
    text = str(value).strip().lower()
    return next((d for d, names in _PER_NAMES.items() if text in names), None)


def _local(ts: int, tz: tzinfo) -> datetime:
    return datetime.fromtimestamp(ts / 1000, tz)


def _millis(moment: datetime) -> int:
    return int(moment.timestamp()) * 1000


def bucket_start(ts: int, duration: str, tz: tzinfo = GMT) -> int:
    """The start of the `duration` bucket holding `ts` (epoch ms)."""
    fixed = _FIXED.get(duration)
    if fixed is not None:
        return ts - ts % fixed
    local = _local(ts, tz)
    if duration == "HOURS":
        local = local.replace(minute=0, second=0, microsecond=0)
    elif duration == "DAYS":
        local = local.replace(hour=0, minute=0, second=0, microsecond=0)
    elif duration == "MONTHS":
        local = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        local = local.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    return _millis(_wall(local, tz))


def next_start(ts: int, duration: str, tz: tzinfo = GMT) -> int:
    """The start of the bucket after the one holding `ts`: when that bucket rolls over."""
    fixed = _FIXED.get(duration)
    if fixed is not None:
        return ts - ts % fixed + fixed
    local = _local(bucket_start(ts, duration, tz), tz)
    if duration == "HOURS":
        naive = local.replace(tzinfo=None) + timedelta(hours=1)
    elif duration == "DAYS":
        naive = local.replace(tzinfo=None) + timedelta(days=1)
    elif duration == "MONTHS":
        naive = local.replace(tzinfo=None, year=local.year + (local.month == 12), month=local.month % 12 + 1)
    else:
        naive = local.replace(tzinfo=None, year=local.year + 1)
    return _millis(_wall(naive.replace(tzinfo=tz), tz))


def _wall(local: datetime, tz: tzinfo) -> datetime:
    """A local wall time in `tz` (re-attached so the offset is that of the wall time)."""
    return local.replace(tzinfo=None).replace(tzinfo=tz)


# ------------------------------------------------------------------ timestamps as text

_OFFSET = r"(?:\s*([+-])(\d{2}):(\d{2}))?"
_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})" + _OFFSET)
_PATTERN = re.compile(r"(\d{4}|\*{4})-(\d{2}|\*\*)-(\d{2}|\*\*) (\d{2}|\*\*):(\d{2}|\*\*):(\d{2}|\*\*)" + _OFFSET)


def _offset(sign, hours, minutes):
    if sign is None:
        return GMT
    delta = timedelta(hours=int(hours), minutes=int(minutes))
    return timezone(delta if sign == "+" else -delta)


def parse_timestamp(text: str) -> int | None:
    """Epoch ms of `yyyy-MM-dd HH:mm:ss` (GMT) or `yyyy-MM-dd HH:mm:ss ±hh:mm`; None if it is neither."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if match is None:
        return None
    parts = [int(p) for p in match.groups()[:6]]
    try:
        return _millis(datetime(*parts, tzinfo=_offset(*match.groups()[6:])))
    except ValueError:
        return None


_WITHIN_FORMATS = (
    "Incorrect format provided for within clause. Supported formats for non GMT timezones are "
    "<yyyy>-**-** **:**:** <ZZ>, <yyyy>-<MM>-** **:**:** <ZZ>, <yyyy>-<MM>-<dd> **:**:** <ZZ>, "
    "<yyyy>-<MM>-<dd> <HH>:**:** <ZZ>, <yyyy>-<MM>-<dd> <HH>:<mm>:** <ZZ>, and "
    "<yyyy>-<MM>-<dd> <HH>:<mm>:<ss> <ZZ>. The ISO 8601 UTC offset must be provided for <ZZ> "
    "(ex. +05:30, -11:00). For GMT timezone the same formats must be adhered to, without <ZZ>. "
    "However the given format is {}."
)


def within_pattern(text: str) -> tuple[int, int]:
    """[start, end) of a `within` pattern such as '2017-06-** **:**:**' (a whole month)."""
    match = _PATTERN.fullmatch(str(text).strip())
    fields = match.groups()[:6] if match else ()
    # the given fields are a prefix: once one is '**', every later one is too
    given = 0
    while given < len(fields) and "*" not in fields[given]:
        given += 1
    if match is None or given == 0 or any("*" not in f for f in fields[given:]):
        raise EngineError(_WITHIN_FORMATS.format(text))
    values = [int(f) for f in fields[:given]] + [1, 1, 0, 0, 0][given - 1 :]
    tz = _offset(*match.groups()[6:])
    try:
        start = datetime(*values[:6], tzinfo=tz)
    except ValueError:
        raise EngineError(_WITHIN_FORMATS.format(text)) from None
    if given == 1:
        end = start.replace(year=start.year + 1)
    elif given == 2:
        end = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
    else:
        end = start + (timedelta(days=1), timedelta(hours=1), timedelta(minutes=1), timedelta(seconds=1))[given - 3]
    return _millis(start), _millis(end)


def within_range(values: list) -> tuple[int, int]:
    """[start, end) of `within` values: one pattern string, or a start and an end (ms or text)."""
    if len(values) == 1:
        value = values[0]
        if not isinstance(value, str):
            raise EngineError(
                "Only one value was given for the within clause; a single value must be a pattern such as '2017-06-** **:**:**', else give a start and an end"
            )
        return within_pattern(value)
    start, end = (_instant(v) for v in values)
    if start >= end:
        raise EngineError(
            f"The start time must be less than the end time in the within clause. However, the given start time is "
            f"{start} and given end time is {end}, in unix time. Hence, start time is not less than end time."
        )
    return start, end


def _instant(value) -> int:
    if isinstance(value, bool) or value is None:
        raise EngineError(f"a within value must be a long (ms) or a 'yyyy-MM-dd HH:mm:ss' string, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        parsed = parse_timestamp(value)
        if parsed is None:
            raise EngineError(
                f"Timestamp '{value}' in the within clause doesn't match the supported formats "
                "<yyyy>-<MM>-<dd> <HH>:<mm>:<ss> (for GMT) and <yyyy>-<MM>-<dd> <HH>:<mm>:<ss> <Z>"
            )
        return parsed
    raise EngineError(f"a within value must be a long (ms) or a 'yyyy-MM-dd HH:mm:ss' string, not {value!r}")
