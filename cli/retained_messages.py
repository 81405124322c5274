"""``router retained list|get|delete|count``: the cluster's retained messages.

A message is shown as :func:`router.ops.retained_view.retained_record` writes it:
``{"topic", "payload", "encoding", "bytes", "qos", "expiry_interval", "message_id",
"publisher"}``.

JSON shapes (``--json``):

* ``router retained list [--filter F] [--limit N] [--page P]``: a list of messages in
  (first level, topic) order; every one, those matching F, at most N, or page P of N
  (default 100) over the whole store
* ``router retained get TOPIC``: one message (exit 1 when the topic has none)
* ``router retained delete TOPIC_OR_FILTER``: ``{"deleted": N}``
* ``router retained count``: ``{"count": N}`` (expired messages count until cleared)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import click

from router.core.topics import validate_filter, validate_topic
from router.ops.retained_view import retained_record
from router.state.retained_store import RetainedMessage, RetainedStore

from .common import (
    Target,
    echo_json,
    json_option,
    note,
    redis_client,
    run,
    target_options as target,
)


def _line(record: dict[str, Any]) -> str:
    shown = record["payload"] if record["encoding"] == "utf-8" else "base64:" + record["payload"]
    expiry = record["expiry_interval"]
    extra = "" if expiry is None else f", expires in {expiry}s"
    return f"{record['topic']}  {shown}  (qos {record['qos']}{extra})"


@click.group()
def retained() -> None:
    """Retained messages, shared by every node."""


@retained.command("list")
@target
@click.option("--filter", "topic_filter", default=None, metavar="F", help="Only topics F matches.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=None, help="At most N messages.")
@click.option(
    "--page",
    type=click.IntRange(min=1),
    default=None,
    help="Page P of --limit (default 100) positions over the whole store.",
)
@json_option
def retained_list(
    target: Target, topic_filter: str | None, limit: int | None, page: int | None, as_json: bool
) -> None:
    """Retained messages in topic order (every one, or those matching --filter)."""
    if topic_filter is not None:
        validate_filter(topic_filter)
        if page is not None:
            raise click.ClickException("--page pages the whole store; it does not take --filter")

    async def messages(store: RetainedStore) -> AsyncIterator[RetainedMessage]:
        if page is not None:
            found = await store.page(page, limit=limit or 100)
            if found.has_next:
                note(f"more on page {page + 1}")
            for message in found.messages:
                yield message
            return
        left = limit
        source = (
            store.iter_match(topic_filter)
            if topic_filter is not None
            else (m async for batch in store.iter_batches() for m in batch)
        )
        async with aclosing(source):
            async for message in source:
                if left is not None:
                    if left == 0:
                        return
                    left -= 1
                yield message

    async def main() -> None:
        async with redis_client(target) as redis:
            store = RetainedStore(redis, target.keys)
            count = 0
            if as_json:
                click.echo("[", nl=False)
            async for message in messages(store):
                record = retained_record(message)
                if as_json:
                    text = json.dumps(record, ensure_ascii=False)
                    click.echo(("," if count else "") + text, nl=False)
                else:
                    click.echo(_line(record))
                count += 1
            if as_json:
                click.echo("]")
            elif not count:
                click.echo("no retained messages")

    run(main())


@retained.command("get")
@target
@click.argument("topic")
@json_option
def retained_get(target: Target, topic: str, as_json: bool) -> None:
    """The retained message of TOPIC."""
    validate_topic(topic)

    async def main() -> RetainedMessage | None:
        async with redis_client(target) as redis:
            return await RetainedStore(redis, target.keys).get(topic)

    message = run(main())
    if message is None:
        raise click.ClickException(f"no retained message on {topic!r}")
    record = retained_record(message)
    if as_json:
        echo_json(record)
    else:
        click.echo(_line(record))


@retained.command("delete")
@target
@click.argument("topic_or_filter", metavar="TOPIC_OR_FILTER")
@json_option
def retained_delete(target: Target, topic_or_filter: str, as_json: bool) -> None:
    """Delete the retained message of a topic, or of every topic a filter matches."""
    validate_filter(topic_or_filter)

    async def main() -> int:
        async with redis_client(target) as redis:
            return await RetainedStore(redis, target.keys).delete(topic_or_filter)

    deleted = run(main())
    if as_json:
        echo_json({"deleted": deleted})
    else:
        click.echo(f"deleted {deleted} retained message{'' if deleted == 1 else 's'}")


@retained.command("count")
@target
@json_option
def retained_count(target: Target, as_json: bool) -> None:
    """How many retained messages are stored (expired ones count until cleared)."""

    async def main() -> int:
        async with redis_client(target) as redis:
            return await RetainedStore(redis, target.keys).size()

    count = run(main())
    if as_json:
        echo_json({"count": count})
    else:
        click.echo(f"{count} retained message{'' if count == 1 else 's'}")
