"""Checkpoints resume only what still fits: recreated topics reset state and offsets together (and say so),
a changed partial app keeps the state of its unchanged queries, an unusable checkpoint is set aside once."""

from __future__ import annotations

import pytest

from sp_dagster.messaging import codec_for
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.checkpoints import SET_ASIDE, Checkpoint, predecessor, unfit_reason
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message
from sp_dagster.worker.spark.continuous import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from tests.fixtures.loops import Running, by_symbol, deploy_topics, first_half_through, publish_trades, read_outputs, running_app
from tests.fixtures.trades import APP, reference, trades


def test_offsets_past_a_partitions_end_or_another_topic_id_do_not_fit():
    saved = Checkpoint({("in", 0): 40, ("in", 1): 3, ("gone", 0): 9}, b"", topics={"in": "id-1"})
    ends = {"in": {0: 50, 1: 3}}.__getitem__
    assert unfit_reason(saved, {"in": "id-1"}, ends) is None  # "gone" is no longer an input
    assert "deleted and created again" in unfit_reason(saved, {"in": "id-2"}, ends)
    short = {"in": {0: 12, 1: 3}}.__getitem__
    assert unfit_reason(saved, {"in": "id-1"}, short) == "in:0 ends at offset 12, before the checkpoint's 40 (the broker lost its data)"
    # A layer without topic ids (or a checkpoint saved before they were kept): the end check alone.
    assert "in:0 ends at offset 12" in unfit_reason(Checkpoint({("in", 0): 40}, b""), {}, short)


COUNTING = APP.replace(
    "@info(name = 'big')",
    "@sink(type = 'log')\ndefine stream CountStream (symbol string, n long);\n\n"
    "@info(name = 'count')\n@dist(execGroup = 'watch', parallel = '1')\n"
    "from TradeStream select symbol, count() as n insert into CountStream;\n\n"
    "@info(name = 'recent')\n@dist(execGroup = 'watch', parallel = '1')\n"
    "from TradeStream#window.length(3) select symbol, sum(volume) as volume insert into RecentStream;\n\n@info(name = 'big')",
)
CHANGED = COUNTING.replace("length(3)", "length(4)")


def _watch_runtime(text):
    instance = plan(parse(text)).group("watch").instances[0]
    runtime = InstanceRuntime(plan_instance(instance.name, instance.siddhi))
    counts = []
    runtime.engine.add_callback("CountStream", lambda events: counts.extend(e.data for e in events))
    return runtime, counts


def test_a_changed_partial_app_keeps_the_state_of_its_unchanged_queries():
    old, _ = _watch_runtime(COUNTING)
    source = old.plan.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    send = lambda runtime, offset: runtime.process([Message(source.topic, 0, offset, 1000 + offset, None, codec.encode(("IBM", 10.0, 20)))])  # noqa: E731
    for offset in range(3):
        send(old, offset)
    snapshot = old.snapshot()
    changed, counts = _watch_runtime(CHANGED)
    kept = changed.restore(snapshot)
    assert kept.kept == ("query:count",) and kept.fresh == ("query:recent",)
    send(changed, 3)
    assert counts == [("IBM", 4)]  # the count carried over
    from sp_dagster.engine.stateparts import carry_over

    old_text, new_text = (plan(parse(text)).group("watch").instances[0].siddhi for text in (COUNTING, CHANGED))
    assert carry_over(old_text, new_text).describe() == "state kept: query:count; starting empty: query:recent"


def test_an_unusable_checkpoint_is_set_aside_by_the_first_checkpoint_after_it(tmp_path):
    directory = tmp_path / "Inst-1" / "spec-b"
    write_checkpoint(directory, b"SPC1 damaged")
    write_checkpoint(directory, Checkpoint({("t", 0): 3}, b"new", set_aside="it does not fit").encode())
    assert Checkpoint.decode(read_checkpoint(directory)).positions == {("t", 0): 3}
    (kept,) = (tmp_path / "Inst-1" / SET_ASIDE).glob("*.ckpt")
    assert kept.read_bytes() == b"SPC1 damaged" and kept.with_suffix(".why").read_text() == "it does not fit\n"
    write_checkpoint(directory, Checkpoint({("t", 0): 4}, b"newer").encode())  # no reason given: replaced as usual
    assert len(list((tmp_path / "Inst-1" / SET_ASIDE).glob("*.ckpt"))) == 1
    # A new version of the instance (another spec directory) starts from this one's checkpoint, never from one set aside.
    assert predecessor(tmp_path / "Inst-1" / "spec-c", CHECKPOINT_FILE) == directory / CHECKPOINT_FILE


@pytest.mark.broker
@pytest.mark.slow
def test_checkpoints_of_recreated_topics_reset_state_and_offsets_together_and_say_so(kafka):
    """The embedded broker restarted empty (or the topics were recreated): nothing stale mixes into the new topics."""
    name, topology, plans, running = running_app(kafka, "Reborn")
    text = APP.replace("Trades", name)
    rows, stamps = trades(3000, seed=21)
    half = first_half_through(kafka, name, topology, rows, stamps, running)
    saved = {n: r.stop(save=True) for n, r in running.items()}
    for topic in [t.name for t in topology.topics] + [f"{name}.Averages"]:
        kafka.delete_topic(topic)
    deploy_topics(kafka, text)
    kafka.ensure_topic(f"{name}.Averages", 1)
    running = {n: Running(kafka, plans[n], checkpoint=saved[n]) for n in plans}
    publish_trades(kafka, topology, rows[half:], stamps[half:])
    second = reference(rows[half:], stamps[half:])  # only what the new topics hold
    got = read_outputs(kafka, f"{name}.Averages", sum(map(len, second.values())) + 1, timeout=15)
    for r in running.values():
        r.stop()
    assert by_symbol(r for r, _ in got) == dict(second)
    for r in running.values():
        assert r.loop.state_note.startswith("state and offsets reset: topic "), r.loop.state_note
        assert r.line.metrics_seen[0]["state_note"] == r.loop.state_note
        assert Checkpoint.decode(r.line.checkpoints[0]).set_aside  # the stale checkpoint is set aside, not lost
