"""The driver's control line: a task the driver gave up before it connected is turned away at its hello,
and one already on the line keeps it (and is told to stop)."""

from __future__ import annotations

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
