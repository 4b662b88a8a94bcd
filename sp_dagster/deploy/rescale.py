"""Parallelism changes on redeploy: what they do to state, and which are refused.

A stateless group rescales freely. A stateful group whose parallelism changes would leave its
state behind: per-key state (a keyed group: `partition with`, field grouping) would stay on the
instance that owned each key under the old layout while the key's new events go to another,
and a round-robin group's state has no owner at all. Both are refused with a clear message
unless the deploy asks for a fresh start (`deploy --fresh`): every instance of the group then
starts empty (its earlier checkpoints and revisions are set aside by the instances, not
deleted), and the deploy says so.

Moving per-key state between instances (split and merge of the engine's partition state, with
the input drained first) is not built yet: see the README's Status.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sp_dagster.deploy.errors import DeployError

FRESH_SINCE = "fresh_since"  # instance extra: checkpoints saved before this time (ms) are not resumed


@dataclass(frozen=True)
class Rescale:
    """One execution group whose parallelism changes."""

    group: str
    old: int
    new: int
    keyed: bool
    stateless: bool

    @property
    def moving(self) -> float:
        """The share of keys whose owning instance changes (keys spread by hash over the instances)."""
        cycle = math.lcm(self.old, self.new)
        return sum(1 for r in range(cycle) if r % self.old != r % self.new) / cycle

    def describe(self) -> str:
        """One line: the change and what it does to state."""
        head = f"group {self.group}: {self.old} -> {self.new} instances"
        if self.stateless:
            return f"{head} (stateless: nothing to move)"
        if self.keyed:
            return f"{head}; {self.moving:.0%} of its keys change instance"
        return f"{head}; its state is round-robin (no key owns it)"


def rescales(plane, topology) -> list[Rescale]:
    """The groups of `topology` whose parallelism differs from the recorded deployment's."""
    from sp_dagster.cluster.store.deployments import list_instances
    from sp_dagster.topology.model import FIELD_GROUPING
    from sp_dagster.worker.instance_plan import plan_instance

    before: dict[str, int] = {}
    for instance in list_instances(plane, topology.app):
        before[instance.group] = before.get(instance.group, 0) + 1
    found = []
    for group in topology.groups:
        old = before.get(group.exec_group, 0)
        if old and old != len(group.instances) and not group.receiver:
            first = group.instances[0]
            stateless = plan_instance(first.name, first.siddhi).stateless
            keyed = any(s.strategy == FIELD_GROUPING for s in group.inputs)
            found.append(Rescale(group.name, old, len(group.instances), keyed, stateless))
    return found


def check_rescales(found: list[Rescale], *, fresh: bool) -> list[str]:
    """What the rescales do, one line each; DeployError when a stateful group would lose its state silently."""
    refused = [r for r in found if not r.stateless]
    if refused and not fresh:
        raise DeployError(
            "; ".join(r.describe() for r in refused)
            + ": changing the parallelism of a stateful group would leave its state on the old instances. "
            "Deploy with --fresh to start these groups empty, or keep their parallelism"
        )
    return [r.describe() + (": starting empty (--fresh)" if not r.stateless else "") for r in found]


def fresh_specs(specs: list, found: list[Rescale], previous: dict[str, dict]) -> list:
    """The instance specs with `fresh_since` set on the groups that start empty now, and kept where set before."""
    import dataclasses

    now = int(time.time() * 1000)
    fresh = {r.group for r in found if not r.stateless}
    result = []
    for spec in specs:
        since = now if spec.extra.get("group") in fresh else previous.get(spec.instance_id, {}).get(FRESH_SINCE)
        result.append(dataclasses.replace(spec, extra={**spec.extra, FRESH_SINCE: since}) if since else spec)
    return result
