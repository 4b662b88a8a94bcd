"""Triggers (`define trigger T at 'start' | at every <time> | at '<cron>'`).
A trigger is a stream `T (triggered_time long)`; each firing sends one event whose timestamp and
triggered_time are the firing time. Periodic and cron triggers run on the engine clock's scheduler,
so in playback they fire as event time advances (Siddhi keeps them on the wall clock).
"""

from __future__ import annotations

import re
from datetime import datetime

from croniter import CroniterBadDateError, CroniterError, croniter
from dateutil import tz

from sp_dagster.engine.clock import Scheduler, TimerQueue
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import StreamEvent
from sp_dagster.engine.junction import StreamJunction
from sp_dagster.engine.schema import Schema
from sp_dagster.siddhi import ast

SCHEMA = Schema(("triggered_time",), ("long",))


class Trigger:
    """One `define trigger`: its stream and, for periodic and cron triggers, its timer."""

    def __init__(self, definition: ast.TriggerDefinition, context):
        self.name = definition.name
        self.clock = context.clock
        self.junction = StreamJunction(self.name, SCHEMA)
        self.period: int | None = None
        self.cron: QuartzCron | None = None
        if definition.every is not None:
            self.period = definition.every.millis
            if self.period <= 0:
                raise app_error(f"trigger {self.name}: the period must be longer than zero", definition.every)
        elif (definition.at or "").strip().lower() != "start":
            try:
                self.cron = QuartzCron(definition.at or "")
            except ValueError as exc:
                raise app_error(f"trigger {self.name}: {exc}", definition) from None
        self.fired = False  # a start trigger: it has fired
        self.next: int | None = None  # a periodic or cron trigger: when it fires next
        self.timers: TimerQueue | None = None  # a periodic or cron trigger's timer
        if self.periodic:
            scheduler = _AnchoredScheduler(self, f"trigger:{self.name}")
            self.clock.schedulers.append(scheduler)
            self.timers = scheduler.queue(self._fire)
            if not self.clock.playback:
                self._arm(self._following(self.clock.now()))

    @property
    def periodic(self) -> bool:
        """True for `at every` and cron triggers."""
        return self.period is not None or self.cron is not None

    def start(self) -> None:
        """The runtime starts: a start trigger fires (once), stamped with the clock now (0 in playback
        before any event has moved it)."""
        if not self.periodic and not self.fired:
            self.fired = True
            now = self.clock.now()
            self.junction.send([StreamEvent(now, (now,))])

    def anchor(self) -> None:
        """Playback: event time has moved for the first time; the schedule starts now."""
        if self.next is None:
            self._arm(self._following(self.clock.now()))

    def _following(self, after: int) -> int | None:
        if self.period is not None:
            return after + self.period
        assert self.cron is not None  # a periodic trigger without a period has a cron
        return self.cron.next_after(after)

    def _arm(self, when: int | None) -> None:
        self.next = when
        if when is not None:
            assert self.timers is not None  # only a periodic trigger is armed, and it has its timer
            self.timers.notify_at(when)

    def _fire(self, when: int) -> None:  # fixed rate: a late firing keeps its scheduled time
        self._arm(self._following(when))
        self.junction.send([StreamEvent(when, (when,))])

    # -- state

    def snapshot(self):
        """Whether 'start' fired, or when a periodic trigger fires next."""
        return self.next if self.periodic else self.fired

    def restore(self, state) -> None:
        """Inverse of snapshot()."""
        if not self.periodic:
            self.fired = bool(state)
            return
        assert self.timers is not None  # a periodic trigger has its timer
        self.timers.restore([])
        self.next = None
        if state is None:
            if not self.clock.playback:
                self._arm(self._following(self.clock.now()))
            return
        when, now = state, self.clock.now()
        if not self.clock.playback and when <= now:
            # the runtime was down meanwhile: keep the phase, skip what passed
            if self.period is not None:
                when = now + self.period - (now - when) % self.period
            else:
                assert self.cron is not None  # a periodic trigger without a period has a cron
                when = self.cron.next_after(now)
        self._arm(when)

    def stop(self) -> None:
        """Release the timer."""
        if self.timers is not None:
            self.timers.scheduler.discard(self.timers)


class _AnchoredScheduler(Scheduler):
    """A trigger's scheduler: in playback, the first move of event time starts the schedule."""

    def __init__(self, trigger: Trigger, name: str):
        super().__init__(trigger.clock, name)
        self.trigger = trigger

    def fire_due(self) -> None:
        if self.trigger.next is None and self.clock.playback:
            self.trigger.anchor()
        super().fire_due()


def triggers(app: ast.App, context) -> dict[str, Trigger]:
    """Build every trigger of `app`, registering its stream."""
    built = {}
    for definition in app.definitions:
        if isinstance(definition, ast.TriggerDefinition):
            trigger = built[definition.name] = Trigger(definition, context)
            context.schemas[trigger.name] = SCHEMA
            context.junctions[trigger.name] = trigger.junction
    return built


# --------------------------------------------------------------------------- Quartz cron

_FIELDS = ("second", "minute", "hour", "day-of-month", "month", "day-of-week", "year")
_DAY_NUMBER = re.compile(r"(?<![A-Za-z#/])(\d+)")


class QuartzCron:
    """A Quartz cron expression, evaluated with croniter (whose days of the week count from 0).

    Seconds first (`sec min hour day-of-month month day-of-week [year]`), exactly one of the two
    day fields `?`, days of the week 1-7 = SUN-SAT.
    """

    def __init__(self, text: str):
        self.text = text.strip()
        fields = self.text.split()
        if len(fields) not in (6, 7):
            raise ValueError(
                f"'{self.text}' is neither 'start' nor a cron expression: a Quartz cron expression has 6 or 7 "
                "fields (second minute hour day-of-month month day-of-week [year])"
            )
        day_of_month, day_of_week = fields[3], fields[5]
        if (day_of_month == "?") == (day_of_week == "?"):
            raise ValueError(f"cron '{self.text}': exactly one of day-of-month and day-of-week must be '?' (Quartz does not support giving both)")
        for index, field in enumerate(fields):
            if "?" in field and (index not in (3, 5) or field != "?"):
                raise ValueError(f"cron '{self.text}': '?' can only stand alone in day-of-month or day-of-week")
        upper = day_of_month.upper()
        if upper.startswith("L") and upper != "L":
            raise ValueError(f"cron '{self.text}': day-of-month '{day_of_month}' (L-n, LW) is not supported")
        fields[3] = "*" if day_of_month == "?" else day_of_month
        fields[5] = "*" if day_of_week == "?" else _day_of_week(day_of_week, self.text)
        self.expression = " ".join(fields)
        self.zone = tz.tzlocal()  # Quartz's default: the machine's local time zone
        self._last: tuple[int, croniter] | None = None
        try:
            croniter(self.expression, datetime.now(self.zone), second_at_beginning=True)
        except CroniterError as exc:
            raise ValueError(f"cron '{self.text}' is not valid: {_plain(exc)}") from None

    def next_after(self, millis: int) -> int | None:
        """The first time (epoch ms) strictly after `millis` that the expression names, or None."""
        if self._last is not None and self._last[0] == millis:
            iterator = self._last[1]  # the usual call: the time it returned last
        else:
            iterator = croniter(self.expression, datetime.fromtimestamp(millis / 1000, self.zone), second_at_beginning=True)
        try:
            seconds = iterator.get_next(float)
        except CroniterBadDateError:
            self._last = None
            return None  # past its last year
        following = int(round(seconds * 1000))
        self._last = (following, iterator)
        return following


def _day_of_week(field: str, text: str) -> str:
    """A Quartz day-of-week field (1-7 = SUN-SAT, nL, n#k, L) in croniter's terms (0-6)."""
    items = []
    for item in field.split(","):
        upper = item.upper()
        if upper == "L":
            items.append("6")  # alone, L is the last day of the week: Saturday
            continue
        if upper.endswith("L"):
            day = upper[:-1]
            items.append("L" + (_shift(day, text) if day.isdigit() else day))
            continue
        items.append(_DAY_NUMBER.sub(lambda m: _shift(m.group(1), text), item))
    return ",".join(items)


def _shift(number: str, text: str) -> str:
    value = int(number)
    if not 1 <= value <= 7:
        raise ValueError(f"cron '{text}': days of the week are 1-7 (SUN-SAT), not {value}")
    return str(value - 1)


def _plain(exc: Exception) -> str:
    return str(exc).rstrip(".")
