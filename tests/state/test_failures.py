"""Redis failing, as the state layer tells it: redis-py's errors become the router's.

A table of redis-py's exceptions and what each becomes; then every public call of the
state layer against a Redis that is not there (a refused connection): each raises
:class:`StateUnavailableError`, a :class:`RouterError`, with redis-py's error as its cause.
A call added to the state layer without a line in :data:`CALLS` fails the last test.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    ConnectionError as RedisConnectionError,
    CrossSlotTransactionError,
    DataError,
    ExecAbortError,
    MasterDownError,
    MaxConnectionsError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError as RedisTimeoutError,
    TryAgainError,
)

import router.state
from router.core.messages import Delivery
from router.core.options import DEFAULT_OPTIONS
from router.core.topics import validate_filter
from router.errors import (
    RouterError,
    StateAccessError,
    StateFailureError,
    StateUnavailableError,
)
from router.state.alias_store import AliasCopy, RedisAliasTable
from router.state.auth_store import AuthStore
from router.state.ban_store import BanStore
from router.state.channels import Channel
from router.state.client_figures import ClientFigureStore, NodeDrops
from router.state.connection import check_eviction, eviction_policies, open_redis
from router.state.console_store import ConsoleStore
from router.state.emqx_records import EmqxRecords
from router.state.event_log import Event, EventLog
from router.state.failures import state_error, translating
from router.state.keys import Keys
from router.state.login_attempts import Attempt, LoginAttempts
from router.state.node_figures import NodeFigures, NodeFigureStore
from router.state.node_history import NodeHistoryStore, NodeTelemetry, TrafficSample
from router.state.node_registry import NodeRegistry
from router.state.reads import command, commands_each, read_each, read_with_ttl, server_ms
from router.state.retained_store import RetainedStore
from router.state.route_acks import RouteAcks
from router.state.route_fence_channel import RouteFences
from router.state.route_hints import RouteHints
from router.state.routes import RouteStore
from router.state.scan import scan_keys, scan_pages
from router.state.scripts import RedisClient, Scripts
from router.state.session_queue import SessionQueue
from router.state.session_store import SessionStore
from router.state.subscriptions import Owner, SubscriptionStore
from router.state.trace_store import TraceRecord, TraceSpec, TraceStore
from router.state.wakeups import WakeUps

DEAD_URL = "redis://127.0.0.1:1/0"  # (nothing listens on port 1: refused at once)
KEYS = Keys("t-dead")
EVENT = Event("node_up", "info", "n1", "n1", "node n1 started")
OWNER = Owner("n1", 1)

# -- the mapping -----------------------------------------------------------------------------

# (redis-py's error, the router's class, StateAccessError.credentials or None)
MAPPING: list[tuple[BaseException, type[StateFailureError], bool | None]] = [
    (RedisConnectionError("Connection refused"), StateUnavailableError, None),
    (RedisTimeoutError("Timeout reading from socket"), StateUnavailableError, None),
    (BusyLoadingError("Redis is loading the dataset in memory"), StateUnavailableError, None),
    (MaxConnectionsError("Too many connections"), StateUnavailableError, None),
    (ClusterDownError("The cluster is down"), StateUnavailableError, None),
    (MasterDownError("Link with MASTER is down"), StateUnavailableError, None),
    (ClusterError("TTL exhausted."), StateUnavailableError, None),
    (TryAgainError("Multiple keys request during rehashing of slot"), StateUnavailableError, None),
    (SlotNotCoveredError("slot 3 is not covered"), StateUnavailableError, None),
    (RedisClusterException("Redis Cluster cannot be connected"), StateUnavailableError, None),
    (AuthenticationError("invalid username-password pair"), StateAccessError, True),
    (AuthorizationError("not allowed"), StateAccessError, True),
    (NoPermissionError("this user has no permissions to run 'evalsha'"), StateAccessError, False),
    (
        OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
        StateFailureError,
        None,
    ),
    (ReadOnlyError("You can't write against a read only replica."), StateFailureError, None),
    (ResponseError("WRONGTYPE Operation against a key"), StateFailureError, None),
    (ExecAbortError("Transaction discarded"), StateFailureError, None),
    (DataError("Invalid input of type: 'NoneType'"), StateFailureError, None),
    (CrossSlotTransactionError("keys in different slots"), StateFailureError, None),
]


@pytest.mark.parametrize(
    ("error", "kind", "credentials"), MAPPING, ids=[type(e).__name__ for e, _, _ in MAPPING]
)
def test_each_redis_error_becomes_the_routers(
    error: BaseException, kind: type[StateFailureError], credentials: bool | None
) -> None:
    translated = state_error(error)
    assert type(translated) is kind
    assert isinstance(translated, RouterError)
    assert translated.cause is error
    if credentials is not None:
        assert isinstance(translated, StateAccessError)
        assert translated.credentials is credentials
    assert str(error) in str(translated)


def test_the_messages_say_what_the_cli_said() -> None:
    assert str(state_error(RedisConnectionError("x"))) == "cannot reach Redis: x"
    assert str(state_error(AuthenticationError("x"))) == "Redis refused the credentials: x"
    assert str(state_error(NoPermissionError("x"))).startswith(
        "Redis denies a command the router needs (see docs/operations.md): "
    )
    assert str(state_error(OutOfMemoryError("x"))) == "Redis error: x"
    assert str(state_error(RedisTimeoutError())) == "cannot reach Redis: TimeoutError"


def test_translating_chains_redis_errors_and_lets_others_pass() -> None:
    cause = RedisTimeoutError("slow")
    with pytest.raises(StateUnavailableError) as raised, translating:
        raise cause
    assert raised.value.__cause__ is cause and raised.value.cause is cause
    with pytest.raises(KeyError), translating:
        raise KeyError("not Redis")
    with translating:
        pass


# -- every call against a dead Redis ---------------------------------------------------------


async def _drain(items: AsyncIterator[Any]) -> None:
    async for _ in items:
        pass


def _queue(redis: RedisClient) -> SessionQueue:
    return SessionQueue(redis, KEYS, "c1", 60)


def _channel(redis: RedisClient) -> Channel:
    return Channel(redis, "ch", 60.0, KEYS)


def _sessions(redis: RedisClient) -> SessionStore:
    return SessionStore(redis, KEYS, SubscriptionStore(redis, KEYS))


def _attempts(redis: RedisClient) -> LoginAttempts:
    return LoginAttempts(redis, KEYS, limit=10, window=60.0)


def _delivery() -> Delivery:
    return Delivery("a/b", b"x", 1, False, b"m" * 16)


Call = Callable[[RedisClient], Awaitable[Any]]

CALLS: dict[str, Call] = {
    # alias_store
    "alias_store.RedisAliasTable.set_maximum": lambda r: RedisAliasTable(r, KEYS).set_maximum(
        "c1", "client", 10
    ),
    "alias_store.RedisAliasTable.bind": lambda r: RedisAliasTable(r, KEYS).bind(
        "c1", "client", 1, "a/b"
    ),
    "alias_store.RedisAliasTable.topic": lambda r: RedisAliasTable(r, KEYS).topic(
        "c1", "client", 1
    ),
    "alias_store.RedisAliasTable.alias": lambda r: RedisAliasTable(r, KEYS).alias(
        "c1", "client", "a/b"
    ),
    "alias_store.RedisAliasTable.aliases": lambda r: RedisAliasTable(r, KEYS).aliases(
        "c1", "client"
    ),
    "alias_store.RedisAliasTable.remove_client": lambda r: RedisAliasTable(r, KEYS).remove_client(
        "c1"
    ),
    "alias_store.RedisAliasTable.mirror": lambda r: RedisAliasTable(r, KEYS).mirror(
        [AliasCopy("c1", Owner("n1", 1), ((10, {1: "a/b"}), (0, {})))]
    ),
    # auth_store
    "auth_store.AuthStore.add_user": lambda r: AuthStore(r, KEYS).add_user("u", "pw"),
    "auth_store.AuthStore.set_password": lambda r: AuthStore(r, KEYS).set_password("u", "pw"),
    "auth_store.AuthStore.remove_user": lambda r: AuthStore(r, KEYS).remove_user("u"),
    "auth_store.AuthStore.users": lambda r: AuthStore(r, KEYS).users(),
    "auth_store.AuthStore.add_rule": lambda r: AuthStore(r, KEYS).add_rule("allow all all a/#"),
    "auth_store.AuthStore.remove_rule": lambda r: AuthStore(r, KEYS).remove_rule(
        "allow all all a/#"
    ),
    "auth_store.AuthStore.rules": lambda r: AuthStore(r, KEYS).rules(),
    "auth_store.AuthStore.count": lambda r: AuthStore(r, KEYS).count(),
    "auth_store.AuthStore.snapshot": lambda r: AuthStore(r, KEYS).snapshot(),
    # ban_store
    "ban_store.BanStore.add": lambda r: BanStore(r, KEYS).add("client", "c1", seconds=10),
    "ban_store.BanStore.remove": lambda r: BanStore(r, KEYS).remove("client", "c1"),
    "ban_store.BanStore.bans": lambda r: BanStore(r, KEYS).bans(),
    # channels
    "channels.Channel.add_subscriber": lambda r: _channel(r).add_subscriber("s"),
    "channels.Channel.backlog": lambda r: _channel(r).backlog("s"),
    "channels.Channel.position": lambda r: _channel(r).position("s"),
    "channels.Channel.copy_cursor": lambda r: _channel(r).copy_cursor("s", "t"),
    "channels.Channel.remove_subscriber": lambda r: _channel(r).remove_subscriber("s"),
    "channels.Channel.publish": lambda r: _channel(r).publish([("m1", b"x")]),
    "channels.Channel.add_subscribers": lambda r: Channel.add_subscribers([_channel(r)], "s"),
    "channels.Channel.subscribed": lambda r: Channel.subscribed([_channel(r)], "s"),
    "channels.Channel.positions": lambda r: Channel.positions([_channel(r)], "s"),
    "channels.Channel.publish_each": lambda r: Channel.publish_each(
        [(_channel(r), [("m1", b"x")])]
    ),
    "channels.Channel.fetch": lambda r: _channel(r).fetch("s"),
    "channels.Channel.read": lambda r: _channel(r).read("s", 10),
    "channels.Channel.ack": lambda r: _channel(r).ack("s", _channel(r).handle("s", 1)),
    # connection
    "connection.eviction_policies": eviction_policies,
    "connection.check_eviction": lambda r: check_eviction(r, False),
    "connection.open_redis": lambda _: open_redis(DEAD_URL, socket_connect_timeout=1),
    # console_store
    "console_store.ConsoleStore.add_user": lambda r: ConsoleStore(r, KEYS).add_user(
        "u", "a long password", "admin"
    ),
    "console_store.ConsoleStore.remove_user": lambda r: ConsoleStore(r, KEYS).remove_user("u"),
    "console_store.ConsoleStore.users": lambda r: ConsoleStore(r, KEYS).users(),
    "console_store.ConsoleStore.has_accounts": lambda r: ConsoleStore(r, KEYS).has_accounts(),
    "console_store.ConsoleStore.user_hash": lambda r: ConsoleStore(r, KEYS).user_hash("u"),
    "console_store.ConsoleStore.open_login": lambda r: ConsoleStore(r, KEYS).open_login(
        "u", "viewer"
    ),
    "console_store.ConsoleStore.login": lambda r: ConsoleStore(r, KEYS).login("token"),
    "console_store.ConsoleStore.close_login": lambda r: ConsoleStore(r, KEYS).close_login("token"),
    "console_store.ConsoleStore.add_api_key": lambda r: ConsoleStore(r, KEYS).add_api_key(
        "k", "viewer"
    ),
    "console_store.ConsoleStore.api_keys": lambda r: ConsoleStore(r, KEYS).api_keys(),
    "console_store.ConsoleStore.remove_api_key": lambda r: ConsoleStore(r, KEYS).remove_api_key(
        "0123456789abcdef"
    ),
    "console_store.ConsoleStore.api_key": lambda r: ConsoleStore(r, KEYS).api_key(
        "rk_0123456789abcdef_" + "s" * 43
    ),
    # login_attempts
    "login_attempts.LoginAttempts.take": lambda r: _attempts(r).take("u", "127.0.0.1"),
    "login_attempts.LoginAttempts.release": lambda r: _attempts(r).release(
        Attempt(
            KEYS.console_login_attempts("user", "d"),
            KEYS.console_login_attempts("address", "a"),
            "id",
        )
    ),
    # emqx_records
    "emqx_records.EmqxRecords.user": lambda r: EmqxRecords(r).user("u"),
    "emqx_records.EmqxRecords.acl": lambda r: EmqxRecords(r).acl("u"),
    # node_figures
    "node_figures.NodeFigureStore.write": lambda r: NodeFigureStore(r, KEYS).write(
        "n1", NodeFigures(), 10
    ),
    "node_figures.NodeFigureStore.delete": lambda r: NodeFigureStore(r, KEYS).delete("n1"),
    "node_figures.NodeFigureStore.read": lambda r: NodeFigureStore(r, KEYS).read(["n1"]),
    "node_figures.NodeFigureStore.live": lambda r: NodeFigureStore(r, KEYS).live(
        NodeRegistry(r, KEYS)
    ),
    # node_history
    "node_history.NodeHistoryStore.write": lambda r: NodeHistoryStore(r, KEYS).write(
        "n1", NodeTelemetry(), TrafficSample(1.0, 0, 0, 0), 10, 5
    ),
    "node_history.NodeHistoryStore.delete": lambda r: NodeHistoryStore(r, KEYS).delete("n1"),
    "node_history.NodeHistoryStore.mark_seen": lambda r: NodeHistoryStore(r, KEYS).mark_seen(
        "n1", 2.0, 1.0
    ),
    "node_history.NodeHistoryStore.seen_since": lambda r: NodeHistoryStore(r, KEYS).seen_since(1.0),
    "node_history.NodeHistoryStore.read": lambda r: NodeHistoryStore(r, KEYS).read(["n1"]),
    "node_history.NodeHistoryStore.live": lambda r: NodeHistoryStore(r, KEYS).live(
        NodeRegistry(r, KEYS)
    ),
    # node_registry
    "node_registry.NodeRegistry.register": lambda r: NodeRegistry(r, KEYS).register("n1", "i1"),
    "node_registry.NodeRegistry.heartbeat": lambda r: NodeRegistry(r, KEYS).heartbeat("n1", "i1"),
    "node_registry.NodeRegistry.nodes": lambda r: NodeRegistry(r, KEYS).nodes(),
    "node_registry.NodeRegistry.live_nodes": lambda r: NodeRegistry(r, KEYS).live_nodes(),
    "node_registry.NodeRegistry.dead_nodes": lambda r: NodeRegistry(r, KEYS).dead_nodes(),
    "node_registry.NodeRegistry.unregister": lambda r: NodeRegistry(r, KEYS).unregister("n1"),
    "node_registry.NodeRegistry.retire": lambda r: NodeRegistry(r, KEYS).retire("n1", "i1"),
    "node_registry.NodeRegistry.lease_adoption": lambda r: NodeRegistry(r, KEYS).lease_adoption(
        "n1", "n2", 10
    ),
    "node_registry.NodeRegistry.end_adoption": lambda r: NodeRegistry(r, KEYS).end_adoption("n1"),
    "node_registry.NodeRegistry.purge": lambda r: NodeRegistry(r, KEYS).purge("n1"),
    "node_registry.NodeRegistry.purge_dead": lambda r: NodeRegistry(r, KEYS).purge_dead(),
    # reads
    "reads.command": lambda r: command(r, "GET", "k"),
    "reads.read_each": lambda r: read_each(r, "GET", ["k"]),
    "reads.commands_each": lambda r: commands_each(r, [[("GET", "k")]]),
    "reads.read_with_ttl": lambda r: read_with_ttl(r, "k"),
    "reads.server_ms": server_ms,
    # retained_store
    "retained_store.RetainedStore.store": lambda r: RetainedStore(r, KEYS).store("a/b", b"x"),
    "retained_store.RetainedStore.put": lambda r: RetainedStore(r, KEYS).put(
        "a/b", b"x", 0, b"m" * 16, None, None
    ),
    "retained_store.RetainedStore.stored_bytes": lambda r: RetainedStore(r, KEYS).stored_bytes(),
    "retained_store.RetainedStore.delete": lambda r: RetainedStore(r, KEYS).delete("a/#"),
    "retained_store.RetainedStore.clean": lambda r: RetainedStore(r, KEYS).clean(),
    "retained_store.RetainedStore.clear_expired": lambda r: RetainedStore(r, KEYS).clear_expired(),
    "retained_store.RetainedStore.get": lambda r: RetainedStore(r, KEYS).get("a/b"),
    "retained_store.RetainedStore.match": lambda r: RetainedStore(r, KEYS).match("a/#"),
    "retained_store.RetainedStore.matching": lambda r: _drain(
        RetainedStore(r, KEYS).matching(validate_filter("#"))
    ),
    "retained_store.RetainedStore.scan": lambda r: RetainedStore(r, KEYS).scan(),
    "retained_store.RetainedStore.iter_batches": lambda r: _drain(
        RetainedStore(r, KEYS).iter_batches()
    ),
    "retained_store.RetainedStore.page": lambda r: RetainedStore(r, KEYS).page(),
    "retained_store.RetainedStore.size": lambda r: RetainedStore(r, KEYS).size(),
    # client_figures
    "client_figures.ClientFigureStore.write": lambda r: ClientFigureStore(r, KEYS).write(
        "n1", [], NodeDrops(0, {}, {}), 1.0
    ),
    "client_figures.ClientFigureStore.delete": lambda r: ClientFigureStore(r, KEYS).delete("n1"),
    "client_figures.ClientFigureStore.clients": lambda r: ClientFigureStore(r, KEYS).clients(
        {"n1": ["c1"]}
    ),
    "client_figures.ClientFigureStore.drops": lambda r: ClientFigureStore(r, KEYS).drops(["n1"]),
    # trace_store
    "trace_store.TraceStore.start": lambda r: TraceStore(r, KEYS).start("client", "c1", 5),
    "trace_store.TraceStore.stop": lambda r: TraceStore(r, KEYS).stop("t1"),
    "trace_store.TraceStore.traces": lambda r: TraceStore(r, KEYS).traces(),
    "trace_store.TraceStore.append": lambda r: TraceStore(r, KEYS).append(
        TraceSpec("t1", "client", "c1", 1e10), [TraceRecord("n1", "in", "c1", "", "x")]
    ),
    "trace_store.TraceStore.records": lambda r: TraceStore(r, KEYS).records("t1"),
    # event_log
    "event_log.EventLog.add": lambda r: EventLog(r, KEYS).add(EVENT, once="t"),
    "event_log.EventLog.add_many": lambda r: EventLog(r, KEYS).add_many([EVENT]),
    "event_log.EventLog.recent": lambda r: EventLog(r, KEYS).recent(),
    "event_log.EventLog.lives": lambda r: EventLog(r, KEYS).lives(),
    # route_acks, route_hints, routes
    "route_acks.RouteAcks.ack": lambda r: RouteAcks(r, KEYS).ack("n1", "n2", "g1", 1),
    "route_acks.RouteAcks.read": lambda r: RouteAcks(r, KEYS).read("n1"),
    "route_fence_channel.RouteFences.ask": lambda r: RouteFences(r, KEYS).ask("n1", 1),
    "route_fence_channel.RouteFences.settled": lambda r: RouteFences(r, KEYS).settled(
        "n2", "n1", 1
    ),
    "route_hints.RouteHints.announce": lambda r: RouteHints(r, KEYS).announce("n1"),
    "route_hints.RouteHints.depart": lambda r: RouteHints(r, KEYS).depart("n1"),
    "route_hints.RouteHints.subscribe": lambda r: RouteHints(r, KEYS).subscribe(),
    "route_hints.RouteHints.message": lambda r: RouteHints(r, KEYS).message(0.1),
    "routes.RouteStore.claim": lambda r: RouteStore(r, KEYS).claim("n1", "i1", {"a/b": 1}),
    "routes.RouteStore.apply": lambda r: RouteStore(r, KEYS).apply("n1", "i1", [("a/b", 1)]),
    "routes.RouteStore.write": lambda r: RouteStore(r, KEYS).write(
        "n1", "i1", {validate_filter("a/b"): 1}
    ),
    "routes.RouteStore.add": lambda r: RouteStore(r, KEYS).add("n1", "i1", "a/b"),
    "routes.RouteStore.remove": lambda r: RouteStore(r, KEYS).remove("n1", "i1", "a/b"),
    "routes.RouteStore.snapshot": lambda r: RouteStore(r, KEYS).snapshot("n1"),
    "routes.RouteStore.changes": lambda r: RouteStore(r, KEYS).changes("n1", "g1", 0),
    "routes.RouteStore.purge": lambda r: RouteStore(r, KEYS).purge("n1"),
    # scan, scripts
    "scan.scan_keys": lambda r: scan_keys(r, "t-dead:*"),
    "scan.scan_pages": lambda r: _drain(scan_pages(r, "t-dead:*")),
    "scripts.Scripts.run": lambda r: Scripts(r).run("alias_remove", ["{c}:a", "{c}:b"], []),
    "scripts.Scripts.run_many": lambda r: Scripts(r).run_many(
        "alias_remove", [(["{c}:a", "{c}:b"], [])]
    ),
    # session_store
    "session_store.SessionStore.mark_open": lambda r: _sessions(r).mark_open(
        "c1", OWNER, expiry=60
    ),
    "session_store.SessionStore.mark_away": lambda r: _sessions(r).mark_away(
        "c1", OWNER, expiry=60
    ),
    "session_store.SessionStore.describe": lambda r: _sessions(r).describe("c1"),
    "session_store.SessionStore.describe_many": lambda r: _sessions(r).describe_many(["c1"]),
    "session_store.SessionStore.adopt": lambda r: _sessions(r).adopt("c1", OWNER, "n2"),
    "session_store.SessionStore.adopt_many": lambda r: _sessions(r).adopt_many(
        [("c1", OWNER)], "n2"
    ),
    "session_store.SessionStore.client_id_pages": lambda r: _drain(_sessions(r).client_id_pages()),
    "session_queue.SessionQueue.reset": lambda r: _queue(r).reset(),
    "session_queue.SessionQueue.queued_bytes": lambda r: _queue(r).queued_bytes(),
    "session_queue.SessionQueue.ensure": lambda r: _queue(r).ensure(),
    "session_queue.SessionQueue.backlog": lambda r: _queue(r).backlog(),
    "session_queue.SessionQueue.append": lambda r: _queue(r).append(
        [_delivery()], 100, "drop_oldest"
    ),
    "session_queue.SessionQueue.ensure_each": lambda r: SessionQueue.ensure_each([_queue(r)]),
    "session_queue.SessionQueue.append_each": lambda r: SessionQueue.append_each(
        [(_queue(r), [_delivery()])], 100, "drop_oldest"
    ),
    "session_queue.SessionQueue.mark_handoff": lambda r: _queue(r).mark_handoff(2),
    "session_queue.SessionQueue.mark_tail_end": lambda r: _queue(r).mark_tail_end(2),
    "session_queue.SessionQueue.handed_off": lambda r: _queue(r).handed_off(2),
    "session_queue.SessionQueue.drain": lambda r: _queue(r).drain(),
    "session_queue.SessionQueue.delete": lambda r: _queue(r).delete(),
    # subscriptions
    "subscriptions.SubscriptionStore.claim": lambda r: SubscriptionStore(r, KEYS).claim("c1", "n1"),
    "subscriptions.SubscriptionStore.claim_over": lambda r: SubscriptionStore(r, KEYS).claim_over(
        "c1", "n1"
    ),
    "subscriptions.SubscriptionStore.restore_owner": lambda r: SubscriptionStore(
        r, KEYS
    ).restore_owner("c1", OWNER),
    "subscriptions.SubscriptionStore.owner": lambda r: SubscriptionStore(r, KEYS).owner("c1"),
    "subscriptions.SubscriptionStore.owners": lambda r: SubscriptionStore(r, KEYS).owners(["c1"]),
    "subscriptions.SubscriptionStore.subscribe": lambda r: SubscriptionStore(r, KEYS).subscribe(
        "c1", "a/b"
    ),
    "subscriptions.SubscriptionStore.subscribe_many": lambda r: SubscriptionStore(
        r, KEYS
    ).subscribe_many("c1", [("a/b", DEFAULT_OPTIONS)]),
    "subscriptions.SubscriptionStore.write_subscriptions": lambda r: SubscriptionStore(
        r, KEYS
    ).write_subscriptions("c1", [(validate_filter("a/b"), DEFAULT_OPTIONS)]),
    "subscriptions.SubscriptionStore.unsubscribe": lambda r: SubscriptionStore(r, KEYS).unsubscribe(
        "c1", "a/b"
    ),
    "subscriptions.SubscriptionStore.unsubscribe_many": lambda r: SubscriptionStore(
        r, KEYS
    ).unsubscribe_many("c1", ["a/b"]),
    "subscriptions.SubscriptionStore.delete_subscriptions": lambda r: SubscriptionStore(
        r, KEYS
    ).delete_subscriptions("c1", [validate_filter("a/b")]),
    "subscriptions.SubscriptionStore.subscriptions": lambda r: SubscriptionStore(
        r, KEYS
    ).subscriptions("c1"),
    "subscriptions.SubscriptionStore.subscription_counts": lambda r: SubscriptionStore(
        r, KEYS
    ).subscription_counts(["c1"]),
    "subscriptions.SubscriptionStore.remove_client": lambda r: SubscriptionStore(
        r, KEYS
    ).remove_client("c1"),
    "subscriptions.SubscriptionStore.remove_clients": lambda r: SubscriptionStore(
        r, KEYS
    ).remove_clients([("c1", Owner("n1", 1))]),
    # wakeups
    "wakeups.WakeUps.arm": lambda r: WakeUps(r, "wake").arm(),
}

# Public calls that reach no Redis here, or are not the state layer's boundary.
NOT_CALLED = {
    # the helper of Scripts and of the batched reads and commands (Scripts.run,
    # read_each and command tell its errors) and redis-py's client itself
    "turn_batch.TurnBatch.evalsha",
    "turn_batch.TurnBatch.evalsha_now",
    "turn_batch.TurnBatch.commands_now",
    "turn_batch.TurnBatch.call",
    "connection.BoundedRedisCluster.execute_command",
    # nothing to do on a standalone server (tests/state/test_dead_master.py: on a cluster)
    "connection.refresh_slot_map",
    # closing what was never opened, waiting on an event
    "channels.Channel.aclose",
    "session_queue.SessionQueue.aclose",
    "wakeups.WakeUps.aclose",
    "wakeups.WakeUps.wait",
    "route_hints.RouteHints.close",
    # open_redis's helper (it tells the errors; tests/state/test_sentinel.py: no sentinel),
    # redis-py's hook that its pools call (their callers tell the errors), and closing
    "sentinel.open_sentinel",
    "sentinel.FollowingSentinel.discover_master",
    "sentinel.SentinelRedis.aclose",
}


@pytest.fixture
async def dead() -> AsyncIterator[Redis]:
    """A client of a Redis that is not there: every connection is refused at once."""
    client = Redis.from_url(DEAD_URL, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    yield client
    await client.aclose()


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_every_call_against_a_dead_redis_raises_state_unavailable(
    dead: Redis, name: str
) -> None:
    with pytest.raises(StateUnavailableError) as raised:
        await CALLS[name](dead)
    assert isinstance(raised.value, RouterError)
    assert isinstance(raised.value.__cause__, RedisConnectionError)
    assert raised.value.cause is raised.value.__cause__
    assert str(raised.value).startswith("cannot reach Redis: ")


def public_calls() -> set[str]:
    """``module.Class.method`` (or ``module.function``) of every public coroutine and
    async generator defined in router.state."""
    found = set()
    for info in pkgutil.iter_modules(router.state.__path__):
        module = importlib.import_module(f"router.state.{info.name}")
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(value):
                for attribute, member in vars(value).items():
                    function = getattr(member, "__func__", member)
                    if not attribute.startswith("_") and _is_async(function):
                        found.add(f"{info.name}.{name}.{attribute}")
            elif _is_async(value):
                found.add(f"{info.name}.{name}")
    return found


def _is_async(value: object) -> bool:
    return inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value)


def test_every_public_call_of_the_state_layer_is_tried() -> None:
    assert public_calls() == set(CALLS) | NOT_CALLED
