"""Several machines for real: broker, PostgreSQL, two managers, two workers and an operator's machine,
each a network namespace with its own address and disk (tests/hosts/netns.py), driven only through
the `sp-dagster` command line as an operator would. A worker's host is cut off mid-stream and
plugged back in: no output is lost or repeated, the cut worker stops its instances within the
fence window, and it takes its share back by graceful moves (their tasks launched ahead). Cut off from the database alone it
stops the same way; cut off from the broker alone it hands its instances over, as its heartbeats
say. With the leader manager cut off, the other manager leads and no instance moves. An operator's
`undeploy --drop-state` drops what the workers saved on their own disks and in the database, so a
redeploy starts empty."""

from __future__ import annotations

import collections
import json
import re
import time
from collections.abc import Callable
from datetime import datetime

import pytest

from tests.fixtures.trades import APP_PATH, SYMBOLS, expected_outputs, trades
from tests.fixtures.waiting import wait_until
from tests.hosts.cluster import Cluster, event_lines, running, stream_with_fault
from tests.hosts.netns import available

pytestmark = [pytest.mark.slow, pytest.mark.hosts, pytest.mark.skipif(available() is not None, reason=str(available()))]

FENCE_WINDOW_S = 2.0 * 4  # WORKER_CONF: heartbeatInterval 2000 ms x heartbeatMaxRetry 4
CUT_S = 25.0  # how long a worker stays cut off: well past the fence window and its instances' start elsewhere
TASK_STOPPED = re.compile(r"^(\S+ \S+) .*\[(\S+)\] .*lease on this instance ran out")  # an instance's own loop
STOPPED = re.compile(r"^(\S+ \S+) .*: stopped (\S+)$")  # an instance a worker stopped
STARTED = re.compile(r"^(\S+ \S+) .*: started (\S+) ")  # an instance started by a worker
PREPARED = re.compile(r"^(\S+ \S+) .*: prepared (\S+) ")  # its task launched ahead of a move here
WORKER_STOPPING = re.compile(r"^(\S+ \S+) .*fenced .*stopping")  # the worker's main loop catching up (a figure)
MANAGER_LEASE_S = 0.5 * 3  # MANAGER_CONF: strategyConfig heartbeatInterval 500 ms x heartbeatMaxRetry 3
BROKER_UNREACHABLE = re.compile(r"^(\S+ \S+) .*the messaging layer .* has not answered")


@pytest.fixture
def cluster(tmp_path):
    with running(Cluster(tmp_path)) as made:
        yield made


def status_of(cluster: Cluster, node: str) -> list[str]:
    """The instances `sp-dagster status --json` shows running on `node`."""
    shown = cluster.operator("status", "--json")
    assert shown.returncode == 0, shown.stderr
    return sorted(
        i["instance"] for app in json.loads(shown.stdout)["deployments"] for i in app["instances"] if i.get("node") == node and i.get("status") == "running"
    )


def log_times(log: str, pattern: re.Pattern, since: float) -> dict[str, float]:
    """When (s after `since`) each line of `log` matching `pattern` was written, by its second group (or the line)."""
    found = {}
    for line in log.splitlines():
        match = pattern.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since:
                found.setdefault(match.group(2) if pattern.groups > 1 else line, round(at - since, 2))
    return found


def stop_times(log: str, ran: list[str], since: float) -> dict[str, float]:
    """When (s after `since`) each of `ran` stopped: by its own loop once the lease ran out, or by its worker once
    fenced, whichever came first (both watch the same lease, so either may)."""
    tasks, stopped = log_times(log, TASK_STOPPED, since), log_times(log, STOPPED, since)
    return {i: min(t for t in (tasks.get(i), stopped.get(i)) if t is not None) for i in ran if i in tasks or i in stopped}


def longest_silences(arrivals: dict[str, list[float]], start: float, end: float) -> dict[str, float]:
    """Per symbol, the longest time without an output, among the gaps that overlap [start, end)."""
    return {symbol: round(max((b - a for a, b in zip(times, times[1:]) if b > start and a < end), default=0.0), 2) for symbol, times in arrivals.items()}


def keys_of(instances: list[str]) -> set[str]:
    """The symbols whose events pass through any of `instances` (both groups split their input by symbol alike)."""
    from sp_dagster.deploy import load_app
    from sp_dagster.messaging import strategy_for
    from sp_dagster.worker.instance.plan import plan_instance

    read = set()
    for group in load_app(text=APP_PATH.read_text()).topology.groups:
        for instance in group.instances:
            if instance.name in instances:
                (source,) = plan_instance(instance.name, instance.siddhi).inputs
                read |= {(source.topic, p) for p in source.partitions}
    split = strategy_for("partitioned", ["symbol", "price", "volume"], "symbol")
    return {s for s in SYMBOLS for topic, p in read if tuple(split.partitions((s, 0.0, 0), 2)) == (p,)}


def silence_figures(silences: dict[str, float]) -> dict:
    """The longest silence of any key, the median key's, and how many keys were silent over 2 s."""
    ranked = sorted(silences.values())
    if not ranked:
        return {"keys": 0}
    return {"longest_s": ranked[-1], "median_key_s": ranked[len(ranked) // 2], "keys_over_2s": sum(s > 2 for s in ranked), "keys": len(ranked)}


def worker_log(cluster: Cluster, name: str) -> str:
    return (cluster.hosts[name].home / "worker.log").read_text(errors="replace")


def cut_off(cluster: Cluster, seen: dict, cut, heal, seconds: float = CUT_S) -> Callable[[], None]:
    """A fault for stream_with_fault(): note what worker-2 runs, `cut()`, wait, `heal()`."""

    def fault() -> None:
        seen["ran"] = status_of(cluster, "worker-2")
        assert seen["ran"], "worker-2 runs nothing: cutting it off would prove nothing"
        seen["at"] = time.time()
        cut()
        time.sleep(seconds)
        heal()

    return fault


def moved_to_worker_1(cluster: Cluster, seen: dict) -> dict[str, float]:
    """When (s after the cut) each instance worker-2 ran started on worker-1."""
    return {i: at for i, at in log_times(worker_log(cluster, "w1"), STARTED, seen["at"]).items() if i in seen["ran"]}


def test_a_worker_cut_off_mid_stream_stops_in_time_and_nothing_is_lost_or_repeated(cluster):
    w2, seen, arrivals = cluster.hosts["w2"], {}, {}
    counts, _, _ = stream_with_fault(cluster, cut_off(cluster, seen, lambda: cluster.network.cut(w2), lambda: cluster.network.heal(w2)), arrivals)
    log = worker_log(cluster, "w2")
    tasks, worker = stop_times(log, seen["ran"], seen["at"]), log_times(log, WORKER_STOPPING, seen["at"])
    elsewhere = moved_to_worker_1(cluster, seen)
    limit = FENCE_WINDOW_S + 2
    assert len(tasks) == len(seen["ran"]) and max(tasks.values()) <= limit, (
        f"the cut worker's instances {seen['ran']} stopped at {tasks} s (limit {limit} s)\n{cluster.logs()}"
    )
    # Back on the bridge, worker-2 registers again and takes its share back by graceful moves: worker-1
    # stops each instance with a last checkpoint, then worker-2 starts it. The gap is its keys' silence.
    healed = seen["at"] + CUT_S
    back = lambda: log_times(worker_log(cluster, "w2"), STARTED, healed)  # noqa: E731
    wait_until(lambda: len(back()) >= len(seen["ran"]), timeout=120, what="worker-2 to take back its share")
    let_go = log_times(worker_log(cluster, "w1"), STOPPED, healed)
    gaps = {i: round(at - let_go[i], 2) for i, at in back().items() if i in let_go}
    prepared = log_times(worker_log(cluster, "w2"), PREPARED, healed)
    # How long keys went without an output: while the worker was cut off, and from the heal on (the hand-back).
    cut_keys = keys_of(seen["ran"])
    cut_silences, handback_silences = longest_silences(arrivals, seen["at"], healed), longest_silences(arrivals, healed, float("inf"))
    during_cut = {
        "cut_workers_keys": silence_figures({k: v for k, v in cut_silences.items() if k in cut_keys}),
        "other_keys": silence_figures({k: v for k, v in cut_silences.items() if k not in cut_keys}),
    }
    during_handback = silence_figures(handback_silences)
    figures = {"outputs": sum(counts.values()), "tasks_stopped_s": tasks, "running_elsewhere_s": elsewhere, "worker_acted_on_fence_s": list(worker.values())}
    handback = {"handback_prepared_s": prepared, "handback_stop_to_start_s": gaps, "silence_cut": during_cut, "silence_handback": during_handback}
    print(json.dumps({"figure": "hosts-cut", **figures, **handback}))
    assert gaps and set(gaps) == set(back()) and min(gaps.values()) >= 0, f"worker-2 started {sorted(back())} without worker-1 stopping them first ({let_go})"
    # Their tasks were launched before worker-1 let go (it is asked only then), so that each started as soon as it was placed.
    assert set(prepared) == set(back()) and all(prepared[i] <= let_go[i] for i in back()), f"prepared {prepared}, let go {let_go}, started {back()}"
    # The cut worker's open transactions hold back none of the other keys' outputs (issue 28's goal: 2 s at most).
    assert during_cut["other_keys"].get("longest_s", 0) <= 2.0, f"keys the cut worker never handled went silent: {during_cut}\n{cluster.logs()}"


def test_a_worker_cut_off_from_the_database_alone_stops_in_time(cluster):
    """Its heartbeats fail, so its lease runs out and its instances stop (by themselves or by the fenced worker), broker calls and all."""
    w2, db, seen = cluster.hosts["w2"], cluster.hosts["db"], {}
    network = cluster.network
    fault = cut_off(cluster, seen, lambda: (network.block(w2, db), network.block(db, w2)), lambda: (network.unblock(w2, db), network.unblock(db, w2)))
    counts, _, _ = stream_with_fault(cluster, fault)
    tasks, elsewhere = stop_times(worker_log(cluster, "w2"), seen["ran"], seen["at"]), moved_to_worker_1(cluster, seen)
    print(json.dumps({"figure": "hosts-db-cut", "outputs": sum(counts.values()), "tasks_stopped_s": tasks, "running_elsewhere_s": elsewhere}))
    limit = FENCE_WINDOW_S + 2
    assert len(tasks) == len(seen["ran"]) and max(tasks.values()) <= limit, f"{seen['ran']} stopped at {tasks} s (limit {limit} s)\n{cluster.logs()}"
    assert set(elsewhere) == set(seen["ran"]) and max(elsewhere.values()) <= limit + 2, f"{seen['ran']} ran on worker-1 at {elsewhere} s\n{cluster.logs()}"


def test_a_worker_cut_off_from_the_broker_alone_hands_its_instances_over_in_time(cluster):
    """The worker still heartbeats (the database is in reach), so only its own word that the broker
    is not can move its instances; their open transactions are aborted by their new owner's start."""
    w2, broker, seen = cluster.hosts["w2"], cluster.hosts["broker"], {}
    network = cluster.network
    fault = cut_off(
        cluster, seen, lambda: (network.block(w2, broker), network.block(broker, w2)), lambda: (network.unblock(w2, broker), network.unblock(broker, w2))
    )
    counts, _, _ = stream_with_fault(cluster, fault)
    elsewhere = moved_to_worker_1(cluster, seen)
    said = log_times(worker_log(cluster, "w2"), BROKER_UNREACHABLE, seen["at"])
    print(
        json.dumps({"figure": "hosts-broker-cut", "outputs": sum(counts.values()), "said_unreachable_s": list(said.values()), "running_elsewhere_s": elsewhere})
    )
    # Noticed after the fence window without an answer, then the leader's next pass and a task start.
    limit = FENCE_WINDOW_S + 4
    assert set(elsewhere) == set(seen["ran"]) and max(elsewhere.values()) <= limit, (
        f"{seen['ran']} ran on worker-1 at {elsewhere} s (limit {limit} s)\n{cluster.logs()}"
    )


def test_the_leader_manager_cut_off_another_leads_and_no_instance_moves(cluster):
    """Workers heartbeat to the database, not to a manager: losing the leader moves nothing; the
    other manager leads within the managers' lease and the cut one, back, writes nothing."""
    seen: dict = {}

    def leader() -> dict:
        shown = cluster.operator("status", "--json")
        assert shown.returncode == 0, shown.stderr
        return json.loads(shown.stdout)["leader"]

    def cut_the_leader() -> None:
        before = leader()
        host = cluster.hosts[f"m{before['node'].rsplit('-', 1)[1]}"]
        seen["at"] = time.time()
        cluster.network.cut(host)
        after = wait_until(
            lambda: (lambda now: now if now and now["alive"] and now["term"] > before["term"] else None)(leader()), timeout=30, what="another leader"
        )
        seen["took_over_s"] = round(time.time() - seen["at"], 2)
        seen["terms"] = (before["node"], before["term"], after["node"], after["term"])
        time.sleep(2 * FENCE_WINDOW_S)  # twice as long as a worker wrongly fenced would take to stop its instances
        cluster.network.heal(host)

    counts, _, _ = stream_with_fault(cluster, cut_the_leader)
    restarted = {name: log_times(worker_log(cluster, name), STARTED, seen["at"]) for name in ("w1", "w2")}
    print(
        json.dumps(
            {"figure": "hosts-leader-cut", "outputs": sum(counts.values()), "took_over_s": seen["took_over_s"], "terms": seen["terms"], "restarted": restarted}
        )
    )
    assert seen["terms"][0] != seen["terms"][2] and seen["took_over_s"] <= MANAGER_LEASE_S + 5, seen
    assert restarted == {"w1": {}, "w2": {}}, f"instances restarted while only the leader was cut off: {restarted}\n{cluster.logs()}"


def produce_and_read(cluster: Cluster, rows, stamps, expected: int) -> list[tuple]:
    """Produce trades from the operator's machine; every output on the topic once `expected` are there (or after 3 minutes)."""
    sent = cluster.operator("produce", "Trades:TradeStream", "--key", "symbol", stdin=event_lines(rows, stamps))
    assert sent.returncode == 0, sent.stderr
    got: list[tuple] = []
    deadline = time.monotonic() + 180
    while len(got) < expected and time.monotonic() < deadline:
        read = cluster.operator("consume", "Trades:AverageStream", "--from-beginning", "--timeout", "10")
        got = [(*line["data"], line["timestamp"]) for line in map(json.loads, read.stdout.splitlines())]
    return got


def test_drop_state_from_the_operators_machine_then_a_redeploy_starts_empty(cluster):
    """The operator's machine shares no disk with the workers: the revisions go from the database the
    cluster persists to, each worker deletes its own checkpoint folders on the control plane's word,
    and the redeployed app starts empty at the committed offsets (nothing before is replayed)."""
    app = cluster.hosts["operator"].home / "trades.siddhi"
    app.write_text(APP_PATH.read_text())
    deployed = cluster.operator("deploy", app.name, "--timeout", "300")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr + cluster.logs()
    rows, stamps = trades(3_000, seed=31, symbols=SYMBOLS)
    first = expected_outputs(APP_PATH.read_text(), rows, stamps)
    assert collections.Counter(produce_and_read(cluster, rows, stamps, len(first))) == collections.Counter(first), cluster.logs()
    held = lambda: [p for w in cluster.WORKERS for p in cluster.hosts[w].home.glob("**/checkpoints/Trades-*")]  # noqa: E731
    # Four instances, each with a folder on its worker (and one on a worker it was moved from, when the second
    # worker joined after the deploy had placed everything on the first).
    wait_until(lambda: len({p.name for p in held()}) == 4, timeout=60, what="every instance's checkpoint folder on its worker")
    time.sleep(4)  # a revision in the database too (persistence interval 3 s): state a replay must not bring back
    dropped = cluster.operator("undeploy", "Trades", "--drop-state", timeout=120)
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert "dropped the state of 4 instances: a redeploy starts them empty" in dropped.stdout, dropped.stdout
    wait_until(lambda: not held(), timeout=60, what="the workers deleting their checkpoint folders")
    deployed = cluster.operator("deploy", app.name, "--timeout", "300")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr + cluster.logs()
    rows, stamps = trades(2_000, seed=32, symbols=SYMBOLS)
    later = [s + 10_000 for s in stamps]
    second = expected_outputs(APP_PATH.read_text(), rows, later)  # as if nothing came before: empty windows
    got = collections.Counter(produce_and_read(cluster, rows, later, len(first) + len(second)))
    wanted = collections.Counter(first + second)
    assert got == wanted, f"{sum((wanted - got).values())} outputs missing, {sum((got - wanted).values())} not expected\n{cluster.logs()}"
