"""`sp-dagster scale`'s rewrite of a deployed app (deploy.scaling.scaled_text), without a cluster."""

from __future__ import annotations

import dataclasses

import pytest

from sp_dagster.deploy.errors import DeployError
from sp_dagster.deploy.scaling import scaled_text
from sp_dagster.deploy.steps import load_app, plan_app

TEXT = """@App:name('Room')
define stream In (k string, v long);
-- the filter keeps positive values
@dist(execGroup='filter', parallel='2') from In[v > 0] select k, v insert into Mid;
@dist(execGroup = 'stats', parallel = '2')
partition with (k of Mid) begin from Mid#window.length(3) select k, sum(v) as total insert into Out; end;
"""


def with_room(most: int | None):
    loaded = load_app(text=TEXT, source="Room (deployed)")
    return dataclasses.replace(loaded, topology=plan_app(loaded, most))


def test_a_room_from_the_clusters_default_is_written_down_so_parallel_1_keeps_the_layout():
    """At parallel 1 the default room would no longer apply: the scaled text names it, and plans to the same topics."""
    text = scaled_text(with_room(4), "stats", 1)
    assert "@dist(execGroup = 'stats', parallel='1', maxParallel='4')" in text and "-- the filter keeps positive values" in text
    before, after = with_room(4).topology, plan_app(load_app(text=text), 4)  # deployed on the same cluster
    assert {t.name: t.partitions for t in after.topics} == {t.name: t.partitions for t in before.topics}
    assert after.group("Room-stats").parallelism == 1 and after.group("Room-stats").max_parallelism == 4


def test_without_a_default_only_parallel_changes_and_the_maximum_is_the_topics_own():
    text = scaled_text(with_room(None), "stats", 3)
    assert "@dist(execGroup = 'stats', parallel='3')" in text and "maxParallel" not in text
    with pytest.raises(DeployError, match=r"stats may grow to its maxParallel \(4\), not to 5"):
        scaled_text(with_room(4), "stats", 5)
