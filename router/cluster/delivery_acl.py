"""The node's ACL on the way to each client: may this session receive this topic.

A subscription the ACL granted may still match topics its user may not receive (``#``
is granted while ``secrets/#`` is denied: :mod:`router.core.acl`), and a session that
was restored, adopted or moved here brings filters no subscribe check saw on this node.
So every copy is judged before it is queued for a local client, on its topic and the
user name the session's connection gave (``ClientSession.profile``), whatever way it
came: live deliveries (this node's publishes and its inbox), retained messages on
subscribe, and the copies a resumed session gets first (its queue, a previous node's
handoff, a dead node's inbox).

Decisions are cached per session and topic (``ClientSession.receives``; a miss asks the
session's ``receiver``, the rules that apply to its user prepared once), both dropped
when the session's user name changes; the decisions are bounded over all sessions: past
``limit`` entries every session's cache is cleared. A denied copy is not queued; it is counted
(``denied``) and, when the node reports drops, told to ``on_denied``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from router.core.acl import Acl
from router.core.hooks import ClientInfo
from router.core.messages import Delivery, Message

if TYPE_CHECKING:
    from router.cluster.local_sessions import ClientSession

DEFAULT_LIMIT: Final = 100_000
"""Cached decisions, over all sessions, before every cache is cleared."""

#: Told of each denied copy (or message, before a copy was made): (client id, it).
DenialObserver = Callable[[str, Message | Delivery], None]


class DeliveryAcl:
    """One node's receive check with its caches (see the module docstring)."""

    def __init__(self, acl: Acl, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("the cache limit must be at least 1")
        self.acl = acl
        self.limit = limit
        self.denied = 0
        self.on_denied: DenialObserver | None = None
        self._cached = 0
        self._holders: weakref.WeakSet[ClientSession] = weakref.WeakSet()

    def judge(self, session: ClientSession, topic: str) -> bool:
        """True if ``session`` may receive ``topic`` (a validated topic name): the
        session's cached decision, else the ACL's (then cached)."""
        allowed = session.receives.get(topic)
        if allowed is None:
            receiver = session.receiver
            if receiver is None:
                client = ClientInfo(session.client_id, session.profile[2])
                receiver = session.receiver = self.acl.receiver(client)
            allowed = receiver(topic)
            if self._cached >= self.limit:
                self.clear()
            if not session.receives:
                self._holders.add(session)
            session.receives[topic] = allowed
            self._cached += 1
        return allowed

    def refuse(self, client_id: str, what: Message | Delivery, copies: int = 1) -> None:
        """Count ``copies`` denied copies of ``what`` for ``client_id`` and report it."""
        self.denied += copies
        if self.on_denied is not None:
            self.on_denied(client_id, what)

    def screen(self, session: ClientSession, deliveries: list[Delivery]) -> list[Delivery]:
        """The ``deliveries`` the session may receive, in order (the others refused)."""
        kept = []
        for delivery in deliveries:
            if self.judge(session, delivery.topic):
                kept.append(delivery)
            else:
                self.refuse(session.client_id, delivery)
        return kept

    def clear(self) -> None:
        """Forget every cached decision (the bound was reached)."""
        for session in list(self._holders):
            session.receives.clear()
        self._holders = weakref.WeakSet()
        self._cached = 0
