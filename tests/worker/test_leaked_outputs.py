"""Outputs a dead owner's open transaction let through are dropped once each, only the instance's own,
and only until its inputs are read as far as they reached at its start (the loop-level test on the
real broker is in test_continuous)."""

from __future__ import annotations

from sp_dagster.worker.instance.checkpoints import Checkpoint
from sp_dagster.worker.instance.leaked_outputs import LeakedOutputs, own_prefixes
from sp_dagster.worker.instance.runtime import Message


def out(topic, partition, origin):
    return Message(topic, partition, -1, 1, None, b"v", origin)


def test_a_stateful_instance_drops_each_of_its_own_found_outputs_once_on_its_partition():
    prefixes = own_prefixes("App-avg", False, [("in", 0)], "App-avg@clock:App-avg-1")
    found = {
        ("Out", 0): [b"App-avg@in:0|7.1", b"App-avg@in:0|8.1", b"App-avg@in:1|7.1", b"App-avg@clock:App-avg-2|99.1", b"App-avg@clock:App-avg-1|99.1"],
        ("Out", 1): [b"App-avg@in:0|9.1"],
    }
    leaked = LeakedOutputs(found, prefixes, {("in", 0): 20}, 1_000)
    assert leaked.count == 4  # another instance's input partition and wall clock are not this one's
    batch = [out("Out", 0, b"App-avg@in:0|7.1"), out("Out", 1, b"App-avg@in:0|8.1"), out("Out", 0, b"App-avg@in:0|8.1"), out("Out", 0, None)]
    kept = leaked.drop(batch)
    assert kept == [batch[1], batch[3]]  # 8.1 was found on partition 0, not 1
    assert leaked.drop([out("Out", 0, b"App-avg@in:0|7.1")]) != []  # each found output is dropped once
    assert leaked.dropped == 2
    assert leaked.drop([out("Out", -1, b"App-avg@in:0|9.1")]) == []  # placed by the producer: any partition of the topic
    assert leaked.drop([out("Out", 0, b"App-avg@clock:App-avg-1|99.1")]) == []  # a timer's output, fired again at its due time
    assert not leaked and not leaked.pending({("in", 0): 0}, 0)


def test_outputs_are_dropped_only_until_the_inputs_and_the_wall_clock_reach_where_they_were_at_the_start():
    # A stateless instance's outputs pass their inputs' origins on behind the partition they came through:
    # those that came through a partition it does not read are another instance's.
    prefixes = own_prefixes("App-f", True, [("in", 0), ("in", 1)], "App-f@clock:App-f-2")
    found = [b"App-f>in:1>up@x:1|5.1.1", b"App-f>in:0|7.1", b"App-f>in:2>up@x:1|6.1.1"]
    leaked = LeakedOutputs({("Out", 0): found}, prefixes, {("in", 0): 10, ("in", 1): 4}, 5_000)
    assert leaked.count == 2
    assert leaked.pending({("in", 0): 10, ("in", 1): 3}, None)
    assert leaked.pending({("in", 0): 10, ("in", 1): 4}, 4_999)  # timers due before the start may still fire
    assert not leaked.pending({("in", 0): 10, ("in", 1): 4}, 5_000)
    assert not leaked.pending({("in", 0): 10, ("in", 1): 4}, None)  # event time: no wall-clock timers


def test_a_checkpoint_keeps_its_output_marks_and_one_saved_before_them_still_reads():
    saved = Checkpoint({("in", 0): 4}, b"state", 5, {"in": "id"}, None, {("Out", 0): 12, ("Out", 1): 0})
    assert Checkpoint.decode(saved.encode()) == saved
    older = Checkpoint({("in", 0): 4}, b"state", 5, {"in": "id"})
    assert Checkpoint.decode(older.encode()).marks == {}
