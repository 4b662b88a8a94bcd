"""Which held topics a chaos run lays at the broker's door (`ChaosRun.broker_wedge`), from the workers' logs
and the final status as a run leaves them: only where the writer of the first held message was followed by a new owner
of its transactional id, or kept running to the end."""

from __future__ import annotations

import re

from sp_dagster.embedded.chaos import ChaosRun

LOG = """\
2026-12-04 06:10:07,180 INFO [A-average-3] sp_dagster.messaging.kafka: transactions as 'sp-dagster.A-average-3' (writer aaaa000000000001)
2026-12-04 06:10:07,251 INFO [A-average-1] sp_dagster.messaging.kafka: transactions as 'sp-dagster.A-average-1' (writer aaaa000000000002)
2026-12-04 06:10:25,713 INFO [A-average-1] sp_dagster.messaging.kafka: transactions as 'sp-dagster.A-average-1' (writer aaaa000000000003)
"""
STATUS = """\
  INSTANCE     NODE      TERM  STATUS   EVENTS/S  LAG
  A-average-1  worker-1  1     running  0         1
  A-average-3  worker-2  1     stopped  0         1
"""


class _Logs:
    """The cluster's logs as the run left them (no processes: only what broker_wedge reads)."""

    def grep(self, pattern: str) -> list[str]:
        return [line for line in LOG.splitlines() if re.search(pattern, line)]


def _run(writer: str, status: str = STATUS, topic: str = "A.Averages") -> ChaosRun:
    run = ChaosRun.__new__(ChaosRun)
    run.cluster, run.output_topic, run.final_status = _Logs(), "A.Averages", status  # type: ignore[assignment]
    run.held = {(topic, 0): (1503, {"sp-writer": f"{writer}:17", "sp-origin": "x"})}
    return run


def test_a_writer_followed_by_a_new_owner_of_its_id_leaves_the_broker_to_blame():
    wedge = _run("aaaa000000000002").broker_wedge()
    assert wedge is not None and "A.Averages[0] is held from offset 1503" in wedge and "'sp-dagster.A-average-1'" in wedge
    assert "a new owner of its id started after it" in wedge


def test_the_last_writer_of_a_running_instance_leaves_the_broker_to_blame():
    wedge = _run("aaaa000000000003").broker_wedge()
    assert wedge is not None and "it kept committing to the end" in wedge


def test_a_last_writer_whose_instance_stopped_is_not_excused():
    assert _run("aaaa000000000001").broker_wedge() is None


def test_an_unknown_writer_or_another_topic_is_not_excused():
    assert _run("ffff000000000000").broker_wedge() is None
    assert _run("aaaa000000000002", topic="A.BigTradeStream.symbol").broker_wedge() is None


def test_a_deploy_stopped_by_a_held_inner_topic_looks_at_every_topic_of_the_app():
    # An instance reads its outputs to their end before it runs, so a held inner topic stops a deploy instead.
    wedge = _run("aaaa000000000002", topic="A.BigTradeStream.symbol").broker_wedge(any_topic=True)
    assert wedge is not None and wedge.startswith("A.BigTradeStream.symbol[0] is held from offset 1503")
    assert _run("aaaa000000000001", topic="A.BigTradeStream.symbol").broker_wedge(any_topic=True) is None


def test_outputs_seen_live_but_gone_from_the_fresh_read_are_reported_with_where_they_were_seen():
    run = ChaosRun.__new__(ChaosRun)
    kept, gone, replaced = ("S1", 1.0, 1), ("S2", 2.0, 2), ("S3", 3.0, 3)
    run.rows, run.final, run.final_offsets = [("e",)] * 3, [kept, ("S4", 4.0, 4)], {0, 2}
    run.got = [(kept, 1.0), (gone, 2.0), (replaced, 3.0)]
    run.got_at = {kept: (0, "w1:1"), gone: (1, "w1:2"), replaced: (2, "w2:1")}
    report = run.verdict([kept, gone, replaced], [])
    assert (report.lost, report.live_only) == (2, 2)
    assert report.live_only_seen == [
        {"row": ["S2", 2.0, 2], "offset": 1, "writer": "w1:2", "offset_in_final": False},  # skipped at the fresh read (aborted, or gone)
        {"row": ["S3", 3.0, 3], "offset": 2, "writer": "w2:1", "offset_in_final": True},  # another output stands there now
    ]
    assert report.lines()[-1]["live_only_seen"] == report.live_only_seen
