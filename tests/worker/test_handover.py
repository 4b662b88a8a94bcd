"""Reading where a micro-batch query stopped from its checkpoint's offset log (spark/handover.py), in both sources' shapes."""

from __future__ import annotations

import pytest

from sp_dagster.worker.spark.handover import HandoverError, committed_offsets, handed_over_since, mark, take_over

METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1796440050814,"conf":{}}'


def checkpoint(tmp_path, batches: dict[int, list[str]], committed: list[int]):
    """A query checkpoint with these batches' offset lines (one per source) and these batches committed."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, sources in batches.items():
        (tmp_path / "offsets" / str(batch)).write_text("\n".join(["v1", METADATA, *sources]))
    for batch in committed:
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return tmp_path


def test_the_last_committed_batch_gives_each_topic_its_positions_not_a_batch_still_running(tmp_path):
    found = checkpoint(tmp_path, {0: ['{"0":3}', '{"1":2}'], 1: ['{"0":9}', '{"1":5}'], 2: ['{"0":12}', '{"1":7}']}, committed=[0, 1])
    assert committed_offsets(found, ["A", "B"]) == {"A": {0: 9}, "B": {1: 5}}  # batch 2 runs again after a restart: not past it


def test_spark_kafka_connector_offsets_name_their_topic(tmp_path):
    found = checkpoint(tmp_path, {4: ['{"T.S":{"0":40,"2":17}}']}, committed=[4])
    assert committed_offsets(found, ["T.S"]) == {"T.S": {0: 40, 2: 17}}


def test_a_query_that_committed_nothing_hands_over_no_positions(tmp_path):
    assert committed_offsets(checkpoint(tmp_path, {0: ['{"0":5}']}, committed=[]), ["A"]) == {}


def test_an_offset_log_of_other_sources_is_refused(tmp_path):
    found = checkpoint(tmp_path, {0: ['{"0":5}']}, committed=[0])
    with pytest.raises(HandoverError, match="offsets of 1 sources where the instance reads 2 topics"):
        committed_offsets(found, ["A", "B"])


def test_the_marker_names_the_rescale_a_checkpoint_started_from(tmp_path):
    assert handed_over_since(tmp_path / "q") is None
    mark(tmp_path / "q", 1_796_440_050_814)
    assert handed_over_since(tmp_path / "q") == 1_796_440_050_814


def test_a_query_stopped_in_its_first_batch_has_no_committed_state_to_hand_over(tmp_path):
    found = checkpoint(tmp_path, {0: ['{"0":5}']}, committed=[])
    (found / "state" / "0" / "0").mkdir(parents=True)  # what its first, unfinished batch began
    handover = take_over(None, {"A": (0,)}, [found], owns=lambda _key: True)  # no Spark read: nothing committed
    assert (handover.start_at, handover.initial_state) == ({}, None)
