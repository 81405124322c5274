"""Sessions' state written back after Redis lost it.

A FLUSHALL, or a Redis restart without persistence, takes every key: the claims on the
sessions, their subscriptions and descriptions, the away sessions' queues. The nodes
still hold all of it in memory. A node notices when its heartbeat finds it unregistered
(the node joins again, routes and all) and then writes back,
for each session it serves (:func:`restore_sessions`):

1. its claim, with the same epoch, unless some node owns the session now (a node that
   was purged as dead finds its persistent sessions adopted elsewhere: it leaves them,
   and its claims audit closes them here);
2. its subscriptions, and its description (connected, or away with its expiry and the
   inbound QoS 2 ids awaiting PUBREL), fenced by that claim;
3. the reader of an away session's queue, so that what is queued from now on is kept.

What the flush took before the write-back is not recovered: copies queued for an away
session in between, and a session that ended elsewhere while this node was cut off
comes back here as this node's (its claims audit or the next takeover settles it).
"""

from __future__ import annotations

import logging

from router.cluster.sessions.claims import SessionClaims
from router.cluster.sessions.keeper import SessionKeeper
from router.cluster.sessions.local_sessions import LocalSessions
from router.errors import RouterError
from router.state.session_store import SessionStore
from router.state.subscriptions import SubscriptionStore

log = logging.getLogger(__name__)


async def restore_sessions(
    claims: SessionClaims,
    sessions: LocalSessions,
    subscriptions: SubscriptionStore,
    store: SessionStore,
    keeper: SessionKeeper,
) -> int:
    """Write back the state of every session this node serves whose claim Redis lost
    (see the module docstring); returns how many. A session that fails is logged and
    left to the next write-back."""
    restored = 0
    for client_id, owner in claims.items():
        session = sessions.find(client_id)
        if session is None:
            continue
        try:
            if not await subscriptions.restore_owner(client_id, owner):
                continue
            held = sessions.trie.subscriptions(client_id)
            await subscriptions.write_subscriptions(client_id, held.items(), owner=owner)
            if session.away:
                await store.mark_away(
                    client_id,
                    owner,
                    expiry=session.expiry,
                    awaiting_release=session.awaiting_release,
                )
                await keeper.restore_queue(client_id)
            else:
                protocol, keepalive, username = session.profile
                await store.mark_open(
                    client_id,
                    owner,
                    expiry=session.expiry,
                    protocol=protocol,
                    keepalive=keepalive,
                    username=username,
                )
        except RouterError:
            log.warning("the state of session %s was not written back", client_id, exc_info=True)
            continue
        restored += 1
    if restored:
        log.warning("wrote back the state of %d sessions Redis had lost", restored)
    return restored
