"""`@dist(maxParallel='M')`: a group's topics are laid out for M instances, so rescaling within M changes no topic."""

from __future__ import annotations

import pytest
from topology_support import check_partial_apps, plan_text

from sp_dagster.siddhi import parse
from sp_dagster.topology import FIELD_GROUPING, ROUND_ROBIN, TopologyError, partition_numbers, plan
from sp_dagster.topology.output import to_dict

KEYED = """@App:name('Elastic')
define stream In (k string, v long);
@dist(execGroup='filter', parallel='2') from In[v > 0] select k, v insert into Mid;
@dist(execGroup='stats', parallel='{parallel}'{most})
partition with (k of Mid) begin from Mid#window.length(3) select k, sum(v) as total insert into Out; end;
"""


def keyed(parallel: int, most: int | None = None):
    return plan_text(KEYED.format(parallel=parallel, most=f", maxParallel='{most}'" if most else ""))


@pytest.mark.parametrize("parallel", [1, 2, 3, 5, 6])
def test_a_keyed_groups_topic_keeps_its_partitions_at_every_parallelism_within_the_maximum(parallel):
    topology = keyed(parallel, most=6)
    check_partial_apps(topology)
    stats = topology.group("Elastic-stats")
    (read,) = stats.inputs
    assert (read.strategy, topology.topic(read.topic).partitions) == (FIELD_GROUPING, 6)
    assert stats.max_parallelism == 6
    # The publisher spreads keys over all six partitions; each instance reads its share.
    (out,) = topology.group("Elastic-filter").outputs
    assert (out.topic, out.partitions) == (read.topic, 6)
    assert [i.partitions_of(read.topic) for i in stats.instances] == [partition_numbers(parallel, 6, n) for n in range(parallel)]
    assert to_dict(topology)["groups"][1]["max_parallelism"] == 6


def test_without_a_maximum_the_topic_has_one_partition_per_instance_as_before():
    topology = keyed(3)
    stats = topology.group("Elastic-stats")
    assert topology.topic(stats.inputs[0].topic).partitions == 3
    assert stats.max_parallelism is None and "max_parallelism" not in to_dict(topology)["groups"][1]


def test_a_group_at_parallel_1_with_room_is_read_as_a_parallel_one():
    """At parallel 1 a stream is otherwise broadcast on one partition; room to grow needs the parallel layout now."""
    topology = keyed(1, most=4)
    (read,) = topology.group("Elastic-stats").inputs
    assert read.strategy == FIELD_GROUPING and topology.topic(read.topic).partitions == 4
    assert topology.group("Elastic-stats").instances[0].partitions_of(read.topic) == (0, 1, 2, 3)
    stateless = plan_text("""@App:name('S')
define stream In (k string, v long);
@dist(execGroup='f', parallel='1', maxParallel='3') from In[v > 0] select k, v insert into Out;
""")
    (read,) = stateless.group("S-f").inputs
    assert read.strategy == ROUND_ROBIN and stateless.topic(read.topic).partitions == 3


def test_room_to_grow_is_held_to_the_rules_of_parallel_groups():
    """A window query outside a partition cannot run parallel: a maximum above 1 is refused like parallel='2'."""
    with pytest.raises(TopologyError, match="Window queries used with parallel greater than 1 outside partitioned stream"):
        plan_text("""@App:name('W')
define stream In (k string, v long);
@dist(execGroup='w', parallel='1', maxParallel='4') from In#window.length(5) select k, sum(v) as t insert into Out;
""")


def test_a_group_declares_one_maximum():
    with pytest.raises(TopologyError, match=r"execGroup = G-g not assigned constant @dist\(maxParallel\): 4 and 8") as caught:
        plan_text("""@App:name('G')
define stream In (k string, v long);
@dist(execGroup='g', parallel='2', maxParallel='4') from In[v > 0] select k, v insert into A;
@dist(execGroup='g', parallel='2', maxParallel='8') from In[v < 0] select k, v insert into B;
""")
    assert (caught.value.line, caught.value.column) == (4, 1)


def test_an_aggregation_takes_no_maximum():
    with pytest.raises(TopologyError, match=r"Aggregation A: @dist\(maxParallel\) is for execution groups"):
        plan_text("""@App:name('Agg')
define stream In (k string, v long, ts long);
@store(type='rdbms', jdbc.url='jdbc:sqlite:x.db')
@dist(parallel='2', maxParallel='4')
define aggregation A from In select k, sum(v) as t group by k aggregate by ts every sec ... min;
""")


def test_the_clusters_default_room_goes_to_groups_running_in_parallel_that_name_no_maximum():
    """deployment.config.maxParallelism: a parallel group without its own maxParallel grows to it; one at parallel 1 keeps its rules."""
    text = """@App:name('Room')
define stream In (k string, v long);
@dist(execGroup='filter', parallel='2') from In[v > 0] select k, v insert into Mid;
@dist(execGroup='stats', parallel='2')
partition with (k of Mid) begin from Mid#window.length(3) select k, sum(v) as total insert into Out; end;
@dist(execGroup='own', parallel='2', maxParallel='3') from In[v < 0] select k, v insert into Neg;
@dist(execGroup='wide', parallel='9') from In[v == 0] select k, v insert into Zero;
@dist(execGroup='single', parallel='1') from Mid#window.length(5) select k, sum(v) as t insert into Sums;
"""
    topology = plan(parse(text), max_parallelism=6)
    check_partial_apps(topology)
    most = {g.exec_group: g.max_parallelism for g in topology.groups if g.kind == "user"}
    assert most == {"filter": 6, "stats": 6, "own": 3, "wide": None, "single": None}
    (read,) = topology.group("Room-stats").inputs
    assert (read.strategy, topology.topic(read.topic).partitions) == (FIELD_GROUPING, 6)
    assert len(topology.group("Room-stats").instances) == 2
    # Without the setting nothing changes.
    assert topology.group("Room-filter").max_parallelism == 6 and plan(parse(text)).group("Room-filter").max_parallelism is None
