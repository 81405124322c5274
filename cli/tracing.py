"""``router trace start|list|show|stop``: follow one client id or one topic filter on
every node for a bounded time (see :mod:`router.state.trace_store`).

``start`` prints the trace's id; ``show ID`` prints what the nodes saw, oldest first, one
line a record (``--follow``: and what comes, until the trace ends)::

    07:41:02.113  node-a  in      sensor-7  PUBLISH qos 1 id 3, 21 B  (sensors/7/temp)
    07:41:02.114  node-a  routed  sensor-7  qos 1, 21 B: 0 local copies, forwarded to node-b

JSON shapes (``--json``): ``start`` ``{"id", "kind", "value", "until", "by"}``; ``list``
a list of those; ``show`` ``[{"id", "at_ms", "node", "what", "client", "topic",
"text"}]`` (with ``--follow``: one record a line); ``stop`` ``{"stopped"}`` (exit 1 when
no such trace ran).
"""

from __future__ import annotations

import asyncio
import json
import time

import click

from router.state.trace_store import KINDS, MAX_SECONDS, TraceRecord, TraceSpec, TraceStore

from .common import (
    Target,
    echo_json,
    json_option,
    note,
    redis_client,
    run,
    target_options as target,
)

FOLLOW_POLL = 0.5


def record_line(record: TraceRecord) -> str:
    when = time.strftime("%H:%M:%S", time.gmtime(record.at_ms / 1000))
    topic = f"  ({record.topic})" if record.topic else ""
    return (
        f"{when}.{record.at_ms % 1000:03d}  {record.node}  {record.what:<9} "
        f"{record.client or '-'}  {record.text}{topic}"
    )


@click.group()
def trace() -> None:
    """Follow a client id or a topic filter on every node, for a bounded time."""


@trace.command("start")
@target
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("value")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True, max=MAX_SECONDS),
    default=60.0,
    show_default=True,
    help="How long the trace follows.",
)
@json_option
def trace_start(target: Target, kind: str, value: str, seconds: float, as_json: bool) -> None:
    """Trace VALUE, a client id or a topic filter (KIND), on every node."""

    async def main() -> TraceSpec:
        async with redis_client(target) as redis:
            return await TraceStore(redis, target.keys).start(kind, value, seconds, by="cli")

    spec = run(main())
    if as_json:
        echo_json(spec.as_dict())
    else:
        click.echo(spec.id)
        note(f"tracing {kind} {value!r} for {seconds:.0f} s: router trace show {spec.id}")


@trace.command("list")
@target
@json_option
def trace_list(target: Target, as_json: bool) -> None:
    """The traces in force."""

    async def main() -> list[TraceSpec]:
        async with redis_client(target) as redis:
            return await TraceStore(redis, target.keys).traces()

    found = run(main())
    if as_json:
        echo_json([spec.as_dict() for spec in found])
        return
    if not found:
        click.echo("no traces")
    for spec in found:
        left = max(spec.until - time.time(), 0)
        click.echo(f"{spec.id}  {spec.kind} {spec.value}  {left:.0f} s left")


@trace.command("show")
@target
@click.argument("trace_id")
@click.option("--follow", is_flag=True, help="Go on printing what comes until the trace ends.")
@json_option
def trace_show(target: Target, trace_id: str, follow: bool, as_json: bool) -> None:
    """What the nodes saw of trace TRACE_ID, oldest first (exit 1 for no such trace)."""

    async def main() -> list[TraceRecord]:
        async with redis_client(target) as redis:
            store = TraceStore(redis, target.keys)
            records = await store.records(trace_id)
            if not follow:
                return records
            after = _print(records, as_json, "-")
            while trace_id in {spec.id for spec in await store.traces()}:
                await asyncio.sleep(FOLLOW_POLL)
                after = _print(await store.records(trace_id, after=after), as_json, after)
            _print(await store.records(trace_id, after=after), as_json, after)
            return []

    found = run(main())
    if follow:
        return
    if as_json:
        echo_json([record.as_dict() for record in found])
        return
    if not found:
        click.echo("no records yet")
    for record in found:
        click.echo(record_line(record))


def _print(records: list[TraceRecord], as_json: bool, after: str) -> str:
    """Print ``records`` as they come (one JSON document a line with ``--json``); the id
    to read after."""
    for record in records:
        click.echo(json.dumps(record.as_dict()) if as_json else record_line(record))
    return records[-1].id if records else after


@trace.command("stop")
@target
@click.argument("trace_id")
@json_option
def trace_stop(target: Target, trace_id: str, as_json: bool) -> None:
    """Stop trace TRACE_ID (its records stay an hour; exit 1 when none ran)."""

    async def main() -> bool:
        async with redis_client(target) as redis:
            return await TraceStore(redis, target.keys).stop(trace_id)

    stopped = run(main())
    if as_json:
        echo_json({"stopped": stopped})
    elif stopped:
        click.echo(f"stopped trace {trace_id}")
    else:
        note(f"no trace {trace_id} runs")
    if not stopped:
        raise SystemExit(1)
