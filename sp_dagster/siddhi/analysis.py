"""The semantic pass: resolve every stream and attribute, infer output streams, find mistakes.
`analyze(app)` returns an Analysis: what each name means, the streams queries define implicitly
with their inferred types, and every error found.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.errors import SiddhiQLError
from sp_dagster.siddhi.functions import EXTRA_ATTRIBUTES, STREAM_FUNCTIONS, WINDOWS, suggestion
from sp_dagster.siddhi.scope import Attributes, Scope, Source
from sp_dagster.siddhi.types import ExpressionChecker, check_arguments

TRIGGER_ATTRIBUTES: Attributes = (ast.AttributeDef("triggered_time", "long"),)
AGGREGATION_TIMESTAMP = ast.AttributeDef("AGG_TIMESTAMP", "long")
FAULT_ATTRIBUTE = ast.AttributeDef("_error", "object")


@dataclass
class Analysis:
    """What an app's names mean, as resolved by `analyze`.

    `streams` holds every stream a query can read or write by name: the defined ones and
    the ones inferred from `insert into` (named in `inferred`). Per-query and per-partition
    results are looked up with the query or partition object of this same `app`.
    """

    app: ast.App
    streams: dict[str, ast.StreamDefinition] = field(default_factory=dict)
    inferred: set[str] = field(default_factory=set)
    tables: dict[str, ast.TableDefinition] = field(default_factory=dict)
    windows: dict[str, ast.WindowDefinition] = field(default_factory=dict)
    triggers: dict[str, ast.TriggerDefinition] = field(default_factory=dict)
    aggregations: dict[str, ast.AggregationDefinition] = field(default_factory=dict)
    aggregation_attributes: dict[str, Attributes] = field(default_factory=dict)
    errors: list[SiddhiQLError] = field(default_factory=list)
    _outputs: dict[int, Attributes | None] = field(default_factory=dict)
    _scopes: dict[int, Scope] = field(default_factory=dict)
    _inner: dict[int, dict[str, ast.StreamDefinition]] = field(default_factory=dict)
    _keep: list[object] = field(default_factory=list)  # keeps ids above valid

    def attributes(self, name: str) -> Attributes | None:
        """The attributes of the stream, trigger, table, window or aggregation `name`."""
        if name in self.streams:
            return self.streams[name].attributes
        if name in self.triggers:
            return TRIGGER_ATTRIBUTES
        for definitions in (self.tables, self.windows):
            if name in definitions:
                return definitions[name].attributes
        return self.aggregation_attributes.get(name)

    def output(self, query: ast.Query) -> Attributes | None:
        """The attributes `query` outputs (None when they could not be inferred)."""
        return self._outputs.get(id(query))

    def scope(self, query: ast.Query) -> Scope | None:
        """The names `query`'s select clause can use (for typing its expressions)."""
        return self._scopes.get(id(query))

    def inner_streams(self, partition: ast.Partition) -> dict[str, ast.StreamDefinition]:
        """The inner streams (`#S`) of `partition`, with inferred attributes."""
        return self._inner.get(id(partition), {})


def analyze(app: ast.App) -> Analysis:
    """Resolve `app`'s names and infer its output streams; errors are in `.errors`.

    The Analysis holds the definitions by name, the streams that queries define implicitly (`insert into X` with X
    undefined) with inferred attribute types, each partition's inner streams (`#S`), each query's output attributes
    and scope, and every error found. Queries are resolved in data-flow order, so a query may read a stream that a
    later query defines, as long as the dependencies have no cycle."""
    analyzer = _Analyzer(app)
    analyzer.run()
    return analyzer.result


def check_on_demand_query(query: ast.OnDemandQuery, analysis: Analysis) -> tuple[Attributes | None, list[SiddhiQLError]]:
    """The attributes an on-demand query returns when run against an analysed app, and its errors."""
    analyzer = _Analyzer(analysis.app, replace(analysis, errors=[]))
    analyzer.checker.tables = {name: t.attributes for name, t in analysis.tables.items()}
    outputs = analyzer.on_demand(query)
    return outputs, sorted(analyzer.result.errors, key=lambda e: (e.line, e.column))


class _Analyzer:
    def __init__(self, app: ast.App, result: Analysis | None = None) -> None:
        self.app = app
        self.result = result or Analysis(app)
        self.checker = ExpressionChecker(self.report, {})
        self.reported: set[tuple[int, int, str]] = set()
        self.uninferred: set[str] = set()  # streams whose defining query had errors

    def report(self, message: str, node: ast.Node) -> None:
        key = (node.line, node.column, message)
        if key not in self.reported:
            self.reported.add(key)
            self.result.errors.append(SiddhiQLError(message, node.line, node.column))

    # ------------------------------------------------------------------ the passes

    def run(self) -> None:
        self._collect_definitions()
        self.checker.tables = {name: t.attributes for name, t in self.result.tables.items()}
        for window in self.result.windows.values():
            self._window_definition(window)
        tasks: list[tuple[ast.Query | ast.AggregationDefinition, ast.Partition | None]] = [
            (d, None) for d in self.app.definitions if isinstance(d, ast.AggregationDefinition)
        ]
        tasks += list(self.app.queries())
        for partition in self.app.partitions:
            self.result._inner[id(partition)] = {}
        self.result._keep.extend(self.app.elements)
        self._resolve_in_data_flow_order(tasks)
        for partition in self.app.partitions:
            self._partition_keys(partition)

    def _resolve_in_data_flow_order(self, tasks: list[tuple[ast.Query | ast.AggregationDefinition, ast.Partition | None]]) -> None:
        pending = list(range(len(tasks)))
        while pending:
            ready = [i for i in pending if self._inputs_known(*tasks[i])]
            if not ready:
                ready = pending[:1]  # what is left reads undefined streams: report them
            for i in ready:
                self._task(*tasks[i])
            pending = [i for i in pending if i not in ready]

    def _inputs_known(self, element: ast.Query | ast.AggregationDefinition, partition: ast.Partition | None) -> bool:
        inputs = (element.input,) if isinstance(element, ast.AggregationDefinition) else element.input_streams()
        return all(self._lookup(s, partition) is not None for s in inputs)

    def _task(self, element: ast.Query | ast.AggregationDefinition, partition: ast.Partition | None) -> None:
        if isinstance(element, ast.AggregationDefinition):
            self._aggregation(element)
        else:
            self._query(element, partition)

    # ------------------------------------------------------------------ definitions

    def _collect_definitions(self) -> None:
        seen: dict[str, ast.Definition] = {}
        for definition in self.app.definitions:
            if definition.name in seen:
                first = seen[definition.name]
                self.report(f"'{definition.name}' is already defined on line {first.line}.", definition)
                continue
            seen[definition.name] = definition
            if isinstance(definition, ast.FunctionDefinition):
                self.report(f"Script functions are not supported; '{definition.name}' cannot be defined.", definition)
            if isinstance(definition, ast.StreamDefinition):
                self.result.streams[definition.name] = definition
            elif isinstance(definition, ast.TableDefinition):
                self.result.tables[definition.name] = definition
            elif isinstance(definition, ast.WindowDefinition):
                self.result.windows[definition.name] = definition
            elif isinstance(definition, ast.TriggerDefinition):
                self.result.triggers[definition.name] = definition
            elif isinstance(definition, ast.AggregationDefinition):
                self.result.aggregations[definition.name] = definition
            self._attribute_names(getattr(definition, "attributes", ()))
            if isinstance(definition, ast.TriggerDefinition):
                self._trigger(definition)

    def _attribute_names(self, attributes: Attributes) -> None:
        seen: set[str] = set()
        for attribute in attributes:
            if attribute.name in seen:
                self.report(f"Attribute '{attribute.name}' is defined twice.", attribute)
            seen.add(attribute.name)

    def _trigger(self, trigger: ast.TriggerDefinition) -> None:
        if trigger.every is not None:
            if trigger.every.millis <= 0:
                self.report("A trigger period must be longer than zero.", trigger.every)
        elif (trigger.at or "").strip().lower() != "start" and len((trigger.at or "").split()) not in (6, 7):
            self.report(f"Trigger '{trigger.name}' needs 'start' or a cron expression of six or seven fields.", trigger)

    def _window_definition(self, definition: ast.WindowDefinition) -> None:
        source = Source(frozenset({definition.name}), definition.attributes)
        self._window(definition.window, Scope((source,), source))

    def _aggregation(self, definition: ast.AggregationDefinition) -> None:
        found = self._lookup(definition.input, None)
        if found is None or found[0] != "stream":
            self._report_input(definition.input, found, "an aggregation")
            scope, attributes = Scope(incomplete=True), None
        else:
            scope, attributes = self._handlers(definition.input, found[1], no_window="An aggregation cannot use a window.", events=())
        outputs = self._selection(definition.selector, scope, attributes)
        if definition.aggregate_by is not None:
            by_type = self.checker.check(definition.aggregate_by, scope)
            if by_type not in (None, "long", "string"):
                self.report(f"'aggregate by' needs a long or string timestamp, not {by_type}.", definition.aggregate_by)
        if not definition.duration_range and len(definition.durations) > 1:
            order = [ast.DURATIONS.index(d) for d in definition.durations]
            if order != sorted(set(order)):
                self.report("Aggregation durations must go from the smallest to the largest, once each.", definition)
        if outputs is not None:
            self.result.aggregation_attributes[definition.name] = (AGGREGATION_TIMESTAMP,) + outputs

    # ------------------------------------------------------------------ streams

    def _lookup(self, stream: ast.StreamInput, partition: ast.Partition | None) -> tuple[str, Attributes] | None:
        """(kind, attributes) of what `stream` reads, or None when it is not (yet) defined."""
        if stream.inner:
            inner = self.result._inner.get(id(partition), {}) if partition is not None else {}
            found = inner.get(stream.stream)
            return ("stream", found.attributes) if found else None
        name = stream.stream
        if name in self.result.streams:
            attributes = self.result.streams[name].attributes
            return ("stream", attributes + (FAULT_ATTRIBUTE,) if stream.fault else attributes)
        if name in self.result.triggers:
            return ("stream", TRIGGER_ATTRIBUTES)
        for kind, registry in (("window", self.result.windows), ("table", self.result.tables)):
            if name in registry:
                return (kind, registry[name].attributes)
        if name in self.result.aggregation_attributes:
            return ("aggregation", self.result.aggregation_attributes[name])
        return None

    def _report_input(self, stream: ast.StreamInput, found: tuple[str, Attributes] | None, reader: str) -> None:
        name = stream.stream
        if found is not None:
            self.report(f"{found[0].capitalize()} '{name}' cannot be read by {reader}.", stream)
        elif stream.inner:
            self.report(f"Inner stream '#{name}' is not defined in this partition.", stream)
        elif name in self.result.aggregations or name in self.uninferred:
            return  # the error that left it undefined was reported where it happened
        else:
            known = {**self.result.streams, **self.result.tables, **self.result.windows, **self.result.triggers}
            hint = suggestion(known, name)  # type: ignore[arg-type]
            self.report(f"Stream '{name}' is not defined" + (f"; did you mean '{hint}'?" if hint else "."), stream)

    def _handlers(self, stream: ast.StreamInput, attributes: Attributes, *, no_window: str | None, events: tuple[Source, ...]) -> tuple[Scope, Attributes]:
        """Check a stream's filters, functions and window (`no_window`: why none is allowed)."""
        qualifiers = frozenset({stream.stream})
        windows = 0
        for handler in stream.handlers:
            own = Source(qualifiers, attributes, inner=stream.inner)
            scope = Scope(events + (own,), own, events=frozenset(q for e in events for q in e.qualifiers if e.event))
            if isinstance(handler, ast.Filter):
                self._condition(handler.condition, scope, "A filter")
            elif isinstance(handler, ast.Window):
                windows += 1
                if no_window:
                    self.report(no_window, handler)
                elif windows == 2:
                    self.report("A stream can have only one window.", handler)
                self._window(handler, scope)
            else:
                attributes = attributes + self._stream_function(handler, scope)
        own = Source(qualifiers, attributes, inner=stream.inner)
        return Scope(events + (own,), own), attributes

    def _window(self, window: ast.Window, scope: Scope) -> None:
        spec = WINDOWS.get(window.qualified_name)
        if spec is None:
            hint = suggestion(WINDOWS, window.qualified_name)
            self.report(f"Window '{window.qualified_name}' is not defined" + (f"; did you mean '{hint}'?" if hint else "."), window)
            return
        types = [self.checker.check(arg, scope) for arg in window.args]
        check_arguments(spec, window.qualified_name, window.args, types, self.report, window)

    def _stream_function(self, function: ast.StreamFunction, scope: Scope) -> Attributes:
        spec = STREAM_FUNCTIONS.get(function.qualified_name)
        if spec is None:
            self.report(f"Stream function '{function.qualified_name}' is not defined.", function)
            return ()
        types = [self.checker.check(arg, scope) for arg in function.args]
        check_arguments(spec, function.qualified_name, function.args, types, self.report, function)
        return tuple(ast.AttributeDef(n, t) for n, t in EXTRA_ATTRIBUTES.get(function.name, ()))

    def _condition(self, condition: ast.Expression, scope: Scope, what: str, *, aggregates: bool = False) -> None:
        found = self.checker.check(condition, scope, aggregates=aggregates)
        if found is not None and found != "bool":
            self.report(f"{what} condition must be bool, not {found}.", condition)

    # ------------------------------------------------------------------ query inputs

    def _query(self, query: ast.Query, partition: ast.Partition | None) -> None:
        scope, star = self._input(query.input, partition)
        outputs = self._selection(query.selector, scope, star)
        self.result._outputs[id(query)] = outputs
        self.result._scopes[id(query)] = scope
        if query.rate is not None:
            self._rate(query.rate)
        self._output(query, outputs, scope, partition)

    def _input(self, query_input: ast.QueryInput, partition: ast.Partition | None) -> tuple[Scope, Attributes | None]:
        """The scope of a query's input and the attributes `select *` gives (None: unknown)."""
        if isinstance(query_input, ast.StreamInput):
            found = self._lookup(query_input, partition)
            if found is None or found[0] not in ("stream", "window"):
                self._report_input(query_input, found, "a query on its own; join it instead")
                return Scope(incomplete=True), None
            return self._handlers(query_input, found[1], no_window=_window_rule(found[0], query_input), events=())
        if isinstance(query_input, ast.JoinInput):
            return self._join(query_input, partition)
        return self._pattern(query_input, partition)

    def _join(self, join: ast.JoinInput, partition: ast.Partition | None) -> tuple[Scope, Attributes | None]:
        sources, kinds, star, incomplete = [], [], (), False
        for side in (join.left, join.right):
            found = self._lookup(side.stream, partition)
            if found is None:
                self._report_input(side.stream, None, "a join")
                incomplete = True
                continue
            kinds.append(found[0])
            _, attributes = self._handlers(side.stream, found[1], no_window=_window_rule(found[0], side.stream), events=())
            qualifiers = frozenset({side.stream.stream} | ({side.alias} if side.alias else set()))
            sources.append(Source(qualifiers, attributes, inner=side.stream.inner, label=side.reference))
            star += attributes
        scope = Scope(tuple(sources), incomplete=incomplete)
        if kinds.count("table") + kinds.count("aggregation") == 2:
            self.report("A join needs at least one stream or window side; both sides here are stored.", join)
        if "aggregation" not in kinds and not incomplete:
            misplaced = join.within[0] if join.within else join.per
            if misplaced is not None:
                self.report("'within' and 'per' can only be used when joining an aggregation.", misplaced)
        if join.on is not None:
            self._condition(join.on, scope, "A join")
        for expression in join.within + ((join.per,) if join.per is not None else ()):
            self.checker.check(expression, scope)
        return scope, None if incomplete else star

    def _pattern(self, state: ast.StateInput, partition: ast.Partition | None) -> tuple[Scope, Attributes | None]:
        leaves = list(state.states())
        sources, incomplete = [], False
        resolved: list[Attributes | None] = []
        for leaf in leaves:
            found = self._lookup(leaf.stream, partition)
            if found is None or found[0] != "stream":
                self._report_input(leaf.stream, found, "a pattern or sequence")
                incomplete = True
                resolved.append(None)
                continue
            resolved.append(found[1])
            if isinstance(leaf, ast.StreamState):
                event = leaf.event is not None
                label = leaf.event or leaf.stream.stream
                sources.append(Source(frozenset({label}), found[1], inner=leaf.stream.inner and not event, event=event, label=label))
            self._quantifier(leaf)
        events = tuple(sources)
        for leaf, attributes in zip(leaves, resolved):
            if attributes is not None:
                self._handlers(leaf.stream, attributes, no_window="Patterns and sequences cannot use windows.", events=events)
        self._state_structure(state)
        names = frozenset(q for s in sources if s.event for q in s.qualifiers)
        scope = Scope(events, incomplete=incomplete, events=names)
        star = None if incomplete else tuple(a for s in sources for a in s.attributes)
        return scope, star

    def _state_structure(self, state: ast.StateInput) -> None:
        """Siddhi's rules on where `every`, `not ... for` and `*`/`+`/`?` may stand."""
        top = state.element.elements if isinstance(state.element, ast.StateChain) else (state.element,)
        if state.kind == "sequence":
            for element in top[1:]:
                if isinstance(element, ast.EveryState):
                    self.report("In a sequence, 'every' can only stand before the first element.", element)
        for element, parent in _walk_states(state.element, None):
            if isinstance(element, ast.AbsentState) and element.waiting is None:
                paired = (
                    isinstance(parent, ast.LogicalState)
                    and parent.op == "and"
                    and not all(isinstance(side, ast.AbsentState) for side in (parent.left, parent.right))
                )
                if not paired:
                    self.report("An absent event needs 'for <time>' unless it is paired with an event by 'and'.", element)
            quantifier = getattr(element, "quantifier", None)
            if quantifier is not None and quantifier.symbol and state.kind == "pattern":
                self.report(f"'{quantifier.symbol}' counts events in sequences; patterns count with <min:max>.", quantifier)

    def _quantifier(self, leaf: ast.StreamState | ast.AbsentState) -> None:
        quantifier = getattr(leaf, "quantifier", None)
        if quantifier and quantifier.min is not None and quantifier.max is not None and quantifier.min > quantifier.max:
            self.report(f"The count <{quantifier.min}:{quantifier.max}> has its minimum above its maximum.", quantifier)

    # ------------------------------------------------------------------ selection

    def _selection(self, selector: ast.Selector, scope: Scope, star: Attributes | None) -> Attributes | None:
        """Check select/group by/having/order by/limit/offset; the output attributes."""
        for variable in selector.group_by:
            self.checker.check(variable, scope)
        outputs = self._select(selector, scope, star)
        after = scope.with_outputs(outputs or ())
        if selector.having is not None:
            self._condition(selector.having, after, "A having", aggregates=True)
        for order in selector.order_by:
            self.checker.check(order.variable, after)
        for clause, value in (("limit", selector.limit), ("offset", selector.offset)):
            if value is not None:
                found = self.checker.check(value, scope)
                if found not in (None, "int", "long"):
                    self.report(f"'{clause}' needs an int or long, not {found}.", value)
        return outputs

    def _select(self, selector: ast.Selector, scope: Scope, star: Attributes | None) -> Attributes | None:
        if selector.star:
            if star is not None:
                self._unique_names(star, selector, "'select *' gives attribute '{}' twice; select by name instead.")
            return star
        outputs, known = [], True
        for attribute in selector.attributes:
            found = self.checker.check(attribute.expression, scope, aggregates=True)
            if attribute.name is None:
                self.report("This expression needs a name; add 'as <name>'.", attribute)
                known = False
            elif found is None:
                known = False
            else:
                outputs.append(ast.AttributeDef(attribute.name, found, line=attribute.line, column=attribute.column))
        self._unique_names(tuple(outputs), None, "Attribute '{}' is selected twice.")
        return tuple(outputs) if known else None

    def _unique_names(self, attributes: Attributes, at: ast.Node | None, message: str) -> None:
        seen: set[str] = set()
        for attribute in attributes:
            if attribute.name in seen:
                self.report(message.format(attribute.name), at or attribute)
            seen.add(attribute.name)

    def _rate(self, rate: ast.OutputRate) -> None:
        amount = rate.value if isinstance(rate.value, int) else rate.value.millis  # an int: `every N events`
        if amount <= 0:
            self.report("An output rate must be greater than zero.", rate)

    # ------------------------------------------------------------------ outputs

    def _output(self, query: ast.Query, outputs: Attributes | None, scope: Scope, partition: ast.Partition | None) -> None:
        output = query.output
        if isinstance(output, ast.InsertInto):
            self._insert(output, outputs, partition)
        elif isinstance(output, (ast.Delete, ast.Update, ast.UpdateOrInsert)):
            self._modify(output, outputs)

    def _insert(self, output: ast.InsertInto, outputs: Attributes | None, partition: ast.Partition | None) -> None:
        name = output.target
        if output.inner:
            if partition is None:
                self.report(f"Inner stream '#{name}' can only be used inside a partition.", output)
                return
            inner = self.result._inner[id(partition)]
            if name in inner:
                self._matches(outputs, inner[name].attributes, f"inner stream '#{name}'", output)
            elif outputs is not None:
                inner[name] = ast.StreamDefinition(name, outputs, line=output.line, column=output.column)
            return
        if name in self.result.triggers or name in self.result.aggregations:
            kind = "trigger" if name in self.result.triggers else "aggregation"
            self.report(f"Queries cannot insert into {kind} '{name}'.", output)
        elif name in self.result.tables or name in self.result.windows or name in self.result.streams:
            kind = "table" if name in self.result.tables else "window" if name in self.result.windows else "stream"
            self._matches(outputs, self.result.attributes(name) or (), f"{kind} '{name}'", output)
        elif outputs is not None:
            self.result.streams[name] = ast.StreamDefinition(name, outputs, line=output.line, column=output.column)
            self.result.inferred.add(name)
        else:
            self.uninferred.add(name)

    def _matches(self, outputs: Attributes | None, expected: Attributes, what: str, at: ast.Node) -> None:
        if outputs is None:
            return
        got = [(a.name, a.type) for a in outputs]
        if got != [(a.name, a.type) for a in expected]:
            self.report(f"The query outputs {_signature(outputs)} but {what} has {_signature(expected)}.", at)

    def _modify(self, output: ast.Delete | ast.Update | ast.UpdateOrInsert, outputs: Attributes | None) -> None:
        table = self.result.tables.get(output.target)
        if table is None:
            verb = {ast.Delete: "delete", ast.Update: "update", ast.UpdateOrInsert: "update or insert"}[type(output)]
            self.report(f"'{output.target}' is not a table; '{verb}' needs a table.", output)
            return
        source = Source(frozenset({table.name}), table.attributes)
        scope = Scope((source,), outputs=outputs or (), incomplete=outputs is None)
        if output.on is not None:
            self._condition(output.on, scope, "An 'on'")
        for assignment in getattr(output, "set", ()):
            target = assignment.variable
            if target.stream != table.name or table.attribute(target.name) is None:
                self.report(f"'set' must assign an attribute of '{table.name}', such as {table.name}.{table.attributes[0].name}.", target)
            self.checker.check(assignment.value, scope)

    # ------------------------------------------------------------------ on-demand queries

    def on_demand(self, query: ast.OnDemandQuery) -> Attributes | None:
        """Check an on-demand query; the attributes it returns (None: unknown or nothing)."""
        selector = query.selector or ast.Selector()
        if query.input is None:
            outputs = self._selection(selector, Scope(), ())
            if isinstance(query.output, ast.InsertInto):
                self._insert_rows(query.output, outputs)
            elif query.output is not None:
                self._modify(query.output, outputs)
            return None
        store = query.input
        attributes = self.result.attributes(store.store)
        is_stored = store.store in self.result.tables or store.store in self.result.windows
        if attributes is None or not (is_stored or store.store in self.result.aggregations):
            self.report(f"'{store.store}' is not a table, window or aggregation of this app.", store)
            return None
        source = Source(frozenset({store.store} | ({store.alias} if store.alias else set())), attributes, label=store.alias or store.store)
        scope = Scope((source,), source)
        if store.on is not None:
            self._condition(store.on, scope, "An 'on'")
        if (store.within or store.per is not None) and store.store not in self.result.aggregations:
            self.report("'within' and 'per' can only be used on an aggregation.", store)
        for expression in store.within + ((store.per,) if store.per is not None else ()):
            self.checker.check(expression, scope)
        return self._selection(selector, scope, attributes)

    def _insert_rows(self, output: ast.InsertInto, outputs: Attributes | None) -> None:
        table = self.result.tables.get(output.target)
        if table is None:
            self.report(f"'{output.target}' is not a table; on-demand queries insert into tables.", output)
        else:
            self._matches(outputs, table.attributes, f"table '{table.name}'", output)

    # ------------------------------------------------------------------ partitions

    def _partition_keys(self, partition: ast.Partition) -> None:
        seen: set[str] = set()
        for key in partition.keys:
            if key.stream in seen:
                self.report(f"Stream '{key.stream}' is partitioned twice.", key)
            seen.add(key.stream)
            definition = self.result.streams.get(key.stream)
            if definition is None:
                known = key.stream in self.result.tables or key.stream in self.result.windows
                self.report(f"Only streams can be partitioned, and '{key.stream}' is {'not a stream' if known else 'not defined'}.", key)
                continue
            source = Source(frozenset({key.stream}), definition.attributes)
            scope = Scope((source,), source)
            if isinstance(key, ast.ValuePartition):
                self.checker.check(key.expression, scope)
            else:
                for condition in key.ranges:
                    self._condition(condition.condition, scope, "A range partition")


def _window_rule(kind: str, stream: ast.StreamInput) -> str | None:
    """Why `stream` (a stream, window, table or aggregation) cannot take a window, if it cannot."""
    return None if kind == "stream" else f"{kind.capitalize()} '{stream.stream}' cannot take a window."


def _walk_states(element: ast.StateElement, parent: ast.StateElement | None):
    """Every pattern element under `element` with its parent, depth first."""
    yield element, parent
    children = {
        ast.LogicalState: lambda e: (e.left, e.right),
        ast.EveryState: lambda e: (e.element,),
        ast.StateChain: lambda e: e.elements,
    }.get(type(element), lambda e: ())(element)
    for child in children:
        yield from _walk_states(child, element)


def _signature(attributes: Attributes) -> str:
    return "(" + ", ".join(f"{a.name} {a.type}" for a in attributes) + ")"
