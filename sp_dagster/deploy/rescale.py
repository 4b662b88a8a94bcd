"""Parallelism changes on redeploy: what they do to state, moving per-key state, and which are refused.
A stateless group hands its read positions over, a keyed group whose state is all per key moves it key
by key (`move_state`), and other stateful groups are refused unless `deploy --fresh`; see "Rescaling a
group" in docs/operations/scaling.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from sp_dagster.cluster.store.deployments import DRAIN, HOLD, RESCALED
from sp_dagster.deploy.errors import DeployError
from sp_dagster.topology.topics import partition_numbers

FRESH_SINCE = "fresh_since"  # instance extra: checkpoints saved before this time (ms) are not resumed
KEPT_EXTRAS = (FRESH_SINCE, RESCALED)  # what an instance keeps from its previous spec when its group does not rescale now
SETTLE_S = 2.0  # a pause longer than a worker's poll between start and report (move_state, step 1)


@dataclass(frozen=True)
class Rescale:
    """One execution group whose parallelism changes."""

    group: str
    old: int
    new: int
    keyed: bool
    stateless: bool
    unmovable: str | None = None  # why per-key state cannot move (None: it moves)
    topics: tuple[str, ...] = ()  # the keyed topics the group reads
    upstream: tuple[str, ...] = ()  # the groups that publish to them
    old_ids: tuple[str, ...] = ()  # the instances of the recorded layout
    partitions: dict = field(default_factory=dict, compare=False)  # keyed topic -> the partitions publishers spread keys over
    recorded_partitions: int | None = None  # what the keyed topics had in the recorded plan (when all alike)

    @property
    def moves(self) -> bool:
        """The state moves with the keys (a keyed group whose state is all per key)."""
        return self.keyed and not self.stateless and self.unmovable is None

    @property
    def hands_over(self) -> bool:
        """The old instances hand their last checkpoints to the new ones: per-key state with its keys, or a
        stateless group's read positions."""
        return self.moves or self.stateless

    @property
    def keeps_partitions(self) -> bool:
        """Its keyed topics keep their partition count (room left by maxParallel): no key changes partition."""
        count = self.recorded_partitions
        return bool(count) and {self.partitions.get(t) for t in self.topics} == {count}

    @property
    def moving(self) -> float:
        """The share of keys whose owning instance changes: of the partitions, when the keyed topics keep
        their count, else of keys spread by hash over the instances."""
        count = self.recorded_partitions
        if count and self.keeps_partitions:
            owner = lambda n: {p: i for i in range(n) for p in partition_numbers(n, count, i)}  # noqa: E731
            before, after = owner(self.old), owner(self.new)
            return sum(1 for p in range(count) if before[p] != after[p]) / count
        cycle = math.lcm(self.old, self.new)
        return sum(1 for r in range(cycle) if r % self.old != r % self.new) / cycle

    def describe(self, fresh: bool = False) -> str:
        """One line: the change and what it does to state (`fresh`: the deploy starts it empty)."""
        head = f"group {self.group}: {self.old} -> {self.new} instances"
        if self.stateless:
            return f"{head} (stateless: each partition's read position moves with it)"
        if self.keyed and fresh:
            return f"{head}; {self.moving:.0%} of its keys change instance: starting empty (--fresh)"
        if self.moves:
            return f"{head}; {self.moving:.0%} of its keys change instance, their state moves with them"
        if self.keyed:
            return f"{head}; {self.moving:.0%} of its keys change instance, but {self.unmovable}"
        return f"{head}; its state is round-robin (no key owns it)"


def rescales(plane, topology) -> list[Rescale]:
    """The groups of `topology` whose parallelism differs from the recorded deployment's."""
    from sp_dagster.cluster.store.deployments import get_deployment, list_instances
    from sp_dagster.topology.model import FIELD_GROUPING
    from sp_dagster.worker.instance.plan import plan_instance

    recorded = get_deployment(plane, topology.app)
    had = {t["name"]: int(t["partitions"]) for t in (recorded.plan.get("topics") or [])} if recorded is not None else {}
    before: dict[str, list[str]] = {}
    for instance in list_instances(plane, topology.app):
        before.setdefault(instance.group, []).append(instance.instance_id)
    found = []
    for group in topology.groups:
        old_ids = tuple(sorted(before.get(group.exec_group, ())))
        old = len(old_ids)
        if old and old != len(group.instances) and not group.receiver:
            first = group.instances[0]
            stateless = plan_instance(first.name, first.siddhi).stateless
            keyed = any(s.strategy == FIELD_GROUPING for s in group.inputs)
            topics = tuple(sorted({s.topic for s in group.inputs if s.topic}))
            upstream = tuple(g.name for g in topology.groups if any(p.topic in topics for p in g.outputs))
            why = _unmovable(topology, group, topics, upstream) if keyed and not stateless else None
            partitions = {t: topology.topic(t).partitions for t in topics}
            counts = {had.get(t) for t in topics}
            kept = counts.pop() if len(counts) == 1 else None
            found.append(Rescale(group.name, old, len(group.instances), keyed, stateless, why, topics, upstream, old_ids, partitions, kept))
    return found


def _unmovable(topology, group, topics: tuple[str, ...], upstream: tuple[str, ...]) -> str | None:
    """Why a keyed group's state cannot move key by key, or None when it can."""
    from sp_dagster.engine.stateparts import part_definitions
    from sp_dagster.siddhi import load
    from sp_dagster.topology.model import FIELD_GROUPING, INTERNAL

    if any(s.strategy != FIELD_GROUPING or not s.topic for s in group.inputs):
        return "it also reads streams that are not partitioned by key"
    if any(topology.topic(t).role != INTERNAL for t in topics) or not upstream:
        return "its keyed input is published from outside the app"
    if len({topology.topic(t).partitions for t in topics}) != 1:
        return "its keyed topics differ in partition count"
    first = group.instances[0]
    other = [p for p in part_definitions(load(first.siddhi, first.name)) if not p.startswith("partition:")]
    if other:
        return f"it has state outside `partition with` blocks ({', '.join(other)})"
    return None


def check_rescales(found: list[Rescale], *, fresh: bool) -> list[str]:
    """What the rescales do, one line each; DeployError when a stateful group would lose its state silently."""
    refused = [r for r in found if not r.stateless and not r.moves]
    if refused and not fresh:
        raise DeployError(
            "; ".join(r.describe() for r in refused) + ": changing the parallelism of a stateful group would leave its state on the old instances. "
            "Deploy with --fresh to start these groups empty, or keep their parallelism"
        )
    return [r.describe(fresh) + (": starting empty (--fresh)" if not r.stateless and not r.keyed and fresh else "") for r in found]


def state_specs(specs: list, found: list[Rescale], previous: dict[str, dict], *, fresh: bool, since: int | None = None) -> list:
    """The instance specs with their state extras: `fresh_since` on groups that start empty now (`fresh`),
    `rescaled` on groups whose state moves (at `since`, ms), and what each instance had before elsewhere."""
    import dataclasses

    now = int(time.time() * 1000)
    restarting = {r.group for r in found if not r.stateless and fresh}
    moving = {r.group: r for r in found if (r.moves and not fresh) or r.stateless}
    result = []
    for spec in specs:
        group = spec.extra.get("group")
        extra = dict(spec.extra)
        if group in restarting:
            extra[FRESH_SINCE] = now
        elif group in moving:
            r = moving[group]
            extra[RESCALED] = {"from": list(r.old_ids), "since": since or now, "partitions": dict(r.partitions)}
        extra.update({k: v for k, v in previous.get(spec.instance_id, {}).items() if k in KEPT_EXTRAS and group not in restarting | set(moving)})
        if FRESH_SINCE in previous.get(spec.instance_id, {}) and group in moving:
            extra[FRESH_SINCE] = previous[spec.instance_id][FRESH_SINCE]
        result.append(dataclasses.replace(spec, extra=extra) if extra != spec.extra else spec)
    return result


def move_state(plane, topology, specs: list, found: list[Rescale], record_specs, timeout: float = 120.0) -> list[Rescale]:
    """Steps 1 and 2 of moving keyed state: hold the upstream of every group whose state moves, then drain
    and stop its old instances; `record_specs(specs)` records a set of instances. Returns the groups whose
    state moves (step 3 is the deploy's own record, with `state_specs(..., since=now)`).

    1. *hold the upstream*: every instance that publishes to the group's keyed topics is held (its
       worker stops it after a last checkpoint, and does not start it); wait until no worker runs any
       of them, so nothing is published to those topics any more;
    2. *drain the old instances*: each is held with `drain`: its worker has it read its partitions
       to their end (what the upstream published under the old layout: the partition of a key
       depends on the partition count), checkpoint, and stop; wait until none runs;
    3. *release*: the new layout is recorded with nothing held; each new instance of the group is
       marked `rescaled` (from which old instances, since when): its worker builds its start
       checkpoint from the old instances' last ones, keeping the keys it now owns and the offsets
       they reached. No key is processed by two instances at once: the old ones stop before any new
       one starts; no event is lost or seen twice: the new ones start where the old ones ended.

    When every such group is stateless or its keyed topics keep their partition count (maxParallel left
    room), steps 1 and 2 become one: the old instances are held (each stops after a last checkpoint, no
    drain) while the upstream keeps publishing. A stateless group is never drained, nor its upstream held.
    """
    import dataclasses

    from sp_dagster.cluster.store.deployments import InstanceSpec, list_instances
    from sp_dagster.deploy.state import wait_until_released

    moving = [r for r in found if r.hands_over]
    if not moving:
        return []
    groups = {r.group for r in moving}
    # Keys that keep their partition (and stateless groups, which have no keys) need no drain and no pause
    # upstream: the old owners stop with a last checkpoint and the new ones start from their partitions' offsets in it.
    in_place = all(r.keeps_partitions or r.stateless for r in moving)
    upstream = set() if in_place else {g for r in moving if not r.stateless for g in r.upstream}
    held = [
        dataclasses.replace(s, extra={**s.extra, HOLD: "rescale"}) if s.extra.get("group") in upstream else s
        for s in specs
        if s.extra.get("group") not in groups
    ]
    old = [i for i in list_instances(plane, topology.app) if i.extra.get("group") in groups]
    drained = set() if in_place else {r.group for r in moving if not r.stateless}

    def as_recorded(hold: bool) -> list:
        """The old instances as recorded; with `hold`, each held: drained, or stopped in place."""
        return [
            InstanceSpec(
                i.instance_id,
                i.group,
                i.parallel_index,
                i.siddhi_app,
                i.receiver,
                {**i.extra, **({HOLD: DRAIN if i.extra.get("group") in drained else "rescale"} if hold else {})},
            )
            for i in old
        ]

    if not in_place:
        record_specs(held + as_recorded(False))
        for _ in range(2):  # and again after a pause: a worker that read its assignments just before may still start one
            wait_until_released(plane, [s.instance_id for s in held if s.extra.get(HOLD)], timeout)
            time.sleep(SETTLE_S)
    record_specs(held + as_recorded(True))
    wait_until_released(plane, [i.instance_id for i in old], timeout)
    return moving
