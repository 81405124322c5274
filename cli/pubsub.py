"""``router publish`` and ``router subscribe``: join as a short-lived node, act, leave.

Each joins the cluster as a node of its own (id ``cli-<host>-<pid>`` unless
``--node-id``), waits until its route mirror has loaded every live node, and leaves
gracefully: its routes are removed and it is deregistered.

JSON shapes (``--json``):

* ``router publish``: ``{"topic", "message_id" (hex), "node_id" (the publishing node),
  "nodes": [ids of the nodes that got a copy]}``
* ``router subscribe``: one object a line: ``{"topic", "payload", "encoding" ("utf-8"
  or "hex"), "qos", "retain", "message_id" (hex)}``
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

import click

from router.cluster.node import RouterNode
from router.core.messages import Delivery
from router.core.topics import TopicName, validate_filter, validate_topic
from router.ops.node_process import stop_on_signals
from router.ops.tool_node import ephemeral_node, tool_node_id

from .common import Target, echo_json, json_option, note, run, target_options as target

node_id_option = click.option(
    "--node-id", default=None, help="Node id to join as [default: cli-<host>-<pid>]."
)


async def wait_for_interest(node: RouterNode, topic: TopicName, seconds: float) -> bool:
    """Wait until the node's route mirror sends ``topic`` somewhere (at most ``seconds``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not node.mirror.match(topic).nodes:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@click.command()
@target
@click.argument("topic")
@click.argument("payload")
@click.option("--qos", type=click.IntRange(0, 2), default=0, show_default=True)
@click.option("--retain", is_flag=True, help="Set the retain flag.")
@click.option(
    "--wait-for-subscribers",
    "wait_for",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Wait up to this many seconds until some node is interested in TOPIC.",
)
@node_id_option
@json_option
def publish(
    target: Target,
    topic: str,
    payload: str,
    qos: int,
    retain: bool,
    wait_for: float,
    node_id: str | None,
    as_json: bool,
) -> None:
    """Publish PAYLOAD (UTF-8 text; '-' reads bytes from stdin) to TOPIC once."""
    checked = validate_topic(topic)  # before connecting: a bad topic is one error line
    data = sys.stdin.buffer.read() if payload == "-" else payload.encode("utf-8")

    async def main() -> None:
        async with ephemeral_node(target.url, node_id=node_id, prefix=target.prefix) as node:
            await wait_for_interest(node, checked, wait_for)
            result = await node.publish(topic, data, qos=qos, retain=retain)
        if as_json:
            echo_json(
                {
                    "topic": topic,
                    "message_id": result.message_id.hex(),
                    "node_id": node.node_id,
                    "nodes": result.nodes,
                }
            )
        elif result.nodes:
            click.echo(f"published to {topic!r}: copies to {', '.join(result.nodes)}")
        else:
            click.echo(f"published to {topic!r}: no node is interested")

    run(main())


@click.command()
@target
@click.argument("topic_filter", metavar="FILTER")
@node_id_option
@click.option("--client-id", default=None, help="Client id [default: the node id].")
@click.option("--qos", type=click.IntRange(0, 2), default=0, show_default=True)
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after N messages.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Give up after this many seconds (exit 1 if --count was not reached).",
)
@json_option
def subscribe(
    target: Target,
    topic_filter: str,
    node_id: str | None,
    client_id: str | None,
    qos: int,
    count: int | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Subscribe to FILTER and print messages until interrupted or --count arrived.

    Exits 1 when --count was given and fewer messages arrived (--timeout or a signal).
    """
    validate_filter(topic_filter)
    node_id = node_id or tool_node_id()
    client = client_id or node_id

    async def main() -> int:
        received = 0
        # Signals are caught from the start: one that comes while the node starts or the
        # subscription is confirmed ends the command once they are done (it used to
        # cancel them half-way or, in the gap before the wait, go unheard).
        with stop_on_signals() as stop:
            async with ephemeral_node(target.url, node_id=node_id, prefix=target.prefix) as node:
                await node.subscribe(client, topic_filter, qos=qos)
                note(f"subscribed {client} to {topic_filter!r} on node {node.node_id}")
                try:
                    async for delivery in _deliveries(node, client, count, timeout, stop):
                        received += 1
                        _print_delivery(delivery, as_json)
                finally:
                    await node.disconnect(client)  # the client's state leaves with it
        return received

    received = run(main())
    if count is not None and received < count:
        raise click.ClickException(f"received {received} of {count} messages before stopping")


async def _deliveries(
    node: RouterNode,
    client_id: str,
    count: int | None,
    timeout: float | None,
    stop: asyncio.Event,
) -> AsyncIterator[Delivery]:
    """The client's deliveries until ``count`` arrived, ``timeout`` passed or ``stop``
    is set (at once when it already is)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    messages = node.messages(client_id)
    received = 0
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        while (count is None or received < count) and not stop.is_set():
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            following: asyncio.Future[Any] = asyncio.ensure_future(anext(messages))
            done, _ = await asyncio.wait(
                {following, stopped}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if following not in done:
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
                return
            try:
                delivery: Delivery = following.result()
            except StopAsyncIteration:
                return  # the session was closed
            received += 1
            yield delivery
    finally:
        stopped.cancel()


def _print_delivery(delivery: Delivery, as_json: bool) -> None:
    try:
        payload, encoding = delivery.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = delivery.payload.hex(), "hex"
    if as_json:
        record: dict[str, Any] = {
            "topic": delivery.topic,
            "payload": payload,
            "encoding": encoding,
            "qos": delivery.qos,
            "retain": delivery.retain,
            "message_id": delivery.message_id.hex(),
        }
        echo_json(record)
    else:
        flags = f"qos={delivery.qos}" + (" retain" if delivery.retain else "")
        shown = payload if encoding == "utf-8" else f"0x{payload}"
        click.echo(f"{delivery.topic} [{flags}] {shown}")


COMMANDS = [publish, subscribe]
