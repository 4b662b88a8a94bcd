"""A small event generator for the demo: random events into the entry streams of a deployed app.
Run as `python -m sp_dagster.orchestration.generator --conf FILE --app NAME [--rate N]`; it
publishes about N events a second until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time

from sp_dagster.subprocesses import on_stop_signal

SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT", "GOOG")


def entry_streams(plan: dict) -> list[str]:
    """The streams an app reads from topics that none of its own groups publishes."""
    published = {p["topic"] for g in plan["groups"] for pubs in g["outputs"].values() for p in pubs}
    return sorted({s for g in plan["groups"] for s, sub in g["inputs"].items() if sub.get("topic") and sub["topic"] not in published})


def random_value(kind: str, rng: random.Random):
    """A random value of a Siddhi attribute type, shaped for the sample app: a few stock symbols, prices around 100, volumes around 150."""
    kind = kind.lower()
    if kind == "string":
        return rng.choice(SYMBOLS)
    if kind in ("double", "float"):
        return round(rng.uniform(60.0, 140.0), 2)
    if kind in ("int", "long"):
        return rng.randint(50, 250)
    if kind == "bool":
        return rng.random() < 0.5
    return None


def generate(conf: str, app: str, rate: float, stop: threading.Event, seed: int | None = None) -> int:
    """Publish random events to the app's entry streams until `stop` is set; returns how many were sent."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.store.deployments import get_deployment
    from sp_dagster.config.loader import load_config
    from sp_dagster.deploy.streams import stream_topic
    from sp_dagster.errors import SpDagsterError
    from sp_dagster.messaging import RoundRobin, codec_for, transport_for

    config = load_config(conf)
    with ControlPlane.from_config(config, migrate=False) as plane:
        record = get_deployment(plane, app)
        if record is None:
            raise SpDagsterError(f"no deployment named '{app}' to generate events for")
        targets = [stream_topic(plane, app, stream, writing=True) for stream in entry_streams(record.plan)]
    if not targets:
        raise SpDagsterError(f"{app} reads no stream from a topic: nothing to generate")
    transport = transport_for(config.messaging)
    publishers = [(t, transport.publisher(t.topic, codec_for(t.codec, t.attributes), RoundRobin())) for t in targets]
    print(f"generating about {rate:g} events/s into {', '.join(f'{app}:{t.stream} ({t.topic})' for t in targets)}", flush=True)
    rng, sent = random.Random(seed), 0
    while not stop.wait(1.0 / rate):
        for target, publisher in publishers:
            publisher.send([tuple(random_value(a.type, rng) for a in target.attributes)], [int(time.time() * 1000)])
            publisher.flush()
            sent += 1
    transport.close()
    print(f"generated {sent} events", flush=True)
    return sent


def main(argv: list[str] | None = None) -> int:
    """Run the generator in the foreground."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--conf", required=True, help="a deployment.yaml naming the control plane and broker")
    parser.add_argument("--app", required=True, help="the deployed app's name")
    parser.add_argument("--rate", type=float, default=5.0, help="events per second (default 5)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    on_stop_signal(stop.set)
    from sp_dagster.errors import SpDagsterError

    try:
        generate(args.conf, args.app, args.rate, stop)
    except SpDagsterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
