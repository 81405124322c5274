"""``router bench ...``: benchmarks that measure the router beside a peer in one run."""

from __future__ import annotations

import importlib.util
import json
import math
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from router.errors import BenchSetupError


@click.group()
def bench() -> None:
    """Measure the router beside a peer in the same run (JSON with --json)."""


def _print_table(title: str, rows: dict[str, dict[str, Any]]) -> None:
    table = Table(title=title)
    names = list(rows)
    table.add_column("measure")
    for name in names:
        table.add_column(name, justify="right")
    for measure in rows[names[0]]:
        table.add_row(measure, *(str(rows[name][measure]) for name in names))
    Console().print(table)


@bench.command("match")
@click.option("--subscriptions", default=100_000, show_default=True, help="Subscriptions.")
@click.option("--topics", default=50_000, show_default=True, help="Publish topics matched.")
@click.option("--seed", default=7, show_default=True, help="Workload seed.")
@click.option("--rounds", default=3, show_default=True, help="Timed rounds; the best counts.")
@click.option(
    "--hot-publishes", default=300_000, show_default=True, help="Timed publishes of `hot`."
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    metavar="NAME",
    help="devices, dashboards, fanout, deep, large or hot; repeat for several "
    "(default: all but large).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_match(
    subscriptions: int,
    topics: int,
    seed: int,
    rounds: int,
    hot_publishes: int,
    workloads: tuple[str, ...],
    as_json: bool,
) -> None:
    """The subscription trie beside paho-mqtt's MQTTMatcher, and its hot-topic cache."""
    from router.bench import match, match_workloads

    chosen = workloads or match_workloads.DEFAULT_WORKLOADS
    result = match.run(subscriptions, topics, seed, rounds, hot_publishes, chosen)
    if as_json:
        click.echo(json.dumps(result))
    else:
        plain = dict(result["workloads"])
        hot = plain.pop("hot", None)
        if plain:
            _print_table(f"router bench match ({result['core']} core)", plain)
        if hot is not None:
            _print_table("router bench match: hot topics", {"hot": hot})


@bench.command("redis")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--subscriptions", default=5_000, show_default=True, help="Single subscribes.")
@click.option("--batched-subscriptions", default=50_000, show_default=True, help="Batched ones.")
@click.option("--subscribe-batch", default=100, show_default=True, help="Filters per call.")
@click.option("--messages", default=50_000, show_default=True, help="Channel messages.")
@click.option("--publish-batch", default=100, show_default=True, help="Messages per call.")
@click.option("--fetch-max", default=100, show_default=True, help="Messages per fetch.")
@click.option("--rounds", default=3, show_default=True, help="Timed rounds; the best counts.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_redis(url: str | None, rounds: int, as_json: bool, **sizes: int) -> None:
    """Subscriptions and channel clocks in Redis beside raw pipelined PUBLISH."""
    from router.bench import redis as redis_bench

    config = redis_bench.RedisBenchConfig(rounds=rounds, **sizes)
    result = redis_bench.run(url, config)
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table("router bench redis", {"value": result})


@bench.command("cluster")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--messages", default=20_000, show_default=True, help="Throughput messages.")
@click.option("--rate", default=5_000.0, show_default=True, help="Offered rate (msg/s).")
@click.option("--seconds", default=3.0, show_default=True, help="Latency phase length.")
@click.option("--convergence-rounds", default=200, show_default=True, help="Subscribes timed.")
@click.option(
    "--traffic-dir", default=None, metavar="DIR", help="Publishing node writes a traffic log here."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_cluster(
    url: str | None,
    messages: int,
    rate: float,
    seconds: float,
    convergence_rounds: int,
    traffic_dir: str | None,
    as_json: bool,
) -> None:
    """Nodes in separate processes beside raw pipelined PUBLISH: throughput, latency
    (beside a raw Redis pub/sub hop at the same rate), route convergence and forwards
    per publish."""
    from router.bench import cluster

    config = cluster.ClusterBenchConfig(messages, rate, seconds, convergence_rounds, traffic_dir)
    result = cluster.run(url, config)
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table("router bench cluster", {"value": result})


@bench.command("mqtt")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--messages", default=100_000, show_default=True, help="Messages per QoS and broker.")
@click.option("--publishers", default=4, show_default=True, help="Publisher connections.")
@click.option("--subscribers", default=4, show_default=True, help="Subscriber connections.")
@click.option("--fanout", default=1, show_default=True, help="Subscribers of each message.")
@click.option("--window", default=100, show_default=True, help="QoS 1 publishes in flight.")
@click.option("--rate", default=2_000.0, show_default=True, help="Latency phase rate (msg/s).")
@click.option("--seconds", default=5.0, show_default=True, help="Latency phase length.")
@click.option("--drain-seconds", default=3.0, show_default=True, help="Wait for stragglers.")
@click.option("--skip-mosquitto", is_flag=True, help="Leave mosquitto out.")
@click.option("--skip-amqtt", is_flag=True, help="Leave amqtt out.")
@click.option("--acl", help="An ACL file the router nodes run with.")
@click.option(
    "--http",
    is_flag=True,
    help="The router nodes serve the dashboard and the API too (nobody looking at them).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_mqtt(url: str | None, as_json: bool, **sizes: Any) -> None:
    """MQTT 3.1.1 clients through two router nodes, one node, mosquitto and amqtt at QoS 0
    and 1 (the same messages, checked), and latency through two nodes and through
    mosquitto at a fixed rate."""
    from router.bench import broker_runs

    result = broker_runs.run(url, broker_runs.MqttBenchConfig(**sizes))
    if as_json:
        click.echo(json.dumps(result))
    else:
        qos = {name: result.pop(name) for name in ("qos0", "qos1")}
        _print_table("router bench mqtt: throughput (msg/s delivered)", qos)
        _print_table("router bench mqtt: latency and workload", {"value": result})


@bench.command("pipeline")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--publishes", default=2_000_000, show_default=True, help="Traffic-log records.")
@click.option("--subscriptions", default=100_000, show_default=True, help="Subscriptions.")
@click.option("--topics", default=200_000, show_default=True, help="Distinct topics drawn.")
@click.option("--nodes", default=4, show_default=True, help="Nodes in the traffic log.")
@click.option("--seed", default=7, show_default=True, help="Workload seed.")
@click.option("--rounds", default=2, show_default=True, help="Timed rounds; the best counts.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_pipeline(url: str | None, as_json: bool, **sizes: Any) -> None:
    """The Spark report job beside the same computation in one Python process, and the
    Spark import into Redis (needs router[spark] and Java 17+)."""
    from router.bench import pipeline

    result = pipeline.run(pipeline.PipelineBenchConfig(**sizes), url)
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table("router bench pipeline", {"value": result})


@bench.command("soak")
@click.option(
    "--redis",
    "url",
    default=None,
    help="Redis URL (default: start one; only then is Redis restarted).",
)
@click.option("--minutes", default=10.0, show_default=True, help="Length of the load.")
@click.option("--fault-every", default=30.0, show_default=True, help="Seconds between faults.")
@click.option("--subscriptions", default=10_000, show_default=True, help="Churned subscriptions.")
@click.option("--qos1-rate", default=150.0, show_default=True, help="QoS 1 msg/s, all publishers.")
@click.option("--qos0-rate", default=300.0, show_default=True, help="QoS 0 msg/s, all publishers.")
@click.option("--churn", default=50, show_default=True, help="Subscriptions changed per second.")
@click.option("--sample-seconds", default=5.0, show_default=True, help="Time series interval.")
@click.option("--seed", default=7, show_default=True, help="Workload seed.")
@click.option("--logs", default=None, help="Keep the nodes' and Redis' logs in this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_soak(url: str | None, logs: str | None, as_json: bool, **sizes: Any) -> None:
    """Three nodes under QoS 0/1 MQTT traffic, subscription churn and a fault every
    --fault-every seconds (kill -9 of a node, Redis restart): lost, duplicates, latency
    and memory over time."""
    if importlib.util.find_spec("paho") is None:
        raise BenchSetupError("router bench soak needs paho-mqtt: pip install 'router[bench]'")
    for name, value in sizes.items():  # SoakConfig lets inf through (a run without end)
        if isinstance(value, float) and not math.isfinite(value):
            raise BenchSetupError(f"--{name.replace('_', '-')} must be finite, not {value}")
    from router.bench import soak

    result = soak.run(url, soak.SoakConfig(**sizes), logs)
    if as_json:
        click.echo(json.dumps(result))
    else:
        series = result.pop("series")
        faults = result.pop("faults")
        _print_table("router bench soak", {"value": result})
        for fault in faults:
            kind, target, at, back = fault["kind"], fault["target"], fault["at_s"], fault["back_s"]
            click.echo(f"fault at {at} s: {kind} {target}, back in {back} s")
        click.echo(f"{len(series)} samples (--json has the time series)")


@bench.command("fleet")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--connections", default=10_000, show_default=True, help="Idle MQTT clients.")
@click.option(
    "--sessions",
    type=int,
    default=None,
    help="Persistent sessions (default: min(--connections, 10000); --kill: 10000).",
)
@click.option("--kill", is_flag=True, help="kill -9 a node under --sessions persistent sessions.")
@click.option(
    "--rolling",
    is_flag=True,
    help="Drain and replace each of 3 nodes in turn under --sessions (default 2000) "
    "persistent sessions and a QoS 1 stream.",
)
@click.option(
    "--clean-sessions",
    type=int,
    default=None,
    help="--kill: clean sessions (Session Expiry 0) beside them (default: --sessions / 2).",
)
@click.option("--processes", default=2, show_default=True, help="Load processes (or more).")
@click.option("--in-flight", default=500, show_default=True, help="CONNECTs per load process.")
@click.option(
    "--rate", default=2_000.0, show_default=True, help="--kill, --rolling: QoS 1 msg/s published."
)
@click.option(
    "--ttl", default=2.0, show_default=True, help="--kill, --rolling: the nodes' heartbeat TTL."
)
@click.option("--skip-mosquitto", is_flag=True, help="Leave mosquitto out.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_fleet(url: str | None, as_json: bool, **sizes: Any) -> None:
    """Many idle MQTT connections on one router node beside mosquitto (connect rate,
    memory per connection, pings, one message each, idle CPU, Redis bytes per persistent
    session); with --kill, a node killed under persistent sessions whose clients come
    back to the other node in three storms (lost, refused, adoption time), and clean
    sessions that must leave no key in Redis (clean_keys_left); with --rolling, a rolling
    upgrade: each of three nodes drained and replaced in turn (lost, refused, how soon
    every client was back)."""
    from router.bench import fleet, fleet_nodes

    result = fleet.run(url, fleet_nodes.FleetConfig(**sizes))
    if as_json:
        click.echo(json.dumps(result))
        return
    groups = result.pop("groups", None)
    steps = result.pop("steps", None)
    _print_table(f"router bench fleet ({result['mode']})", {"value": result})
    for group in groups or ():
        click.echo(
            f"storm {group['group']}: {group['clients']} clients at {group['at_s']} s, "
            f"{group['ok']} back, refused {group['refused']}"
        )
    for step in steps or ():
        click.echo(
            f"node {step['node']}: drained in {step['drained_s']} s (exit "
            f"{step['drain_exit_status']}), new process ready at {step['restarted_s']} s, "
            f"every client back at {step['all_back_s']} s"
        )


@bench.command("hostile")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--probes", default=20, show_default=True, help="Well-behaved clients timed.")
@click.option("--seconds", default=10.0, show_default=True, help="Seconds of each phase.")
@click.option(
    "--floods",
    default="subscriptions,properties,retained,aliases,publishes",
    show_default=True,
    help="The floods run at once (comma-separated).",
)
@click.option("--skip-mosquitto", is_flag=True, help="Leave mosquitto out.")
@click.option(
    "--lorises",
    default=10_000,
    show_default=True,
    help="Slow lorises: connections that each send the start of a 1 MiB PUBLISH and stop "
    "(0: no slow-loris phase; fewer if the open-file limit is lower).",
)
@click.option(
    "--loris-bytes", default=65_536, show_default=True, help="Bytes of it each loris sends."
)
@click.option(
    "--loris-hold",
    default=70.0,
    show_default=True,
    help="Seconds the lorises hold on after sending (past the router's packet timeout).",
)
@click.option(
    "--loris-waves",
    default=1,
    show_default=True,
    help="Waves of lorises each broker meets, one after another (1..5: is memory reused?).",
)
@click.option(
    "--node-max-unfinished-bytes",
    type=int,
    default=None,
    help="The router node's --mqtt-max-unfinished-bytes [default: its default].",
)
@click.option(
    "--node-packet-timeout",
    type=float,
    default=None,
    help="The router node's --mqtt-packet-timeout [default: its default].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_hostile(url: str | None, floods: str, as_json: bool, **sizes: Any) -> None:
    """Well-behaved clients' round trips on a quiet broker and beside floods of
    subscriptions, user properties, retained messages, topic aliases and publishes, on a
    router node and on mosquitto."""
    from router.bench import hostile

    kinds = tuple(kind.strip() for kind in floods.split(",") if kind.strip())
    result = hostile.run(url, hostile.HostileConfig(floods=kinds, **sizes))
    if as_json:
        click.echo(json.dumps(result))
        return
    for broker in ("router", "mosquitto"):
        if broker in result:
            figures = result[broker]
            rows = {phase: figures[phase] for phase in ("quiet", "flooded")}
            _print_table(f"router bench hostile: {broker}", rows)
            click.echo(
                f"{broker}: flooded p99 / quiet p99 = {figures['p99_flooded_over_quiet']}; "
                f"RSS {figures['rss_mib_before']} -> {figures['rss_mib_after']} MiB; "
                f"floods sent {figures['floods_sent']}"
            )
            if "lorises" in figures:
                lorises = figures["lorises"]
                click.echo(
                    f"{broker}: {lorises['accepted']} lorises, RSS {lorises['rss_mib_before']} "
                    f"-> {lorises['rss_mib_peak']} (peak) -> {lorises['rss_mib_after']} MiB; "
                    f"ended {lorises['ended']}, open at the end {lorises['open_at_end']}"
                )
            for number, wave in enumerate(figures.get("loris_waves", ()), start=2):
                click.echo(
                    f"{broker}: loris wave {number}, RSS {wave['rss_mib_before']} -> "
                    f"{wave['rss_mib_peak']} (peak) -> {wave['rss_mib_after']} MiB; "
                    f"ended {wave['ended']}"
                )


@bench.command("backends")
@click.option("--redis", "url", default=None, help="Standalone Redis URL (default: start one).")
@click.option("--workers", default=4, show_default=True, help="Worker processes with members.")
@click.option("--senders", default=1, show_default=True, help="Processes making group sends.")
@click.option("--groups", default=100, show_default=True, help="Groups (rooms).")
@click.option(
    "--members-per-group", default=2, show_default=True, help="Workers with a member of a group."
)
@click.option("--messages", default=20_000, show_default=True, help="Throughput group sends.")
@click.option("--payload-bytes", default=256, show_default=True, help="Padding of a message.")
@click.option("--rate", default=1_000.0, show_default=True, help="Latency phase rate (msg/s).")
@click.option("--seconds", default=3.0, show_default=True, help="Latency phase length.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_backends(url: str | None, as_json: bool, **sizes: Any) -> None:
    """The router's Django Channels layer and python-socketio manager beside channels_redis
    (RedisPubSubChannelLayer) and socketio.AsyncRedisManager: group sends a second,
    latency, and the messages each worker had to process."""
    from router.bench import backend_plan

    config = backend_plan.BackendsConfig(**sizes)
    missing = [name for name in ("channels", "channels_redis", "socketio") if not _found(name)]
    if missing:
        raise BenchSetupError(
            f"router bench backends needs {', '.join(missing)}: "
            "pip install 'router[channels,socketio]' channels-redis"
        )
    from router.bench import backends

    result = backends.run(url, config)
    if as_json:
        click.echo(json.dumps(result))
        return
    _print_table("router bench backends", result.pop("backends"))
    _print_table("router bench backends: ratios and workload", {"value": result})


def _found(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
