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

A client may also bring rules of its own (``narrowing``: a JWT's ``acl`` claim). They
only narrow: a copy goes when the node's ACL (if any) and the client's rules (if any)
both allow it. Whoever changes a client's rules drops its session's decisions
(:meth:`~router.cluster.sessions.local_sessions.ClientSession.rejudge`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from router.core.acl import Acl
from router.core.hooks import ClientInfo
from router.core.messages import Delivery, Message


class Judged(Protocol):
    """What the ACL keeps on each session it judges (a
    :class:`~router.cluster.sessions.local_sessions.ClientSession`): its decisions by topic, and the
    receive check made for its user."""

    client_id: str
    receives: dict[str, bool]
    receiver: Callable[[str], bool] | None

    @property
    def profile(self) -> tuple[int, int, str | None]:
        """(MQTT level, keepalive, user name) its connection gave."""
        ...


DEFAULT_LIMIT: Final = 100_000
"""Cached decisions, over all sessions, before every cache is cleared."""

#: Told of each denied copy (or message, before a copy was made): (client id, it).
DenialObserver = Callable[[str, Message | Delivery], None]
#: Rules of a client's own that narrow what it may receive (a JWT's ``acl`` claim:
#: :mod:`router.cluster.jwt_auth`): a function of a topic name, None when it has none.
Narrowing = Callable[[ClientInfo], Callable[[str], bool] | None]


class DeliveryAcl:
    """One node's receive check with its caches (see the module docstring)."""

    def __init__(self, acl: Acl | None, limit: int = DEFAULT_LIMIT) -> None:
        """``acl`` None: only :attr:`narrowing` judges (a node without an ACL whose
        clients bring their own rules)."""
        if limit < 1:
            raise ValueError("the cache limit must be at least 1")
        self.acl = acl
        #: A client's own rules, asked too: a copy goes only if both allow it.
        self.narrowing: Narrowing | None = None
        self.limit = limit
        self.denied = 0
        self.on_denied: DenialObserver | None = None
        self._cached = 0
        self._holders: weakref.WeakSet[Judged] = weakref.WeakSet()

    def judge(self, session: Judged, topic: str) -> bool:
        """True if ``session`` may receive ``topic`` (a validated topic name): the
        session's cached decision, else the ACL's (then cached)."""
        allowed = session.receives.get(topic)
        if allowed is None:
            receiver = session.receiver
            if receiver is None:
                client = ClientInfo(session.client_id, session.profile[2])
                receiver = session.receiver = self._receiver(client)
            allowed = receiver(topic)
            if self._cached >= self.limit:
                self.clear()
            if not session.receives:
                self._holders.add(session)
            session.receives[topic] = allowed
            self._cached += 1
        return allowed

    def _receiver(self, client: ClientInfo) -> Callable[[str], bool]:
        """The ACL's receive check for ``client``, and its own rules' when it has some."""
        base = None if self.acl is None else self.acl.receiver(client)
        own = None if self.narrowing is None else self.narrowing(client)
        if own is None:
            return base if base is not None else _everything
        if base is None:
            return own
        return lambda topic: own(topic) and base(topic)

    def refuse(self, client_id: str, what: Message | Delivery, copies: int = 1) -> None:
        """Count ``copies`` denied copies of ``what`` for ``client_id`` and report it."""
        self.denied += copies
        if self.on_denied is not None:
            self.on_denied(client_id, what)

    def screen(self, session: Judged, deliveries: list[Delivery]) -> list[Delivery]:
        """The ``deliveries`` the session may receive, in order (the others refused)."""
        kept = []
        for delivery in deliveries:
            if self.judge(session, delivery.topic):
                kept.append(delivery)
            else:
                self.refuse(session.client_id, delivery)
        return kept

    def replace(self, acl: Acl, sessions: Iterable[Judged]) -> None:
        """Judge with ``acl`` from now on: every session's decisions and prepared rules
        (``sessions``: all of them) are dropped."""
        self.acl = acl
        for session in sessions:
            session.receiver = None
        self.clear()

    def clear(self) -> None:
        """Forget every cached decision (the bound was reached)."""
        for session in list(self._holders):
            session.receives.clear()
        self._holders = weakref.WeakSet()
        self._cached = 0


def _everything(topic: str) -> bool:
    return True
