"""The life of the sessions on one node: attach, put away, hand on, end.

One object, :class:`SessionLifecycle`, moves every local session through its states
(:mod:`router.cluster.sessions.states`) and keeps Redis in step: the claim on the session
(:mod:`~router.cluster.sessions.claims`), its stored subscriptions and description, its
queue while its client is away and the handoff when it moves
(:mod:`~router.cluster.sessions.keeper`), copies a dead node left
(:mod:`~router.cluster.sessions.recovery`). The rest of the node reaches it through its
public methods and gives it three things: how to write route changes, how to publish a
will, and whether the node still runs.

One connect, put away or adoption of a client at a time (:attr:`SessionLifecycle.locks`):
each runs whole before the next for the same client id begins. Every wait is bounded: Redis
calls by their timeouts, a handoff by ``handoff_timeout``, its grace by the heartbeat TTL
(or ``handoff_grace``, if longer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from router.cluster.config import NodeConfig
from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Takeover
from router.cluster.policy import Policy
from router.cluster.sessions.claims import Claimed, SessionClaims
from router.cluster.sessions.client_locks import ClientLocks
from router.cluster.sessions.keeper import SessionKeeper
from router.cluster.sessions.local_sessions import ClientSession, CountChange, LocalSessions
from router.cluster.sessions.recovery import InboxRecovery, Recovery
from router.cluster.sessions.restoration import restore_sessions
from router.cluster.sessions.states import SessionEvent, SessionState
from router.core.hooks import ClientInfo
from router.core.messages import Delivery, Outgoing
from router.core.options import SubscriptionOptions
from router.core.topics import TopicFilter, validate_filter
from router.errors import RouterError, SessionOwnershipError, SessionUserError
from router.state.keys import Keys, check_id
from router.state.scripts import RedisClient
from router.state.session_queue import SessionQueue
from router.state.session_store import NEVER, SessionInfo, SessionStore, open_fields
from router.state.subscriptions import Owner, SubscriptionStore

log = logging.getLogger(__name__)

Profile = tuple[int, int, str | None]
"""What a connection says of itself: MQTT level, keepalive, user name."""


class SessionLifecycle:
    """The sessions of one node through their lifecycle (see the module docstring).

    ``write_routes(changes)`` writes route count changes to the node's route set and
    announces them; ``publish_will(will)`` publishes a will; ``running()`` is False once
    the node stops (a handoff's end then leaves the routes to the node's purge);
    ``is_dead(node_id)`` says a node's heartbeat expired (no handoff is awaited from it).
    """

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys,
        config: NodeConfig,
        sessions: LocalSessions,
        subscriptions: SubscriptionStore,
        policy: Policy,
        forwarder: Forwarder,
        *,
        write_routes: Callable[[list[CountChange]], Awaitable[None]],
        publish_will: Callable[[Outgoing], Awaitable[object]],
        running: Callable[[], bool],
        is_dead: Callable[[str], bool] = lambda _node_id: False,
        fence: Callable[[str, int, float], Awaitable[bool]] | None = None,
    ) -> None:
        self.node_id = config.node_id
        self.sessions = sessions
        self.subscriptions = subscriptions
        self.store = SessionStore(redis, keys, subscriptions)
        self._policy = policy
        self._write_routes = write_routes
        self._publish_will = publish_will
        self._running = running
        self._is_dead = is_dead
        self.locks = ClientLocks()
        #: One admission of a client id at a time (a listener's takeover of the client's
        #: connection on this node, its connect and its attach: :meth:`RouterNode.admitting
        #: <router.cluster.node.RouterNode.admitting>`).
        self.admissions = ClientLocks()
        self.claims = SessionClaims(
            self.node_id,
            subscriptions,
            forwarder,
            self._on_taken_over,
            shared=config.shared_sessions,
            in_turn=self.locks.in_turn,
        )
        self.recovery = InboxRecovery(
            redis, keys, self.node_id, config.inbox_expire, sessions, is_dead
        )
        self.keeper = SessionKeeper(
            redis,
            keys,
            self.store,
            max_queued=config.max_queued,
            max_queued_bytes=config.max_queued_bytes,
            overflow=config.overflow,
            handoff_timeout=config.handoff_timeout,
            handoff_grace=config.handoff_grace,
            recovery=self.recovery,
            publish_will=publish_will,
            end_session=self._end_session,
            is_dead=is_dead,
            fence=fence,
            fence_bound=min(config.heartbeat_ttl, config.handoff_timeout / 2),
        )
        self.sessions_restored = 0
        #: Sessions of dead nodes that were not persistent, removed from Redis.
        self.clean_sessions_removed = 0

    @property
    def copies_recovered(self) -> int:
        return self.recovery.copies_recovered

    async def connect(
        self,
        client_id: str,
        username: str | None = None,
        password: str | bytes | None = None,
        *,
        clean_start: bool = True,
        expiry: int = 0,
        protocol: int = 0,
        keepalive: int = 0,
        authenticate: bool = True,
    ) -> bool:
        """Attach a client to this node; returns whether a session was present.

        ``client.authenticate`` hooks judge the credentials (none registered: everyone is
        accepted); a refusal raises :class:`NotAuthorizedError` and changes nothing. An
        attached client that connects again is authenticated again and keeps its session,
        under the new ``expiry`` (written to Redis when it changed).
        With ``clean_start`` earlier state is dropped; without it a session kept for the
        client (on this node or another) goes on here: its subscriptions, and what was
        queued for it first (:mod:`router.cluster.sessions.keeper`). ``expiry`` is the
        Session Expiry Interval (0: the session ends with the connection). A session that
        another node served is taken over: that node gets a notice in its inbox. A stored
        session whose interval is 0 is not resumed: it ends with its connection, which the
        takeover closes (MQTT 5.0 3.1.2.11.2), so the client starts a new one (Session Present
        0, as when the old connection was on this node).
        ``authenticate=False``: the node resumes a stored session itself (see Policy.authenticate).

        One connect or put away of a client at a time on a node (:attr:`locks`).
        A connect that fails (Redis failed: CONNACK 0x88) leaves no client attached: one
        that failed before its claim closes what it opened here; after it, the session
        stays here, away, with what its resume had got, and the next connect goes on
        with it (:meth:`SessionKeeper.come_back
        <router.cluster.sessions.keeper.SessionKeeper.come_back>`).
        """
        check_id(client_id, "client id")
        async with self.locks.hold(client_id):
            return await self._connect(
                client_id,
                username,
                password,
                clean_start,
                expiry,
                protocol,
                keepalive,
                authenticate,
            )

    def check_user(self, client_id: str, username: str | None) -> None:
        """:class:`SessionUserError` when this node holds the client's session for
        another user (unless the node shares sessions between users); the claim checks
        the same in Redis for a session held elsewhere."""
        if self.claims.shared or client_id not in self.claims:
            return
        session = self.sessions.find(client_id)
        if session is not None and session.profile[2] != username:
            raise SessionUserError(client_id)

    async def _connect(
        self,
        client_id: str,
        username: str | None,
        password: str | bytes | None,
        clean_start: bool,
        expiry: int,
        protocol: int,
        keepalive: int,
        authenticate: bool,
    ) -> bool:
        client = await self._policy.authenticate(client_id, username, password, authenticate)
        self.check_user(client_id, username)
        await self.keeper.handing_off(client_id)  # (a session that just left: it is back)
        profile = (protocol, keepalive, username)
        session = self.sessions.find(client_id)
        if session is not None and not session.away and client_id in self.claims:
            if await self.claims.still_held(client_id):  # (else closed as taken over)
                if expiry != session.expiry:  # (Redis tells it too: a dead node's adopter
                    # reads it there, to adopt the session or remove it)
                    await self._mark_open(client_id, expiry, *profile)
                session.expiry = expiry
                await self._policy.attached(client, new=False)
                return True
            session = self.sessions.find(client_id)
        if session is not None and client_id in self.claims:
            if clean_start:
                await self._disconnect(client_id)
            else:
                session.profile = profile  # (the ACL judges by it)
                await self.keeper.settle(client_id, publish_will=False, wait_tail=False)
                await self._take_on(session, expiry, profile)
                await self._policy.attached(client, new=False)
                return True
        try:
            session, claimed, info, recovery = await self._claim_here(
                client_id, clean_start, profile, expiry
            )
        except BaseException:
            await self._drop_unclaimed(client_id)  # (the retry starts afresh)
            raise
        session.expiry = expiry
        await self._take_on(session, expiry, profile, claimed, info, recovery)
        await self._policy.attached(client, new=claimed is not None)
        return info is not None

    async def _claim_here(
        self, client_id: str, clean_start: bool, profile: Profile, expiry: int
    ) -> tuple[ClientSession, Claimed | None, SessionInfo | None, Recovery | None]:
        """Open the client's session here and claim it (with its stored subscriptions
        and routes, unless ``clean_start``); returns the session, the new claim (None:
        held already), the stored description and the mark of its old node's inbox. A
        clean start without expiry is marked connected by its claim (nothing of Redis
        comes between them: one round trip, not two)."""
        user = profile[2]
        if clean_start:
            await self._drop_unclaimed(client_id)  # (what a handoff kept here)
            fields = None if expiry else open_fields(expiry, *profile)
            claimed = await self.claims.claim(client_id, user=user, open_session=fields)
            return self.sessions.open(client_id), claimed, None, None
        info = await self.store.describe(client_id)
        if info is not None and not self.claims.shared and info.username != user:
            raise SessionUserError(client_id)  # (before its routes are written here)
        if info is not None and not info.expiry:
            info = None  # (it ends with its connection, which this connect takes over)
        if info is None:
            await self._drop_unclaimed(client_id)
        session = self.sessions.open(client_id, profile)
        session.move_to(SessionState.ATTACHING, SessionEvent.RESUME_CLAIMED)  # (or kept here)
        if info is not None and info.node_id != self.node_id:
            session.hold()  # (until what its node sends ahead of them has come)
        if info is not None:
            stored = await self.subscriptions.subscriptions(client_id)
            await self._write_routes(
                self._restore(client_id, {validate_filter(f): o for f, o in stored.items()})
            )
        # (also when its node is dead: one taken for dead may be restarting under its id
        # and reading its inbox, moving its cursor past this client's copies)
        recovery = await self.recovery.mark(info)
        claimed = await self.claims.claim(client_id, keep_state=info is not None, user=user)
        return session, claimed, info, recovery

    async def _take_on(
        self,
        session: ClientSession,
        expiry: int,
        profile: Profile,
        claimed: Claimed | None = None,
        info: SessionInfo | None = None,
        recovery: Recovery | None = None,
    ) -> None:
        """Resume the session the node just claimed (from ``info``, told to the previous
        owner), or start it, or (nothing claimed) go on with the one it holds; then mark
        it open. Should Redis fail, no client is attached: the next connect goes on."""
        client_id = session.client_id
        try:
            if claimed is None and session.away:
                await self.keeper.come_back(session, None, expiry)
            elif claimed is not None:
                previous = claimed.previous
                if (  # (its connection on the other node ends)
                    previous is not None
                    and previous.node_id != self.node_id
                    and (info is None or info.connected)
                ):
                    session.takeovers += 1
                if previous is None or not self._is_dead(previous.node_id):
                    await self.claims.notify_previous(client_id, claimed, resume=info is not None)
                if info is not None:
                    previous = claimed.previous
                    moved = previous is not None and previous.node_id != self.node_id
                    epoch = claimed.owner.epoch if moved else None
                    await self.keeper.come_back(
                        session, epoch, expiry, info.awaiting_release, previous, recovery
                    )
                elif expiry:
                    await self.keeper.reset_queue(client_id, expiry)
            marked = claimed is not None and claimed.marked
            await self._mark_open(client_id, expiry, *profile, in_redis=not marked)
        except BaseException:
            session.move_to(SessionState.AWAY, SessionEvent.ATTACH_FAILED)
            raise
        session.move_to(SessionState.CONNECTED, SessionEvent.ATTACHED)

    def _restore(
        self, client_id: str, stored: dict[TopicFilter, SubscriptionOptions]
    ) -> list[CountChange]:
        """Make the client's local subscriptions those ``stored`` for its session (an away
        session kept here by a handoff may hold some it has dropped since); the route
        changes."""
        changes = self.sessions.restore(client_id, stored)
        for topic_filter in [
            f for f in self.sessions.trie.subscriptions(client_id) if f not in stored
        ]:
            _existed, change = self.sessions.unsubscribe(client_id, topic_filter)
            if change is not None:
                changes.append(change)
        return changes

    async def _drop_unclaimed(self, client_id: str) -> None:
        """Close a local session of the client that this node holds no claim for: the away
        session a handoff kept for a client back here (not resuming after all), or what
        a connect that failed before its claim opened. Its route changes are written when
        Redis takes them (the route writer keeps them)."""
        session = self.sessions.find(client_id)
        if session is not None and client_id not in self.claims:
            with contextlib.suppress(RouterError):
                await self._handed(session, SessionEvent.UNCLAIMED_DROPPED)

    async def _mark_open(
        self,
        client_id: str,
        expiry: int,
        protocol: int,
        keepalive: int,
        username: str | None,
        *,
        in_redis: bool = True,
    ) -> None:
        session, owner = self.sessions.find(client_id), self.claims.held(client_id)
        if session is not None:
            session.profile = (protocol, keepalive, username)
        if owner is not None and in_redis:
            await self.store.mark_open(
                client_id,
                owner,
                expiry=expiry,
                protocol=protocol,
                keepalive=keepalive,
                username=username,
            )

    async def put_away(
        self,
        client_id: str,
        *,
        expiry: int | None = None,
        will: Outgoing | None = None,
        will_delay: int = 0,
    ) -> None:
        """The client's connection ended without ending its session: keep the session for
        its Session Expiry Interval (``expiry`` replaces it when given) and queue QoS 1/2
        messages for it; with a ``will``, publish it after ``will_delay`` seconds unless
        the client is back by then (or when the session ends, if sooner). A session with
        an interval of 0 ends now, as :meth:`disconnect` (and its will goes at once)."""
        async with self.locks.hold(client_id):
            await self._put_away(client_id, expiry, will, will_delay)

    async def _put_away(
        self, client_id: str, expiry: int | None, will: Outgoing | None, will_delay: int
    ) -> None:
        session = self.sessions.find(client_id)
        owner = self.claims.held(client_id)
        if session is None or owner is None or session.away:
            return
        if expiry is not None:
            session.expiry = expiry
        if not session.expiry:
            if will is not None:
                await self._publish_will(will)
            await self._disconnect(client_id)
            return
        try:
            await self.keeper.put_away(session, owner, will, will_delay)
        except SessionOwnershipError:
            log.warning("client %s was taken over while leaving", client_id)

    async def _end_session(self, client_id: str) -> None:
        """The Session Expiry Interval of an away session passed: end it."""
        owner = self.claims.release(client_id)
        await self.keeper.settle(client_id, publish_will=True)
        try:
            await self._close_session(client_id, "expired", owner)
        except SessionOwnershipError:
            log.info("session of %s ended in Redis already", client_id)

    async def _on_taken_over(self, client_id: str, notice: Takeover | None) -> None:
        """Another node claimed the session: close the local copy; when the session goes
        on there, hand on what this node holds and gathers for it in the handoff's grace
        (:meth:`SessionKeeper.hand_off <router.cluster.sessions.keeper.SessionKeeper.hand_off>`)."""
        session = self.sessions.find(client_id)
        if session is not None and notice is not None and notice.resume and session.expiry:
            leaving = self.sessions.hand_on(session)
            self.keeper.hand_off(session, leaving, notice.epoch, lambda: self._handed(leaving))
        else:  # (the session ends: its connection publishes its will, delayed or not)
            changes = self.sessions.disconnect(
                client_id, "takenover_ended", SessionEvent.TAKEN_OVER
            )
            await self.keeper.settle(client_id, publish_will=True)
            await self._write_routes(changes)
        await self._policy.detached(client_id, "takenover")

    async def _handed(
        self, leaving: ClientSession, event: SessionEvent = SessionEvent.HANDOFF_DONE
    ) -> None:
        """A session handed on (its grace over), or one ``event`` drops: its filters and
        routes go from here."""
        if self.sessions.find(leaving.client_id) is leaving:
            changes = self.sessions.disconnect(leaving.client_id, "takenover", event)
            if self._running():
                await self._write_routes(changes)

    async def disconnect(self, client_id: str) -> None:
        """End the client's session: its subscriptions end, its queue closes, its state
        (a persistent session's queue too) is removed. A connect or subscribe of the same
        client meanwhile waits its turn (:attr:`locks`), and so comes after: a kick and a
        client attaching again at once leave the client attached, never a removal of its
        state refused half-way by the newer claim."""
        async with self.locks.hold(client_id):
            await self._disconnect(client_id)

    async def _disconnect(self, client_id: str) -> None:
        """:meth:`disconnect`, for a caller holding the client's lock."""
        owner = self.claims.release(client_id)
        await self.keeper.settle(client_id, publish_will=True)
        await self._close_session(client_id, "normal", owner)

    async def _close_session(self, client_id: str, reason: str, owner: Owner | None) -> None:
        """Close the local session and write the route changes; with ``owner``, also
        remove the client's state from Redis (fenced by that claim)."""
        session = self.sessions.find(client_id)
        event = SessionEvent.EXPIRED if reason == "expired" else SessionEvent.ENDED
        changes = self.sessions.disconnect(client_id, reason, event)
        written = asyncio.ensure_future(self._write_routes(changes))
        if owner is not None:
            await self.subscriptions.remove_client(client_id, owner=owner)
            if session is not None and session.expiry:
                await self.keeper.reset_queue(client_id, 1)  # (gone with the session)
        await written
        await self._policy.detached(client_id, reason)

    async def remove_clean(self) -> int:
        """At a graceful stop: remove from Redis every session held here that ends with
        its connection (Session Expiry 0: an embedded client's, a framework worker's),
        fenced by this node's claims, so that nothing of it outlives the node (before,
        their subscriptions, claim and description stayed for good). Returns how many
        went; persistent sessions stay, for their client to resume."""
        ended = [
            (client_id, owner)
            for client_id, owner in self.claims.items()
            if (session := self.sessions.find(client_id)) is not None and not session.expiry
        ]
        if not ended:
            return 0
        return sum(await self.subscriptions.remove_clients(ended))

    def persistent(self) -> list[str]:
        """The clients whose sessions this node holds that outlive their connection
        (Session Expiry > 0), connected or away: what a live node adopts once this node
        retires (a claim whose session is not made here yet counts too: it may be)."""
        return [
            client_id
            for client_id, _ in self.claims.items()
            if (session := self.sessions.find(client_id)) is None or session.expiry
        ]

    # -- adoption (router.cluster.sessions.adoption) ---------------------------------------

    async def adopt_claims(
        self, orphans: list[tuple[str, Owner]]
    ) -> list[tuple[ClientSession, Owner, list[CountChange]] | None]:
        """Claim the session of each (client id, the claim its dead owner held) of
        ``orphans`` and open it here as Redis describes it, with its stored
        subscriptions, holding back the copies that reach it (:meth:`adopt_finish_all`
        lets them go). For each: the session, its new claim and the route changes to
        write (:meth:`adopt_routes`), or None when the dead node no longer holds it (the
        client resumed it somewhere), it is not persistent, or this node serves it. A
        session that is not persistent (Session Expiry 0: it ended with its node) is
        removed from Redis, fenced by the dead claim, so nothing of it outlives the node
        (its subscriptions, aliases, claim and description). The claims and the removals
        go to Redis together (pipelined). The caller holds the clients' locks
        until :meth:`adopt_finish_all`."""
        wanted = [(client_id, dead) for client_id, dead in orphans if not self.serves(client_id)]
        for client_id, _ in wanted:
            await self._drop_unclaimed(client_id)
        claims = await self.store.adopt_many(wanted, self.node_id)
        opened: dict[str, tuple[ClientSession, Owner, list[CountChange]]] = {}
        ended: list[tuple[str, Owner]] = []
        for (client_id, dead), adopted in zip(wanted, claims, strict=True):
            if adopted is None:
                ended.append((client_id, dead))
                continue
            info = adopted.info
            self.claims.adopted(client_id, adopted.owner)
            session = self.sessions.open(client_id, (info.protocol, info.keepalive, info.username))
            session.expiry = min(info.expiry, NEVER)
            session.hold()
            stored = {validate_filter(f): options for f, options in adopted.filters.items()}
            await self._policy.attached(ClientInfo(client_id, info.username), new=True)
            opened[client_id] = (session, adopted.owner, self._restore(client_id, stored))
        removed = sum(await self.subscriptions.remove_clients(ended))
        # (added after the await: batches run at once, and `+= await` reads the count
        # before it, so one batch's addition undid another's)
        self.clean_sessions_removed += removed
        return [opened.get(client_id) for client_id, _ in orphans]

    async def adopt_routes(self, changes: list[CountChange]) -> None:
        """Write the route changes of adopted sessions, announced once. Should Redis fail,
        the route writer keeps them (written later) and the adoption goes on."""
        try:
            await self._write_routes(changes)
        except RouterError:
            log.warning("routes of adopted sessions not written yet", exc_info=True)

    async def adopt_queues(self, sessions: list[ClientSession]) -> dict[str, SessionQueue]:
        """The queues of adopted ``sessions``, made ahead of :meth:`adopt_finish_all`
        (none when Redis refused: it makes them then)."""
        try:
            return await self._made_queues(sessions)
        except RouterError as error:
            log.warning("queues of adopted sessions not made yet: %s", error)
            return {}

    async def _made_queues(self, sessions: list[ClientSession]) -> dict[str, SessionQueue]:
        queues = [self.keeper.queue(session.client_id, session.expiry) for session in sessions]
        await SessionQueue.ensure_each(queues)
        return {queue.client_id: queue for queue in queues}

    async def adopt_finish_all(
        self,
        adopted: list[tuple[ClientSession, Owner, list[Delivery]]],
        ready: dict[str, SessionQueue],
    ) -> int:
        """Each adopted session takes the copies ``recovered`` from the dead node's inbox
        first, then those it held since :meth:`adopt_claim`, and is put away with its
        expiry (its queue goes on after what the dead node queued); the sessions are put
        away together (:meth:`SessionKeeper.put_away_adopted`, in the queues ``ready``
        from :meth:`adopt_queues`, or made now), or each on its own when Redis refused
        that. A session taken over meanwhile gets ``recovered`` in its
        queue, for the node that resumes it. Returns how many could not be put away
        (each logged)."""
        kept: list[tuple[ClientSession, Owner]] = []
        failed = 0
        for session, owner, recovered in adopted:
            client_id = session.client_id
            if self.claims.held(client_id) != owner or self.sessions.find(client_id) is not session:
                try:
                    await self.keeper.queue_copies(client_id, session.expiry, recovered)
                except RouterError:
                    failed += 1
                    log.error("copies of taken over %s not queued", client_id, exc_info=True)
                continue
            session.release(recovered)
            kept.append((session, owner))
        try:
            missing = [session for session, _ in kept if session.client_id not in ready]
            queues = {**ready, **await self._made_queues(missing)}
            await self.keeper.put_away_adopted([session for session, _ in kept], queues)
        except RouterError as error:
            log.warning("adopted sessions put away one by one: %s", error)
        else:
            return failed
        for session, owner in kept:
            try:
                await self.keeper.put_away(session, owner, marked=True)
            except RouterError:  # (its client's connect goes on with it)
                failed += 1
                log.error("adopted session %s not put away", session.client_id, exc_info=True)
        return failed

    def serves(self, client_id: str) -> bool:
        """True while this node holds the client's session (its claim in Redis)."""
        return client_id in self.claims

    async def restore(self) -> None:
        """Write back what Redis lost of the sessions this node serves
        (:mod:`router.cluster.sessions.restoration`)."""
        restored = await restore_sessions(
            self.claims, self.sessions, self.subscriptions, self.store, self.keeper
        )
        self.sessions_restored += restored  # (after the await: see adopt_claims)
