"""Each planning rule, valid and invalid, as a table of small distributed apps (the seeds'
examples and the sample app among them)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from topology_support import ROOT, check_partial_apps, plan_text, text_at

from sp_dagster.topology import TopologyError

#: What a parallel stateful query outside a partition is told to do, after WSO2's sentence.
PARALLEL_FIX = "; put the query inside a partition (partition with (key of Stream) begin ... end;) or set parallel='1'"

STOCK_ALERTS = (ROOT / "apps" / "stock-alerts.siddhi").read_text(encoding="utf-8")

# The seeds' examples (002: an aggregation in an active-active cluster; 004: a distributed
# sink), with their transcription damage repaired as in tests/siddhi/test_siddhi_seeds.py.
SEED_AGGREGATION = """
define stream TradeStream (symbol string, price double, quantity long, timestamp long);
@store(type='rdbms',jdbc.url="jdbc:mysql://localhost:3306/TestDB", username="root", password="root" ,"com.mysql.jdbc.Driver")
define aggregation TradeAggregation
from TradeStream
select symbol, avg(price) as avgPrice, sum(quantity) as total
group by symbol
aggregate by timestamp every sec ... year;
"""
REQUEST_ATTRIBUTES = """(meta_clientType string,
     applicationConsumerKey string,
     applicationName string,
     applicationId string,
     applicationOwner string,
     apiContext string,
     apiName string,
     apiVersion string,
     apiCreator string,
     apiTier string,
     apiHostname string,
     username string,
     userTenantDomain string,
     requestTimestamp long,
     throttledOut bool,
     responseTime long,
     backendTime long)"""
SEED_DISTRIBUTED_SINK = f"""
@Sink(type = 'http',
          @distribution(strategy='partitioned', partitionKey='userTenantDomain'))
define stream Request {REQUEST_ATTRIBUTES};
"""
KEYED = """
define stream S (k string, v int);
@dist(execGroup='src', parallel='1') from S select k, v insert into T;
"""


@dataclass(frozen=True)
class Case:
    app: str
    groups: tuple[tuple[str, int, bool], ...] = ()  # (name, parallelism, receiver), in plan order
    inputs: dict[str, dict[str, tuple[str, str | None, str | None]]] = field(default_factory=dict)  # (strategy, key, topic)
    topics: dict[str, int] = field(default_factory=dict)
    error: tuple[str, str] | None = None  # (text at the error's position, message)


CASES = {
    "sample app: stock alerts": Case(
        STOCK_ALERTS,
        groups=(("StockAlerts-filter", 2, False), ("StockAlerts-average", 2, False), ("StockAlerts-alert", 1, False)),
        inputs={
            "StockAlerts-filter": {"TradeStream": ("round_robin", None, "StockAlerts.TradeStream")},
            "StockAlerts-average": {"LargeTradeStream": ("field_grouping", "symbol", "StockAlerts.LargeTradeStream.symbol")},
            "StockAlerts-alert": {"AveragePriceStream": ("all", None, "StockAlerts.AveragePriceStream")},
        },
        topics={
            "StockAlerts.TradeStream": 2,
            "StockAlerts.LargeTradeStream.symbol": 2,
            "StockAlerts.AveragePriceStream": 1,
            "StockAlerts.PriceAlerts": 1,  # the user's kafka @sink on the cluster's own broker
        },
    ),
    "seed 002: a persisted aggregation, joined by a parallel group": Case(
        "@App:name('Trades')\ndefine stream QueryStream (symbol string);\n"
        + SEED_AGGREGATION
        + """
@info(name='lookup') @dist(execGroup='lookup', parallel='2')
from QueryStream as Q join TradeAggregation as A on Q.symbol == A.symbol within '2017-06-** **:**:**' per 'hours'
select A.symbol, A.total insert into TotalsStream;
""",
        groups=(("Trades-lookup", 2, False), ("Trades-aggregation-TradeAggregation", 1, False)),
        inputs={
            "Trades-lookup": {"QueryStream": ("round_robin", None, "Trades.QueryStream")},
            "Trades-aggregation-TradeAggregation": {"TradeStream": ("all", None, "Trades.TradeStream")},
        },
        topics={"Trades.QueryStream": 2, "Trades.TradeStream": 1},
    ),
    "seed 002 active-active: an aggregation with parallel 2 is two shards fed round robin": Case(
        "@App:name('Trades')\ndefine stream QueryStream (symbol string);\n"
        + SEED_AGGREGATION.replace("define aggregation", "@dist(parallel='2')\ndefine aggregation")
        + """
@info(name='lookup') @dist(execGroup='lookup', parallel='2')
from QueryStream as Q join TradeAggregation as A on Q.symbol == A.symbol within '2017-06-** **:**:**' per 'hours'
select A.symbol, A.total insert into TotalsStream;
""",
        groups=(("Trades-lookup", 2, False), ("Trades-aggregation-TradeAggregation", 2, False)),
        inputs={
            "Trades-lookup": {"QueryStream": ("round_robin", None, "Trades.QueryStream")},
            "Trades-aggregation-TradeAggregation": {"TradeStream": ("round_robin", None, "Trades.TradeStream")},
        },
        topics={"Trades.QueryStream": 2, "Trades.TradeStream": 2},
    ),
    "an aggregation with parallel > 1 needs a shared store": Case(
        "@App:name('Mem')\ndefine stream Trades (symbol string, price double, ts long);\n"
        "@dist(parallel='3') define aggregation A from Trades select symbol, sum(price) as total group by symbol aggregate by ts every sec ... min;\n",
        error=(
            "@dist(parallel='3')",
            "Aggregation A has @dist(parallel='3') but no @store: its 3 active-active instances must write to one shared store (add @store(type='rdbms', ...))",
        ),
    ),
    "seed 004: a distributed sink stays with the group producing the stream": Case(
        f"@App:name('Gateway')\ndefine stream RequestIn {REQUEST_ATTRIBUTES};\n"
        + SEED_DISTRIBUTED_SINK
        + """
@dist(execGroup='throttle', parallel='2') from RequestIn[responseTime > 0] select * insert into Request;
""",
        groups=(("Gateway-throttle", 2, False),),
        inputs={"Gateway-throttle": {"RequestIn": ("round_robin", None, "Gateway.RequestIn")}},
        topics={"Gateway.RequestIn": 2},
    ),
    "elements without execGroup form one default group": Case(
        "@App:name('Plain')\ndefine stream S (a int, b string);\nfrom S[a > 1] select a, b insert into T;\nfrom T select b insert into U;\n",
        groups=(("Plain-default", 1, False),),
        inputs={"Plain-default": {"S": ("all", None, "Plain.S")}},
        topics={"Plain.S": 1},
    ),
    "the default group's elements must agree on parallelism": Case(
        "@App:name('Plain')\ndefine stream S (a int);\n@dist(parallel='2') from S select a insert into T;\nfrom T select a insert into U;\n",
        error=("from T", "execGroup = Plain-default not assigned constant @dist(parallel)"),
    ),
    "groups follow the data flow, not the declaration order": Case(
        """@App:name('Flow')
define stream S (a int);
@dist(execGroup='last', parallel='1') from M select a insert into Out;
@dist(execGroup='first', parallel='1') from S select a insert into M;
""",
        groups=(("Flow-first", 1, False), ("Flow-last", 1, False)),
        inputs={"Flow-first": {"S": ("all", None, "Flow.S")}, "Flow-last": {"M": ("all", None, "Flow.M")}},
        topics={"Flow.S": 1, "Flow.M": 1},
    ),
    "groups feeding each other in a cycle are rejected": Case(
        """@App:name('Loop')
define stream S (a int);
@dist(execGroup='g1') from S select a insert into A;
@dist(execGroup='g1') from B select a insert into C;
@dist(execGroup='g2') from A select a insert into B;
""",
        error=(
            "B select",
            "Unsupported: execGroups Loop-g1 -> A -> Loop-g2 -> B -> Loop-g1 form a cycle; a group cannot consume "
            "a stream that its own output feeds, directly or through other groups",
        ),
    ),
    "a plain query on a stream partitioned in its group reads by key, in either order": Case(
        "@App:name('Order')"
        + KEYED
        + """
@dist(execGroup='work', parallel='2') partition with (k of T) begin from T#window.length(2) select k, sum(v) as total insert into Sums; end;
@dist(execGroup='work', parallel='2') from T[v > 10] select k, v insert into Big;
""",
        groups=(("Order-src", 1, False), ("Order-work", 2, False)),
        inputs={"Order-work": {"T": ("field_grouping", "k", "Order.T.k")}},
        topics={"Order.S": 1, "Order.T.k": 2},
    ),
    "one stream partitioned on two keys in one group is a conflict": Case(
        "@App:name('Order')"
        + KEYED
        + """
@dist(execGroup='work', parallel='2') partition with (k of T) begin from T select k, v insert into A; end;
@dist(execGroup='work', parallel='2') partition with (v of T) begin from T select k, v insert into B; end;
""",
        error=("T select k, v insert into B", "Unsupported: T in execGroup Order-work having conflicting strategies."),
    ),
    "a stream a partition does not key is broadcast; a keyed entry stream gets a router": Case(
        """@App:name('Bcast')
define stream S (k string, v int);
define stream Limits (k string, max int);
@dist(execGroup='check', parallel='3') partition with (k of S) begin
    from S#window.length(1) as s join Limits#window.length(1) as l on s.k == l.k
    select s.k, s.v, l.max insert into Checked;
end;
""",
        groups=(("Bcast-passthrough-S", 1, False), ("Bcast-check", 3, False)),
        inputs={
            "Bcast-passthrough-S": {"S": ("all", None, "Bcast.S")},
            "Bcast-check": {"Limits": ("all", None, "Bcast.Limits"), "S": ("field_grouping", "k", "Bcast.S.k")},
        },
        topics={"Bcast.S": 1, "Bcast.S.k": 3, "Bcast.Limits": 1},
    ),
    "parallel > 1: a window outside a partition": Case(
        "@App:name('Bad')\ndefine stream S (k string, v int);\n@dist(execGroup='w', parallel='2') from S#window.length(5) select k, v insert into O;\n",
        error=("length(5)", "Bad-w Window queries used with parallel greater than 1 outside partitioned stream" + PARALLEL_FIX),
    ),
    "parallel > 1: a pattern outside a partition": Case(
        "@App:name('Bad')\ndefine stream S (k string, v int);\n@dist(execGroup='w', parallel='2') from every e1=S -> e2=S[v > e1.v] select e1.k, e2.v insert into O;\n",
        error=("every e1=S", "Bad-wPATTERN queries used with parallel greater than 1 outside partitioned stream" + PARALLEL_FIX),
    ),
    "parallel > 1: a sequence outside a partition": Case(
        "@App:name('Bad')\ndefine stream S (k string, v int);\n@dist(execGroup='w', parallel='2') from e1=S, e2=S[v > e1.v] select e1.k, e2.v insert into O;\n",
        error=("e1=S, e2=S", "Bad-wSEQUENCE queries used with parallel greater than 1 outside partitioned stream" + PARALLEL_FIX),
    ),
    "parallel > 1: a stream join outside a partition": Case(
        """@App:name('Bad')
define stream S (k string, v int);
define stream R (k string, w int);
@dist(execGroup='w', parallel='2') from S#window.length(1) join R#window.length(1) on S.k == R.k select S.k, R.w insert into O;
""",
        error=("S#window.length(1) join", "Bad-wJoin queries used with parallel greater than 1 outside partitioned stream" + PARALLEL_FIX),
    ),
    "parallel > 1: a running sum under round robin (the original let it through)": Case(
        "@App:name('Bad')\ndefine stream S (k string, v int);\n@dist(execGroup='w', parallel='2') from S select k, sum(v) as total insert into O;\n",
        error=(
            "sum(v)",
            "Bad-w Aggregate or group by queries used with parallel greater than 1 outside partitioned stream (each instance would compute a partial result)"
            + PARALLEL_FIX,
        ),
    ),
    "parallel > 1: group by under round robin": Case(
        "@App:name('Bad')\ndefine stream S (k string, v int);\n@dist(execGroup='w', parallel='2') from S select k, v group by k insert into O;\n",
        error=(
            "k insert into O",
            "Bad-w Aggregate or group by queries used with parallel greater than 1 outside partitioned stream (each instance would compute a partial result)"
            + PARALLEL_FIX,
        ),
    ),
    "parallel > 1: grouping by the key the stream is routed by is exact": Case(
        "@App:name('Keyed')"
        + KEYED
        + """
@dist(execGroup='agg', parallel='2') partition with (k of T) begin from T#window.length(3) select k, max(v) as top insert into Tops; end;
@dist(execGroup='agg', parallel='2') from T select k, sum(v) as total group by k insert into Totals;
""",
        groups=(("Keyed-src", 1, False), ("Keyed-agg", 2, False)),
        inputs={"Keyed-agg": {"T": ("field_grouping", "k", "Keyed.T.k")}},
        topics={"Keyed.S": 1, "Keyed.T.k": 2},
    ),
    "parallel > 1: a sum over a field-grouped stream without grouping by its key": Case(
        "@App:name('Keyed')"
        + KEYED
        + """
@dist(execGroup='agg', parallel='2') partition with (k of T) begin from T#window.length(3) select k, max(v) as top insert into Tops; end;
@dist(execGroup='agg', parallel='2') from T select sum(v) as total insert into Totals;
""",
        error=(
            "sum(v)",
            "Keyed-agg Aggregate or group by queries used with parallel greater than 1 outside partitioned stream "
            "(each instance would compute a partial result)" + PARALLEL_FIX,
        ),
    ),
    "parallel > 1: an in-memory table": Case(
        "@App:name('Tab')\ndefine stream S (k string, v int);\ndefine table T (k string, v int);\n@dist(execGroup='w', parallel='2') from S select k, v insert into T;\n",
        error=("T;", "Unsupported: Tab-w with In-Memory Table  having parallel > 1 "),
    ),
    "parallel > 1: a table in a store is shared by every instance": Case(
        """@App:name('Tab')
define stream S (k string, v int);
@store(type='rdbms', jdbc.url='jdbc:h2:mem:tab')
define table T (k string, v int);
@dist(execGroup='w', parallel='2') from S select k, v insert into T;
""",
        groups=(("Tab-w", 2, False),),
        inputs={"Tab-w": {"S": ("round_robin", None, "Tab.S")}},
        topics={"Tab.S": 2},
    ),
    "an in-memory table used by two groups": Case(
        """@App:name('Tab')
define stream S (k string, v int);
define stream Q (k string);
define table T (k string, v int);
@dist(execGroup='g1') from S select k, v insert into T;
@dist(execGroup='g2') from Q join T on Q.k == T.k select T.k, T.v insert into Found;
""",
        error=(
            "T on Q.k",
            "Unsupported:Event Table T In-Memory Table referenced from more than one execGroup: execGroup Tab-g2 && Tab-g1",
        ),
    ),
    "parallel > 1: a defined window": Case(
        """@App:name('Win')
define stream S (k string, v int);
define window W (k string, v int) length(5);
@dist(execGroup='w', parallel='2') partition with (k of S) begin from S select k, v insert into W; end;
""",
        error=("W; end;", "Unsupported: Win-w with (Defined) Window  having parallel >1"),
    ),
    "a defined window used by two groups": Case(
        """@App:name('Win')
define stream S (k string, v int);
define window W (k string, v int) length(5);
@dist(execGroup='g1') from S select k, v insert into W;
@dist(execGroup='g2') from W select k, max(v) as top insert into Tops;
""",
        error=(
            "W select",
            "Unsupported:(Defined) Window W In-Memory window referenced from more than one execGroup: execGroup Win-g2 && Win-g1",
        ),
    ),
    "range partitions are not distributed": Case(
        """@App:name('Rng')
define stream S (k string, v int);
@dist(execGroup='w', parallel='2') partition with (v < 10 as 'low' or v >= 10 as 'high' of S) begin from S select k, v insert into O; end;
""",
        error=("v < 10 as 'low'", "Unsupported: Rng-w Range PartitionType not Supported in Distributed SetUp"),
    ),
    "parallel > 1: a partition key must be an attribute": Case(
        """@App:name('Expr')
define stream S (k string, v int);
@dist(execGroup='w', parallel='2') partition with (str:upper(k) of S) begin from S select k, v insert into O; end;
""",
        error=(
            "str:upper(k) of S",
            "Unsupported: Expr-w partitions S by an expression; with parallel > 1 the partition key must be an attribute of the stream",
        ),
    ),
    "field-grouped topics are sized to the widest reader": Case(
        "@App:name('Size')"
        + KEYED
        + """
@dist(execGroup='wide', parallel='5') partition with (k of T) begin from T#window.length(2) select k, v insert into A; end;
@dist(execGroup='narrow', parallel='2') partition with (k of T) begin from T#window.length(3) select k, v insert into B; end;
""",
        groups=(("Size-src", 1, False), ("Size-wide", 5, False), ("Size-narrow", 2, False)),
        inputs={
            "Size-wide": {"T": ("field_grouping", "k", "Size.T.k")},
            "Size-narrow": {"T": ("field_grouping", "k", "Size.T.k")},
        },
        topics={"Size.S": 1, "Size.T.k": 5},
    ),
    "a user source read by one parallel-1 group stays in it": Case(
        """@App:name('Src')
@source(type='kafka', topic.list='in', group.id='g', @map(type='json'))
define stream S (k string, v int);
@dist(execGroup='one', parallel='1') from S select k, v insert into T;
""",
        groups=(("Src-one", 1, False),),
        inputs={"Src-one": {"S": ("all", None, None)}},
        topics={"in": 1},
    ),
    "an http source read by one parallel-1 group still runs as a receiver": Case(
        """@App:name('Src')
@source(type='http', receiver.url='http://0.0.0.0:8080/in', @map(type='json'))
define stream S (k string, v int);
@dist(execGroup='one', parallel='1') from S select k, v insert into T;
""",
        groups=(("Src-passthrough-S", 1, True), ("Src-one", 1, False)),
        inputs={"Src-passthrough-S": {"S": ("all", None, None)}, "Src-one": {"S": ("all", None, "Src.S")}},
        topics={"Src.S": 1},
    ),
    "a user source read in parallel moves into a receiver passthrough": Case(
        """@App:name('Src')
@source(type='http', receiver.url='http://0.0.0.0:8080/in', @map(type='json'), @dist(parallel='3'))
define stream S (k string, v int);
@dist(execGroup='work', parallel='2') from S select k, v insert into T;
""",
        groups=(("Src-passthrough-S", 3, True), ("Src-work", 2, False)),
        inputs={"Src-passthrough-S": {"S": ("all", None, None)}, "Src-work": {"S": ("round_robin", None, "Src.S")}},
        topics={"Src.S": 2},
    ),
    "each user source gets its own passthrough": Case(
        """@App:name('Src')
@source(type='http', receiver.url='http://0.0.0.0:8080/a', @map(type='json'))
@source(type='http', receiver.url='http://0.0.0.0:8080/b', @map(type='json'), @dist(parallel='2'))
define stream S (k string, v int);
@dist(execGroup='work', parallel='2') from S select k, v insert into T;
""",
        groups=(("Src-passthrough-S-1", 1, True), ("Src-passthrough-S-2", 2, True), ("Src-work", 2, False)),
        inputs={"Src-work": {"S": ("round_robin", None, "Src.S")}},
        topics={"Src.S": 2},
    ),
    "a kafka sink without servers publishes on the cluster": Case(
        """@App:name('Out')
define stream S (k string, v int);
@sink(type='kafka', topic='alerts', @map(type='json'))
define stream Alerts (k string, v int);
@dist(execGroup='w', parallel='2') from S[v > 5] select k, v insert into Alerts;
""",
        groups=(("Out-w", 2, False),),
        inputs={"Out-w": {"S": ("round_robin", None, "Out.S")}},
        topics={"Out.S": 2, "alerts": 1},
    ),
    "a query joining an in-memory aggregation moves into its group": Case(
        """@App:name('Mem')
define stream Trades (symbol string, price double, ts long);
define stream Asks (symbol string);
define aggregation A from Trades select symbol, sum(price) as total group by symbol aggregate by ts every sec ... min;
@dist(execGroup='ask', parallel='1')
from Asks as q join A as a on q.symbol == a.symbol within '2017-06-** **:**:**' per 'seconds'
select a.symbol, a.total insert into Answers;
""",
        groups=(("Mem-aggregation-A", 1, False),),
        inputs={"Mem-aggregation-A": {"Asks": ("all", None, "Mem.Asks"), "Trades": ("all", None, "Mem.Trades")}},
        topics={"Mem.Asks": 1, "Mem.Trades": 1},
    ),
    "a trigger is copied into the group; every instance fires it": Case(
        """@App:name('Tick')
define trigger Second at every 1 sec;
@dist(execGroup='w', parallel='2') from Second select triggered_time insert into Ticks;
""",
        groups=(("Tick-w", 2, False),),
        inputs={"Tick-w": {"Second": ("all", None, None)}},
    ),
    "a group cannot read back a stream it publishes with others": Case(
        """@App:name('Feed')
define stream S (a int);
@dist(execGroup='g1') from S select a insert into X;
@dist(execGroup='g1') from X[a > 1] select a insert into Y;
@dist(execGroup='g2') from S select a insert into X;
@dist(execGroup='g3') from X select a insert into Z;
""",
        error=(
            "X[a > 1]",
            "Unsupported: execGroup Feed-g1 both publishes X and consumes it while other execGroups (Feed-g2) publish "
            "it too, so it would read its own events back; give the streams different names",
        ),
    ),
    "an execGroup may not take a generated group's name": Case(
        """@App:name('Clash')
@source(type='http', receiver.url='http://0.0.0.0:8080/in', @map(type='json'))
define stream S (a int);
@dist(execGroup='passthrough-S', parallel='2') from S select a insert into T;
""",
        error=("@dist(execGroup", "execGroup 'passthrough-S' has the name of a generated group (Clash-passthrough-S); rename the execGroup"),
    ),
    "the app name must be able to name topics": Case(
        "@App:name('my app')\ndefine stream S (a int);\nfrom S select a insert into T;\n",
        error=("@App:name", "app name 'my app' cannot name Kafka topics: use only letters, digits, '.', '_' and '-'"),
    ),
    "a stream name must be able to name a topic": Case(
        "@App:name('Q')\ndefine stream `my stream` (a int);\n@dist(execGroup='g', parallel='2') from `my stream` select a insert into T;\n",
        error=("`my stream`", "stream my stream cannot name a Kafka topic ('Q.my stream'): use only letters, digits, '.', '_' and '-'"),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_rule(name):
    case = CASES[name]
    if case.error is not None:
        with pytest.raises(TopologyError) as raised:
            plan_text(case.app)
        snippet, message = case.error
        assert raised.value.message == message
        assert text_at(case.app, raised.value.line, raised.value.column, len(snippet)) == snippet
        return
    topology = plan_text(case.app)
    assert [(g.name, g.parallelism, g.receiver) for g in topology.groups] == list(case.groups)
    for group, inputs in case.inputs.items():
        actual = {s.stream: (s.strategy, s.partition_key, s.topic) for s in topology.group(group).inputs}
        assert actual == inputs, group
    assert {t.name: t.partitions for t in topology.topics} == case.topics
    check_partial_apps(topology)


def test_there_are_at_least_thirty_apps():
    assert len(CASES) >= 30
    assert sum(case.error is None for case in CASES.values()) >= 12 and sum(case.error is not None for case in CASES.values()) >= 12


def test_aggregation_shards_get_partition_by_id_and_stable_shard_ids():
    """Each shard instance runs its aggregation with @PartitionById and its own instance name as shard
    id (stable across restarts and moves); the joining group's read-only view merges the shards too."""
    topology = plan_text(CASES["seed 002 active-active: an aggregation with parallel 2 is two shards fed round robin"].app)
    shards = topology.group("Trades-aggregation-TradeAggregation").instances
    assert [i.shard_id for i in shards] == ["Trades-aggregation-TradeAggregation-1", "Trades-aggregation-TradeAggregation-2"]
    lookups = topology.group("Trades-lookup").instances
    assert [i.shard_id for i in lookups] == ["Trades-lookup-1", "Trades-lookup-2"]
    for instance in (*shards, *lookups):
        assert "@PartitionById(enable = 'true')" in instance.siddhi or "@PartitionById(enable='true')" in instance.siddhi
    single = plan_text(CASES["seed 002: a persisted aggregation, joined by a parallel group"].app)
    assert all(i.shard_id is None for i in single.partial_apps)


def test_a_stream_with_a_source_and_a_sink_that_no_query_reads_is_carried_to_its_sinks():
    # As in one process, a bridge's events reach its sink: a passthrough hosts both (WSO2's planner drops it).
    topology = plan_text(
        """@App:name('Bridge')
@source(type = 'kafka', topic.list = 'in2', group.id = 'g', @map(type = 'json'))
@sink(type = 'kafka', topic = 'echo', @map(type = 'json'))
define stream In2 (sym string, price double);
@source(type = 'kafka', topic.list = 'in1', group.id = 'g1', @map(type = 'json'))
define stream In1 (sym string, price double);
@dist(execGroup = 'g1') from In1 select * insert into Out;
"""
    )
    (bridge,) = [g for g in topology.groups if g.kind == "passthrough"]
    app = bridge.instances[0].app
    assert [s.get("topic.list") for s in app.definition("passthroughIn2").annotations_named("source")] == ["in2"]
    assert [s.get("topic") for s in app.definition("In2").annotations_named("sink")] == ["echo"]
    assert {t.name for t in topology.topics} >= {"in2", "echo"}
    check_partial_apps(topology)
