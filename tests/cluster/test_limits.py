"""Maximum parallelism per group: keyed groups by their topics' partitions, stateless ones unbounded, stateful ones 1."""

from sp_dagster.cluster.limits import max_parallel
from sp_dagster.siddhi import load
from sp_dagster.topology import plan
from sp_dagster.topology.output import to_dict

HEAD = "@app:name('A')\ndefine stream In (sym string, price double);\n"


def limit(body: str, group: str) -> int | None:
    source = HEAD + body
    return max_parallel("A", source, to_dict(plan(load(source, "A"), "A")), group)


def test_a_stateless_group_has_no_maximum_at_any_parallelism():
    assert limit("@dist(execGroup='g', parallel='1') from In[price > 1] select sym, price insert into Out;", "g") is None
    assert limit("@dist(execGroup='g', parallel='3') from In[price > 1] select sym, price insert into Out;", "g") is None


def test_a_group_the_planner_keeps_at_parallel_1_stays_there():
    assert limit("@dist(execGroup='g', parallel='1') from In#window.length(5) select sym, sum(price) as t insert into Out;", "g") == 1


def test_a_keyed_group_is_bounded_by_its_topics_partitions():
    body = (
        "@dist(execGroup='f', parallel='1') from In[price > 0] select sym, price insert into Mid;\n"
        "@dist(execGroup='g', parallel='2') partition with (sym of Mid) begin from Mid#window.length(3) select sym, sum(price) as t insert into Out; end;"
    )
    assert limit(body, "g") == 2
    assert limit(body, "f") is None
