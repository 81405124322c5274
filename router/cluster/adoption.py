"""Persistent sessions outlive their node: the node that purges a dead node adopts them.

A node that dies takes its memory with it, and its peers purge its routes once its
heartbeat expired, after which no publish is routed to its clients. Its *persistent*
sessions (Session Expiry Interval > 0, connected or away when it died) live on in Redis:
their subscriptions, their queue, their expiry. The live node whose purge removed the
dead node (exactly one: the purge reports ``purged`` once) adopts each of them:

1. it takes the session over as a resuming node would (a new owner epoch: the session is
   this node's now, and a later connect anywhere takes it from here), restores its
   subscriptions and writes their routes, then puts it away with its expiry: from then
   on its QoS 1/2 copies go to its Redis queue, after what was queued already, and its
   Session Expiry Interval runs on Redis time from the adoption;
2. it reads what was stored in the dead node's inbox and never dispatched (copies routed
   there between the death and the purge) and delivers to the adopted sessions the
   copies their subscriptions match, in the order they were stored; then it removes
   the dead node's inbox cursor, so that nobody reads those copies twice.

A client that reconnects to any node then resumes its session there with everything
queued, as after any takeover. What this does not save: copies the dead node had
already taken from its inbox (or from its own publishers) into memory and not yet got
acknowledged by the client, share-group copies addressed to the dead node, and the
wills of clients that were connected to it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from router.cluster.inbox import unpack_record
from router.errors import MalformedMessageError, SubscriptionNotFoundError
from router.state.channels import Channel
from router.state.session_store import NEVER

if TYPE_CHECKING:
    from router.cluster.node import RouterNode

log = logging.getLogger(__name__)

CONCURRENCY: Final = 32
"""Sessions adopted at the same time."""
FETCH: Final = 256


@dataclass
class AdoptionReport:
    """What one adoption did: sessions adopted, inbox copies recovered for them."""

    dead_node: str
    sessions: int = 0
    recovered: int = 0
    failed: int = 0


async def adopt(node: RouterNode, dead: str) -> AdoptionReport:
    """Adopt ``dead``'s persistent sessions on ``node`` (see the module docstring)."""
    report = AdoptionReport(dead)
    ids, _ = await node.session_store.client_ids()
    infos = await node.session_store.describe_many(ids)
    orphans = [(i.client_id, i.expiry) for i in infos if i and i.node_id == dead and i.expiry]
    adopted: set[str] = set()
    for first in range(0, len(orphans), CONCURRENCY):
        chunk = orphans[first : first + CONCURRENCY]
        results = await asyncio.gather(
            *(_adopt_one(node, client_id, expiry) for client_id, expiry in chunk),
            return_exceptions=True,
        )
        for (client_id, _), result in zip(chunk, results, strict=True):
            if isinstance(result, BaseException):
                report.failed += 1
                log.error("session %s of dead node %s not adopted: %r", client_id, dead, result)
            else:
                adopted.add(client_id)
    report.sessions = len(adopted)
    if adopted:
        report.recovered = await _recover_inbox(node, dead, adopted)
    if orphans:
        log.warning(
            "adopted %d sessions of dead node %s (%d inbox copies recovered, %d failed)",
            report.sessions, dead, report.recovered, report.failed,
        )  # fmt: skip
    return report


async def _adopt_one(node: RouterNode, client_id: str, expiry: int) -> None:
    expiry = min(expiry, NEVER)
    await node.connect(client_id, clean_start=False, expiry=expiry)
    await node.put_away(client_id, expiry=expiry)


async def _recover_inbox(node: RouterNode, dead: str, adopted: set[str]) -> int:
    """Deliver the dead node's undispatched inbox copies to ``adopted`` sessions."""
    channel = Channel(node.registry.redis, node.keys.inbox(dead), node.config.inbox_expire,
                      node.keys)  # fmt: skip
    recovered = 0
    try:
        while True:
            try:
                result = await channel.fetch(dead, max=FETCH)
            except SubscriptionNotFoundError:  # (nothing left, or another node read it)
                break
            for stored in result.messages:
                try:
                    record = unpack_record(stored.content)
                except MalformedMessageError:
                    continue
                if not isinstance(record, list):
                    continue  # (a notice for the dead node)
                for forward in record:
                    if forward.groups:
                        continue
                    queued, _ = node.sessions.deliver(forward.message, (), None, adopted)
                    recovered += queued
            if result.ack_handle is not None:
                await channel.ack(dead, result.ack_handle)
            if not result.more:
                break
        await channel.remove_subscriber(dead)
    finally:
        await channel.aclose()
    return recovered
