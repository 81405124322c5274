"""Session claims: which clients' sessions this node serves, and their takeover.

A node serves a client's session under a *claim*: the session owner it wrote in Redis
(node id and an epoch that grows with every claim, :class:`~router.state.subscriptions.Owner`).
Every change to the client's state is fenced by that claim, so a node that lost it can
no longer write.

A client that connects to another node is taken over there (MQTT-3.1.4-3):

1. the new node claims the session (a newer epoch) and leaves a takeover notice in the
   old node's inbox (:class:`~router.cluster.inbox.Takeover`);
2. the old node, reading the notice, closes its copy of the session unless its own claim
   is the newer one (a notice older than the node's claim is ignored);
3. should a notice be lost, :meth:`SessionClaims.audit` (run each heartbeat) checks the
   Redis claims of up to :data:`AUDIT_BATCH` local sessions in turn (read together, one
   command a session), and closes those another node claimed since, once the claim is
   still found newer at the next audit: the notice, written just after the claim, is
   given that heartbeat to arrive. (Closing on the first sight raced the notice: the
   copy closed without handing the session on, and the resume on the new node waited
   its whole ``handoff_timeout`` for a handoff that was never to come.) Nor does it
   close one while the node's inbox reader does not hear its inbox (it waits out or
   catches up after an outage of Redis: :attr:`SessionClaims.notices_heard` False): the
   notice may then be in the inbox, unread, and closing the copy would drop what it
   holds instead of handing it on.

A notice or an audit closes the copy in the client's turn (``in_turn``, see
:meth:`ClientLocks.in_turn <router.cluster.sessions.client_locks.ClientLocks.in_turn>`):
a connect of the client under way here (a CONNECT that raced the other node's) runs whole
first, then the newer claim is judged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Takeover
from router.errors import RouterError
from router.state.subscriptions import Owner, SubscriptionStore

log = logging.getLogger(__name__)

#: Local sessions whose Redis claim one audit checks, at most.
AUDIT_BATCH: Final = 256


@dataclass(frozen=True)
class Claimed:
    """A new claim: ``owner`` is this node's, ``previous`` the claim it replaced (None
    when the client had no session anywhere)."""

    owner: Owner
    previous: Owner | None
    marked: bool = False  # (the session was marked connected with the claim)


class SessionClaims:
    """The claims this node holds, by client id.

    ``close_taken_over(client_id, notice)`` closes the local copy of a session that
    another node took over (``notice`` None: found by an audit or a claim, not told); it
    is called after the claim is forgotten here. ``in_turn(client_id, step)`` runs a
    notice's or an audit's step in the client's turn (by default: at once).
    """

    def __init__(
        self,
        node_id: str,
        store: SubscriptionStore,
        forwarder: Forwarder,
        close_taken_over: Callable[[str, Takeover | None], Awaitable[None]],
        *,
        shared: bool = False,
        in_turn: Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]] | None = None,
    ) -> None:
        self.node_id = node_id
        self.shared = shared
        self._store = store
        self._forwarder = forwarder
        self._close_taken_over = close_taken_over
        self._in_turn = in_turn or (lambda _client_id, step: step())
        self._held: dict[str, Owner] = {}
        self._audit_queue: list[str] = []  # local clients whose claim is checked next
        self._claimed_elsewhere: dict[str, Owner] = {}  # newer claims one audit has seen
        self.taken_over = 0
        #: Whether the node's inbox reader hears its inbox now (a notice stored there
        #: reaches this node at once); the node sets it once its inbox reader exists.
        self.notices_heard: Callable[[], bool] = lambda: True

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._held

    def held(self, client_id: str) -> Owner | None:
        """This node's claim on the client's session, None if it holds none."""
        return self._held.get(client_id)

    def items(self) -> list[tuple[str, Owner]]:
        """Every claim held: (client id, claim)."""
        return list(self._held.items())

    def adopted(self, client_id: str, owner: Owner) -> None:
        """This node claimed the client's session as ``owner`` by adopting it from a dead
        node (:meth:`SubscriptionStore.adopt
        <router.state.subscriptions.SubscriptionStore.adopt>` wrote the claim)."""
        self._held[client_id] = owner

    def release(self, client_id: str) -> Owner | None:
        """Forget the claim (the session ends here); returns it, None if none was held."""
        return self._held.pop(client_id, None)

    async def claim(
        self,
        client_id: str,
        *,
        keep_state: bool = False,
        user: str | None = None,
        open_session: Sequence[str | int] | None = None,
    ) -> Claimed | None:
        """Claim the client's session: for a clean start, or (``keep_state``) to resume it.
        The claim records ``user``, the connecting client's user name: unless the node
        shares sessions between users, a session of another user is refused
        (:class:`SessionUserError`, nothing changed).

        Returns None when this node already holds the current claim (the session goes
        on). Otherwise a local copy that lost its claim is closed first, then the client's
        earlier state is removed from Redis (unless ``keep_state``) and the session claimed
        in one script; the new claim is returned with the owner it replaced, and the
        caller tells that owner with :meth:`notify_previous`. With ``open_session`` (the
        session hash's pairs) a new claim also marks the session connected, in the same
        script (a session already held is not marked).
        """
        if client_id in self._held and await self.still_held(client_id):
            return None
        previous, owner = await self._store.claim_over(
            client_id,
            self.node_id,
            fresh=not keep_state,
            user=user,
            shared=self.shared,
            open_session=open_session,
        )
        self._held[client_id] = owner
        return Claimed(owner, previous, marked=open_session is not None)

    async def still_held(self, client_id: str) -> bool:
        """Whether this node's claim on the client's session is still the current one
        (a read of Redis). A claim another node took over before its notice arrived is
        dropped here, as the notice would drop it (the local copy closed); False then,
        and when none was held."""
        local = self._held.get(client_id)
        if local is None:
            return False
        if local == await self._store.owner(client_id):
            return True
        if self._held.get(client_id) == local:  # (its notice may have come meanwhile)
            await self._drop(client_id, None)
        return False

    async def notify_previous(self, client_id: str, claimed: Claimed, resume: bool = False) -> None:
        """Leave a takeover notice for the node that served the session before, if it is
        another node (``resume``: this node goes on with the session). A failure is
        logged: that node's audit finds the claim later."""
        previous = claimed.previous
        if previous is None or previous.node_id == self.node_id:
            return
        try:
            await self._forwarder.notify(
                previous.node_id, Takeover(client_id, claimed.owner.epoch, resume)
            )
        except RouterError:
            log.error(
                "could not tell node %s that client %s was taken over; that node "
                "closes its copy of the session once a heartbeat finds the new claim",
                previous.node_id,
                client_id,
                exc_info=True,
            )

    async def on_notice(self, notice: Takeover) -> None:
        """Another node claimed a client's session: close the local copy, unless this
        node's own claim is the newer one, in the client's turn (a connect of the client
        under way here first). The client's Redis state is the new owner's."""
        await self._in_turn(notice.client_id, functools.partial(self._on_notice, notice))

    async def _on_notice(self, notice: Takeover) -> None:
        owner = self._held.get(notice.client_id)
        if owner is not None and owner.epoch < notice.epoch:
            await self._drop(notice.client_id, notice)

    async def audit(self) -> None:
        """Check the Redis claim of the next :data:`AUDIT_BATCH` local sessions (all of
        them in turn, a call at a time); close those another node claimed since, when the
        previous call found that same newer claim too (see the module docstring)."""
        batch: list[tuple[str, Owner]] = []
        queue = self._audit_queue
        while queue and len(batch) < AUDIT_BATCH:
            client_id = queue.pop()
            owner = self._held.get(client_id)
            if owner is not None:
                batch.append((client_id, owner))
        if not queue:
            self._audit_queue = list(self._held)
        claims = await self._store.owners([client_id for client_id, _ in batch])
        seen, self._claimed_elsewhere = self._claimed_elsewhere, {}
        for (client_id, held), claim in zip(batch, claims, strict=True):
            if claim is None or claim.epoch <= held.epoch:
                continue
            if self._held.get(client_id) != held:  # (reconnected meanwhile)
                continue
            if seen.get(client_id) != claim or not self.notices_heard():
                # (first sight, or the inbox is not heard: its notice may be on its way)
                self._claimed_elsewhere[client_id] = claim
                self._audit_queue.append(client_id)  # (checked again at the next audit)
                continue
            log.warning("client %s was taken over by node %s", client_id, claim.node_id)
            await self._in_turn(client_id, functools.partial(self._drop_held, client_id, held))

    async def _drop_held(self, client_id: str, held: Owner) -> None:
        """:meth:`_drop`, unless the claim held is no longer ``held`` (reconnected)."""
        if self._held.get(client_id) == held:
            await self._drop(client_id, None)

    async def _drop(self, client_id: str, notice: Takeover | None) -> None:
        del self._held[client_id]
        self.taken_over += 1
        await self._close_taken_over(client_id, notice)
