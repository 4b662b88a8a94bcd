"""Elastic parallelism under a step load: time to advice, time to drain and rescales per hour, beside a fixed peer.

Run: python bench/elastic.py [--rate EVENTS_PER_S] [--seconds S] [--queries N] [--max-parallel M] [--stabilization S] [--cooldown S]
A group of N stateless queries (`@dist(parallel='1', maxParallel='M')`, one message out per query per
event) on a local cluster of 2 workers, the embedded broker, gets a step load of --rate events/s for
--seconds. In the *autoscaled* run the autoscaling sensor (Dagster's, evaluated every 5 s as the
daemon would) launches `rescale` runs from the advice; the *fixed* peer runs the same load on a fresh
cluster at the parallelism the autoscaled run ended at, from the start. Each run prints one JSON line:
seconds from the step to the first advice above 1 (autoscaled only), seconds from the step until the
lag stays under one second of load (time to drain, measured after the producer stops when it never
drains before), the rescales and their rate per hour, and the machine's load average. The same
machine, broker build and app in one run: compare the two lines, not figures across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from sp_dagster.embedded import EmbeddedBroker  # noqa: E402
from sp_dagster.embedded.local_cluster import LocalCluster  # noqa: E402

SAMPLE_S = 5.0  # how often the bench reads the advice and evaluates the sensor


def app_text(name: str, queries: int, parallel: int, most: int) -> str:
    """The elastic app: one group of `queries` stateless queries over Trades."""
    text = f"@App:name('{name}')\ndefine stream Trades (symbol string, price double, volume long);\n"
    text += f"@sink(type = 'kafka', topic = '{name}.Out', @map(type = 'json'))\ndefine stream Out (symbol string, price double, volume long);\n"
    dist = f"@dist(execGroup = 'work', parallel = '{parallel}', maxParallel = '{most}')"
    return text + "".join(f"{dist}\nfrom Trades[volume >= {i}]\nselect symbol, price * {i} as price, volume\ninsert into Out;\n" for i in range(queries))


def work_group(cluster: LocalCluster, name: str) -> dict:
    """The group's line of `sp-dagster advise --json`."""
    (group,) = json.loads(cluster.cli("advise", name, "--json"))["apps"][0]["groups"]
    return group


def run(bootstrap: str, home: Path, args, parallel: int, autoscaled: bool) -> dict:
    """One run of the step load; its figures."""
    import dagster as dg

    from sp_dagster.deploy import load_app, plan_app
    from sp_dagster.messaging import RoundRobin, codec_for
    from sp_dagster.messaging.kafka import KafkaTransport
    from sp_dagster.orchestration.autoscaling import build_autoscaling_sensor
    from sp_dagster.orchestration.jobs import rescale_job
    from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource
    from sp_dagster.worker.instance.plan import plan_instance

    cluster = LocalCluster(home / "cluster", bootstrap, workers=2, slots=4)
    settings = f"{{enabled: {str(autoscaled).lower()}, stabilizationSeconds: {args.stabilization}, cooldownSeconds: {args.cooldown}}}"
    conf = cluster.manager_conf.read_text()
    cluster.manager_conf.write_text(conf.replace("  type: distributed\n", f"  type: distributed\n  autoscaling: {settings}\n", 1))
    app_path = home / "elastic.siddhi"
    name = "ElasticAutoscaled" if autoscaled else "ElasticFixed"
    app_path.write_text(app_text(name, args.queries, parallel, args.max_parallel))
    first = plan_app(load_app(app_path)).group("work").instances[0]  # type: ignore[union-attr]  (the app has the group)
    (entry,) = plan_instance(first.name, first.siddhi).inputs
    transport = KafkaTransport(bootstrap, timeout=15)
    stop, sent = threading.Event(), [0]
    step = args.rate * SAMPLE_S / 10  # events per tenth of a sample

    def produce() -> None:
        publisher = transport.publisher(entry.topic, codec_for(entry.codec, entry.attributes), RoundRobin())
        rows = [(f"S{i % 50}", 10.0 + i % 7, 5 + i % 30) for i in range(int(step))]
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < args.seconds:
            publisher.send(rows, [int(time.time() * 1000)] * len(rows))
            publisher.flush(60)
            sent[0] += len(rows)
            time.sleep(max(0.0, started + sent[0] / args.rate - time.monotonic()))

    resources = {"control_plane": ControlPlaneResource(conf=str(cluster.manager_conf)), "messaging": MessagingResource(conf=str(cluster.manager_conf))}
    sensor = build_autoscaling_sensor(rescale_job)
    figures: dict = {"bench": "elastic", "run": "autoscaled" if autoscaled else "fixed", "start_parallel": parallel}
    rescales, advised_at, drained_at = 0, None, None
    cluster.start()
    producer = threading.Thread(target=produce, daemon=True)
    try:
        cluster.deploy(app_path, timeout=240)
        started = time.monotonic()
        producer.start()
        with dg.instance_for_test() as instance:
            while time.monotonic() - started < args.seconds + args.drain_timeout:
                time.sleep(SAMPLE_S)
                group = work_group(cluster, name)
                elapsed = time.monotonic() - started
                print(
                    json.dumps({"at_s": round(elapsed, 1), **{k: group.get(k) for k in ("parallel", "advised", "lag", "busy", "arrival_per_s")}}),
                    file=sys.stderr,
                )
                if advised_at is None and group["advised"] > 1:
                    advised_at = elapsed
                if group["lag"] is not None and group["lag"] < args.rate and elapsed > 2 * SAMPLE_S:
                    drained_at = drained_at or elapsed
                else:
                    drained_at = None
                if drained_at is not None and not producer.is_alive():
                    break
                if autoscaled:
                    with dg.build_sensor_context(instance=instance, resources=resources) as context:
                        for request in sensor.evaluate_tick(context).run_requests or []:
                            rescales += 1
                            rescale_job.execute_in_process(run_config=request.run_config, resources=resources, instance=instance, raise_on_error=False)
        final = work_group(cluster, name)
        hours = (time.monotonic() - started) / 3600
        figures.update(
            time_to_advice_s=None if advised_at is None or not autoscaled else round(advised_at, 1),
            time_to_drain_s=None if drained_at is None else round(drained_at, 1),
            rescales=rescales,
            rescales_per_hour=round(rescales / hours, 1),
            end_parallel=final["parallel"],
            events=sent[0],
            load_avg=os.getloadavg()[0],
        )
        return figures
    finally:
        stop.set()
        producer.join(30)
        cluster.stop()
        transport.close()


def main() -> None:
    """Run the autoscaled step load, then its fixed peer, and print a JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=3000, help="events per second of the step (default 3000)")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the step lasts (default 120)")
    parser.add_argument("--queries", type=int, default=20, help="stateless queries in the group: its cost per event (default 20)")
    parser.add_argument("--max-parallel", type=int, default=4, help="the group's maxParallel (default 4)")
    parser.add_argument("--stabilization", type=int, default=20, help="autoscaling.stabilizationSeconds (default 20)")
    parser.add_argument("--cooldown", type=int, default=60, help="autoscaling.cooldownSeconds (default 60)")
    parser.add_argument("--drain-timeout", type=float, default=180.0, help="seconds after the step to wait for the lag to drain (default 180)")
    parser.add_argument("--home", help="keep the clusters' files and logs here (default: a temporary folder)")
    args = parser.parse_args()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="sp-elastic-") as scratch:
        home = Path(args.home or scratch)
        scaled = run(broker.bootstrap_servers, home / "autoscaled", args, 1, autoscaled=True)
        print(json.dumps(scaled), flush=True)
        fixed = run(broker.bootstrap_servers, home / "fixed", args, scaled["end_parallel"], autoscaled=False)
        print(json.dumps(fixed), flush=True)


if __name__ == "__main__":
    main()
