"""The driver's control line: a task the driver gave up before it connected is turned away at its hello,
and one already on the line keeps it (and is told to stop); a held task (prepared ahead of a move) starts
only when released."""

from __future__ import annotations

import threading
import time

import pytest

from sp_dagster.worker.spark.control import ControlServer, DriverControl
from tests.fixtures.waiting import wait_until


def test_a_task_given_up_before_it_connected_is_turned_away_and_one_on_the_line_keeps_it():
    server = ControlServer(lease=lambda: 5.0)
    try:
        early, late = server.open(b"start", lambda _data: None), server.open(b"start", lambda _data: None)
        on_line = DriverControl(server.address, server.authkey, early.token)
        assert on_line.start_checkpoint == b"start"
        # Given up while its job was still starting, its hello racing the driver: found, but turned away.
        late.abandon()
        with pytest.raises((EOFError, OSError)):
            DriverControl(server.address, server.authkey, late.token)
        assert not late.connected
        server.forget(late)
        with pytest.raises((EOFError, OSError)):
            DriverControl(server.address, server.authkey, late.token)  # and once forgotten, unknown
        # The one already on the line keeps it after being given up, and is told to stop rather than cut off.
        server.forget(early)
        assert early.connected and early.send(("stop", True))
        assert wait_until(on_line.commands, 5, 0.05, "the stop command") == [("stop", True)]
        on_line.close("stopped")
        assert wait_until(early.finished.is_set, 5, 0.05, "the task's last word") and early.reason == "stopped"
    finally:
        server.close()


def test_a_held_task_starts_only_when_released_from_the_checkpoint_given_then_and_one_stopped_first_opens_nothing():
    server = ControlServer(lease=lambda: 5.0)
    try:
        moving, given_up = server.open(None, lambda _data: None, held=True), server.open(None, lambda _data: None, held=True)
        started: dict[str, DriverControl] = {}
        tasks = [
            threading.Thread(target=lambda name=name, link=link: started.__setitem__(name, DriverControl(server.address, server.authkey, link.token)))
            for name, link in (("moving", moving), ("given_up", given_up))
        ]
        for task in tasks:
            task.start()
        wait_until(lambda: moving.connected and given_up.connected, 5, 0.05, "both tasks on the line")
        time.sleep(0.3)  # long enough for a start the driver should not have sent to arrive
        assert started == {}, "a held task started before it was released"
        moving.release(b"the old owner's last checkpoint")
        tasks[0].join(5)
        assert started["moving"].start_checkpoint == b"the old owner's last checkpoint" and not started["moving"].stopped_before_start
        # The move went elsewhere: told to stop while held, the task ends at once, without a start.
        assert given_up.send(("stop", False))
        tasks[1].join(5)
        assert started["given_up"].stopped_before_start and started["given_up"].start_checkpoint is None
    finally:
        server.close()
