"""Persistent sessions under random interleavings, against what the client must receive.

A hypothesis state machine drives nodes on a real ``redis-server`` (append-only file,
fsync always) through random sequences of: a client connecting (to any node: a resume, a
move or a takeover), a connected client taken over on another node with Clean Start and
Session Expiry drawn, CONNECTs of one client racing on two nodes (as the MQTT front end
makes them: a node first ends the client's connection there), a client leaving (its
session stays), QoS 1 publishes from any node, a node dying (as ``kill -9``: no goodbye;
its sessions are adopted by a survivor; drawn with a client connecting to it just before
with a Session Expiry Interval of 0, or not), new nodes joining, and Redis killed and
restarted. An operation that fails while Redis is
away is one the client saw fail: a publish that raised was not acknowledged, a connect
that raised left the client disconnected. The model is
what MQTT promises a persistent QoS 1 subscriber: every message acknowledged to its
publisher after the subscription was acknowledged reaches the client at least once,
whatever happened in between, as long as its session lasts: a clean start, or a
connection with a Session Expiry Interval of 0 that ends (left, taken over, its node
dead), ends the session and what it was promised (the client subscribes again in the
next). Of racing CONNECTs exactly one node serves the client once they settled, none
fails but as Redis may (a claim lost to the other: SessionOwnershipError). At the end
every client connects once more and must get all of it (duplicates are allowed and
counted; none may be missing). And nothing of a session that ended with its node
outlives the node: once a survivor adopted a dead node (it is purged then), no key of
the clean sessions (Session Expiry 0) it held exists in Redis (checked after every step
and, waiting for the adoptions, at the end).

CI runs a few bounded examples, the same ones each time (derandomized: a failure there is
a change's, not the search's luck); ``ROUTER_MODEL_EXAMPLES=200 pytest
tests/cluster/test_session_model.py`` (``make model``) runs a longer random search. Timing
differs from run to run (a node's purge, a handoff's wait), so a failure found by the
search may not replay: hypothesis then reports it as flaky instead of shrinking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.errors import RouterError, SessionStateError, StateError, StateFailureError
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support import waiting
from tests.support.nodes import die
from tests.support.servers import RedisServer

SEARCH = os.environ.get("ROUTER_MODEL_EXAMPLES")
EXAMPLES = int(SEARCH or "6")
CLIENTS = ("c1", "c2")
EXPIRY = 600
TOPIC = "model/t"
MAX_NODES = 4  # (started over an example, the dead included)
SETTLE = 15.0  # seconds the final check waits for every missing message
CLOSE_TIMEOUT = 30.0  # seconds the nodes have to stop


class SessionModel(RuleBasedStateMachine):
    """Nodes, persistent subscribers and a publisher; the model is ``expected``."""

    server: RedisServer
    clean_checked_total = 0  # (clean sessions of dead nodes checked gone, over a run)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.keys = Keys(f"model{os.getpid()}x{id(self)}")
        self.live: dict[str, RouterNode] = {}
        self.dead: list[RouterNode] = []
        self.started = 0
        self.redis: list[RedisClient] = []
        self.where: dict[str, str | None] = {}  # client -> node id (None: away)
        self.readers: dict[str, asyncio.Task[None]] = {}
        self.expected: dict[str, set[int]] = {c: set() for c in CLIENTS}
        self.received: dict[str, list[int]] = {c: [] for c in CLIENTS}
        # Lost with a killed node that held them in memory only (documented, see kill).
        self.at_risk: dict[str, set[int]] = {c: set() for c in CLIENTS}
        self.seq = 0
        self.subscribed: set[str] = set()
        # The Session Expiry Interval of each client's last connection (0: its session
        # ends with that connection).
        self.expiry: dict[str, int] = {}
        # Clients a connect was drawn for: what the rules draw from depends only on the
        # draws, never on what the run did (a connect Redis refused), so hypothesis can
        # replay and shrink a run (else: FlakyStrategyDefinition).
        self.drawn: set[str] = set()
        # Clients whose clean session (Session Expiry 0) was on a node when it died ->
        # that node: once a survivor adopted the node (and purged it), no key of the
        # session may be left in Redis (:meth:`clean_sessions_of_the_dead_are_gone`).
        # A client that connects again leaves it (its new session has keys of its own).
        self.clean_dead: dict[str, str] = {}
        self.clean_checked = 0  # (how many such sessions were checked gone)

    def run(self, work: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(work, 30))

    # -- the parts -----------------------------------------------------------------------

    async def _start(self) -> RouterNode:
        self.started += 1
        redis = await open_redis(self.server.url, socket_timeout=2, socket_connect_timeout=2)
        self.redis.append(redis)
        config = NodeConfig(
            f"n{self.started}",
            prefix=self.keys.prefix,
            heartbeat_interval=0.2,
            heartbeat_ttl=1.0,
            handoff_timeout=1.0,
            handoff_grace=0.3,
            publish_timeout=2.0,
        )
        node = await RouterNode(redis, config).start()
        self.live[node.node_id] = node
        return node

    def _read(self, client: str, node: RouterNode) -> None:
        """Take what the session queues for the client, as a connected client reads."""
        session = node.sessions.session(client)

        async def reader() -> None:
            async for delivery in session:
                self.received[client].append(int(delivery.payload))

        self.readers[client] = asyncio.ensure_future(reader())

    async def _stop_reading(self, client: str) -> None:
        task = self.readers.pop(client, None)
        if task is not None:
            for _ in range(3):  # (let it take what is queued already)
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _session_ends(self, client: str) -> None:
        """The client's session ended: nothing more is promised to it (its next session
        subscribes again)."""
        self.subscribed.discard(client)
        self.expected[client] = set()

    async def _attach(
        self,
        client: str,
        node: RouterNode,
        clean: bool = False,
        expiry: int = EXPIRY,
        failing: tuple[type[RouterError], ...] = (RouterError,),
    ) -> bool | None:
        """Connect the client to ``node`` (the first time in its session, subscribe);
        returns Session Present. A connect that fails with one of ``failing`` leaves it
        disconnected (None)."""
        self.where[client] = None
        try:
            present = await node.connect(client, clean_start=clean, expiry=expiry)
            if client not in self.subscribed:
                await node.subscribe(client, "model/#", qos=1)
                self.subscribed.add(client)
        except failing:
            return None  # (refused, as CONNACK 0x88: the MQTT front end does nothing more)
        self._attached(client, node, expiry)
        return present

    def _attached(self, client: str, node: RouterNode, expiry: int) -> None:
        self.where[client] = node.node_id
        self.expiry[client] = expiry
        self._read(client, node)

    # -- rules ---------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        async def start() -> None:
            await self._start()
            await self._start()

        self.run(start())

    @rule(client=st.sampled_from(CLIENTS), pick=st.integers(0, 9))
    def connect(self, client: str, pick: int, expiry: int = EXPIRY) -> None:
        """Connect (resume, move or take over) on a live node, with a Session Expiry
        Interval of ``expiry`` (0: a clean session, one that ends with this connection);
        the first time, subscribe."""
        node = self.live[sorted(self.live)[pick % len(self.live)]]
        self.drawn.add(client)
        self.clean_dead.pop(client, None)

        async def connect() -> None:
            await self._stop_reading(client)
            if self.where.get(client) != node.node_id and not self.expiry.get(client, 1):
                self._session_ends(client)  # (its connection elsewhere is taken over)
            if not expiry:
                self._session_ends(client)  # (a connect of interval 0 may fail half-way)
            await self._attach(client, node, expiry=expiry)

        self.run(connect())

    @precondition(lambda self: len(self.live) >= 2)
    @rule(
        client=st.sampled_from(CLIENTS),
        pick=st.integers(0, 9),
        clean=st.booleans(),
        expiry=st.sampled_from([0, EXPIRY]),
    )
    def take_over(self, client: str, pick: int, clean: bool, expiry: int) -> None:
        """A connected client connects on another node, its old connection still open:
        the old node closes it; the session goes on unless ``clean`` or the old
        connection's interval was 0 (nothing, for a client not connected now). Only
        Redis may fail it (Redis back from a restart just now)."""
        if self.where.get(client) is None:
            return
        others = sorted(n for n in self.live if n != self.where[client])
        node = self.live[others[pick % len(others)]]

        async def take_over() -> None:
            await self._stop_reading(client)
            lasting = not clean and self.expiry[client] > 0
            if not lasting or not expiry:
                self._session_ends(client)  # (a connect of interval 0 may fail half-way)
            present = await self._attach(client, node, clean, expiry, (StateFailureError,))
            assert present in (None, lasting), f"{client}: Session Present {present}"

        self.run(take_over())

    @precondition(lambda self: len(self.live) >= 2)
    @rule(
        client=st.sampled_from(CLIENTS),
        pick=st.integers(0, 9),
        clean=st.booleans(),
        expiry=st.sampled_from([0, EXPIRY]),
    )
    def race(self, client: str, pick: int, clean: bool, expiry: int) -> None:
        """CONNECTs of the client on two nodes at once; a node where it is connected
        first ends that connection (as the MQTT front end does). Each ends attached or
        fails as Redis may; once the notices are read, exactly one node serves it."""
        names = sorted(self.live)
        racing = [self.live[names[(pick + k) % len(names)]] for k in (0, 1)]
        self.drawn.add(client)
        self.clean_dead.pop(client, None)

        async def connect(node: RouterNode) -> bool:
            if self.where.get(client) == node.node_id:
                await node.put_away(client)
            return await node.connect(client, clean_start=clean, expiry=expiry)

        async def race() -> None:
            await self._stop_reading(client)
            if clean or not expiry or not self.expiry.get(client, 1):
                self._session_ends(client)
            outcomes = await asyncio.gather(*map(connect, racing), return_exceptions=True)
            self.where[client] = None
            for outcome in outcomes:
                if isinstance(outcome, SessionStateError) or not isinstance(
                    outcome, bool | StateError
                ):
                    raise AssertionError(f"racing connects of {client}: {outcomes}")
            if all(isinstance(outcome, StateError) for outcome in outcomes):
                self._session_ends(client)  # (left half-way: what it keeps is not told)
                return
            await waiting.eventually(
                lambda: sum(n.serves(client) for n in self.live.values()) == 1,
                5,
                f"one node serving {client}",
            )
            [winner] = [n for n in self.live.values() if n.serves(client)]
            assert winner in racing, f"{client} is served by {winner.node_id}"
            await self._attach(client, winner, False, expiry, (StateFailureError,))

        self.run(race())

    @precondition(lambda self: bool(self.drawn))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        """A connected client's connection ends; its session stays (nothing, for a client
        not connected now: its connect was refused, or it left already)."""
        client = data.draw(st.sampled_from(sorted(self.drawn)))
        if self.where.get(client) is None:
            return
        node = self.live[self.where[client] or ""]

        async def leave() -> None:
            await self._stop_reading(client)
            self.where[client] = None
            if not self.expiry[client]:
                self._session_ends(client)
            with contextlib.suppress(RouterError):  # (as the MQTT front end)
                await node.put_away(client)

        self.run(leave())

    @rule(pick=st.integers(0, 9), count=st.integers(1, 5))
    def publish(self, pick: int, count: int) -> None:
        """QoS 1 publishes acknowledged by a live node: every subscribed client expects them."""
        node = self.live[sorted(self.live)[pick % len(self.live)]]

        async def publish() -> None:
            for _ in range(count):
                self.seq += 1
                try:
                    await node.publish(TOPIC, b"%d" % self.seq, qos=1, publisher="publisher")
                except RouterError:
                    continue  # (not acknowledged: nothing is promised)
                for client in self.subscribed:
                    self.expected[client].add(self.seq)

        self.run(publish())

    @precondition(lambda self: len(self.live) >= 2)
    @rule(pick=st.integers(0, 9), clean=st.sampled_from([None, *CLIENTS]))
    def kill(self, pick: int, clean: str | None = None) -> None:
        """A node dies without a goodbye; its clients' connections end with it. With
        ``clean``, that client connects to it first with a Session Expiry Interval of 0:
        a clean session, which ends with the node (and must leave nothing in Redis)."""
        if clean is not None:
            self.connect(clean, pick % len(self.live), expiry=0)
        node = self.live.pop(sorted(self.live)[pick % len(self.live)])

        async def kill() -> None:
            for client, where in list(self.where.items()):
                if where == node.node_id:
                    await self._stop_reading(client)
                    self.where[client] = None
                    if not self.expiry[client]:
                        self._session_ends(client)  # (with its connection)
                        self.clean_dead[client] = node.node_id
                        continue
                    session = node.sessions.find(client)
                    if session is not None and session.holding:
                        # A session that just moved here holds its new copies in memory
                        # until its previous node's tail has come: those die with this
                        # node (docs/reliability.md, "Not saved").
                        self.at_risk[client] |= self._missing(client)
            for client in CLIENTS:
                session = node.sessions.find(client)
                if session is not None:
                    # What the node holds in memory for a client dies with it: copies a
                    # connection the client left without a goodbye was given (its connect
                    # elsewhere refused before any claim), and an away session's copies
                    # its spiller has not written to Redis yet, queued or on their way
                    # (docs/reliability.md, "Not saved").
                    held = [*session.queue_view(), *session.inflight.values()]
                    away = node._keeper._away.get(client)
                    if away is not None:
                        held += away.batch  # (taken by its spiller, not in Redis yet)
                    self.at_risk[client] |= {int(d.payload) for d in held}
            await die(node)
            self.dead.append(node)

        self.run(kill())

    @precondition(lambda self: self.started < MAX_NODES)
    @rule()
    def join(self) -> None:
        self.run(self._start())

    @rule(during=st.sampled_from(["nothing", "connect"]), client=st.sampled_from(CLIENTS))
    def restart_redis(self, during: str, client: str) -> None:
        """Redis is killed and restarted from its append-only file (every write kept);
        while it is away, nothing happens or a client tries to connect (and is refused,
        as CONNACK 0x88 would say)."""
        self.server.kill()
        if during == "connect":
            self.connect(client, 0)
        self.server.restart()

    # -- the checks ----------------------------------------------------------------------

    @invariant()
    def clean_sessions_of_the_dead_are_gone(self) -> None:
        """Once a dead node was adopted (and so purged), no key of the clean sessions it
        held is left in Redis (their subscriptions, claim, aliases and description):
        nothing of a session that ended with its node outlives the node."""
        if self.clean_dead:
            with contextlib.suppress(RedisConnectionError, TimeoutError):
                self.run(self._check_clean_gone())  # (else: Redis is back just now)

    async def _check_clean_gone(self) -> bool:
        """Check the clean sessions of each purged dead node (and forget them); True when
        none is left to check."""
        for client, dead in sorted(self.clean_dead.items()):
            if await self.redis[0].hexists(self.keys.registry(), dead):
                continue  # (not adopted yet)
            left = [k for k in self.keys.client_keys(client) if await self.redis[0].exists(k)]
            assert not left, f"keys of {client}'s clean session on dead {dead} left: {left}"
            del self.clean_dead[client]
            self.clean_checked += 1
            SessionModel.clean_checked_total += 1
        return not self.clean_dead

    def teardown(self) -> None:
        try:
            if self.clean_dead:  # (each dead node is adopted within its heartbeat TTL)
                self.run(
                    waiting.retried(
                        functools.partial(
                            waiting.eventually, self._check_clean_gone, 10, "dead nodes adopted"
                        ),
                        10,
                        (RedisConnectionError,),
                    )
                )
            self.run(self._final_check())
        finally:
            try:
                self.loop.run_until_complete(self._close_within(CLOSE_TIMEOUT))
            finally:
                self.loop.run_until_complete(self._cancel_the_rest())
                self.loop.close()

    async def _cancel_the_rest(self) -> None:
        """End what a node that did not stop left running (so that no later test finds
        its connections unclosed)."""
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=5)

    async def _close_within(self, seconds: float) -> None:
        """:meth:`_close`, bounded: a node that does not stop fails the test, with what
        every task still pending was waiting for."""
        try:
            await asyncio.wait_for(self._close(), seconds)
        except TimeoutError:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            stacks = [f"{task.get_name()}: {awaiting(task.get_coro())}" for task in pending]
            raise AssertionError("nodes did not stop:\n" + "\n".join(stacks)) from None

    async def _final_check(self) -> None:
        node = self.live[sorted(self.live)[0]]
        for client in sorted(self.subscribed):
            if not self.expiry[client]:  # (the connect below takes over and ends it)
                self._session_ends(client)
        for client in sorted(self.subscribed):
            await self._stop_reading(client)
            await waiting.retried(  # (Redis may be back from a restart just now)
                functools.partial(node.connect, client, clean_start=False, expiry=EXPIRY),
                5,
                (RouterError,),
                poll=0.25,
            )
            self.where[client] = node.node_id
            self._read(client, node)
        with contextlib.suppress(TimeoutError):
            await waiting.eventually(
                lambda: not any(self._missing(c) for c in self.subscribed), SETTLE, "every copy"
            )
        missing = {c: sorted(self._missing(c)) for c in self.subscribed if self._missing(c)}
        assert not missing, f"acknowledged messages never delivered: {missing}"

    def _missing(self, client: str) -> set[int]:
        return self.expected[client] - set(self.received[client]) - self.at_risk[client]

    async def _close(self) -> None:
        for client in list(self.readers):
            await self._stop_reading(client)
        for node in [*self.live.values(), *self.dead]:
            try:
                await node.stop()
            except RouterError:  # (just after a restart of Redis)
                continue
        leftovers = [k async for k in self.redis[0].scan_iter(self.keys.pattern())]
        if leftovers:
            await self.redis[0].delete(*leftovers)
        for redis in self.redis:
            await redis.aclose()


def awaiting(coroutine: Any) -> str:
    """Where a suspended coroutine waits: its frames, outermost first."""
    frames = []
    while coroutine is not None:
        frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}")
        coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    return " > ".join(frames)


@pytest.mark.redis
def test_takeovers_and_racing_connects_keep_what_a_lasting_session_was_promised(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """The model through one chosen run of takeovers with every Clean Start and interval,
    and racing connects (the search above draws them among the rest)."""
    SessionModel.server = redis_server_factory(aof=True)
    model = SessionModel()
    try:
        model.start()
        model.connect("c1", 0)
        model.connect("c2", 1)
        model.publish(0, 3)
        for clean, expiry in [(False, EXPIRY), (False, 0), (False, EXPIRY), (True, EXPIRY)]:
            model.take_over("c1", 0, clean, expiry)
            model.publish(1, 2)
        for clean, expiry in [(False, EXPIRY), (True, EXPIRY), (False, 0), (False, EXPIRY)]:
            model.race("c2", 0, clean, expiry)
            model.publish(0, 2)
        model.join()
        model.race("c1", 1, False, EXPIRY)
        model.kill(0, "c2")  # (c2 connects to n1 with interval 0 first: it dies with n1)
        model.race("c1", 1, False, EXPIRY)
        model.publish(0, 2)
    finally:
        model.teardown()
    assert model.clean_checked == 1, "c2's clean session on the dead node was not checked"


@pytest.mark.redis
def test_persistent_sessions_keep_every_acknowledged_message(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    SessionModel.server = redis_server_factory(aof=True)
    SessionModel.clean_checked_total = 0
    run_state_machine_as_test(
        SessionModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=12,
            deadline=None,
            derandomize=SEARCH is None,
            database=None if SEARCH is None else settings.default.database,
            suppress_health_check=list(HealthCheck),
        ),
    )
    if SEARCH is None:  # (the same examples each time: one kills a node under a clean session)
        assert SessionModel.clean_checked_total > 0, "no dead node held a clean session"
