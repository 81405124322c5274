"""A node that stops gracefully leaves its persistent sessions to a live node (issue 42,
the drain and rolling upgrade): it retires instead of purging itself, a peer adopts its
sessions at once and purges it, and nothing published to them after the stop is lost.
On real Redis and the 3-master cluster.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from router.cluster.node import RouterNode
from router.ops.nodes_view import cluster_nodes, cluster_overview
from router.ops.reconcile import reconcile
from router.ops.route_view import node_statuses
from router.state.event_log import EventLog
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient
from tests.cluster.test_session_move import hold_back, move_started
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

log = logging.getLogger(__name__)

TTL = {"heartbeat_interval": 0.2, "heartbeat_ttl": 10.0}
"""A heartbeat TTL far longer than what the test waits for the adoption: a retired node
is adopted on its departure, not once its heartbeat would have expired."""


async def registered(redis: RedisClient, keys: Keys) -> list[str]:
    return [info.node_id for info in await NodeRegistry(redis, keys).nodes()]


async def away_session(node: RouterNode) -> None:
    """The persistent session of ``s`` on ``node``, subscribed to ``t`` at QoS 1, its
    client gone (as the MQTT front end leaves every session before the node stops)."""
    await node.connect("s", clean_start=False, expiry=600)
    await node.subscribe("s", "t", qos=1)
    await node.put_away("s")


async def test_what_is_published_after_a_graceful_stop_reaches_the_session_on_a_peer(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """Before: the stopping node purged itself, its away session's owner still pointing at
    it; no peer adopted it (adoption followed only an expired heartbeat of a registered
    node), so a QoS 1 message published after the stop found no route: acknowledged,
    counted unrouted, lost (a rolling upgrade lost messages). Now the node retires, b
    adopts the session at once and purges a; the copy published right after the stop
    (routed to a's inbox) and the one published after the purge both reach the client."""
    a = await start_node("a", **TTL)
    b = await start_node("b", **TTL)
    await away_session(a)
    await waiting.eventually(lambda: "a" in b.mirror.match("t").nodes, 10.0, "b routes t to a")
    loop = asyncio.get_running_loop()
    await a.stop()
    stopped = loop.time()
    early = await b.publish("t", b"right after the stop", qos=1)

    async def a_gone() -> bool:
        return "a" not in b.mirror.nodes() and await registered(redis_client, keys) == ["b"]

    await waiting.eventually(a_gone, 30.0, "a purged and dropped from b's mirror", poll=0.01)
    log.warning("a retired node adopted and purged %.3f s after its stop", loop.time() - stopped)
    late = await b.publish("t", b"after the purge", qos=1)

    assert late.nodes == ["b"]  # (on main: [], unrouted)
    assert early.nodes in (["a"], ["b"])
    assert (b.stats()["unrouted"], b.stats()["sessions_adopted"]) == (0, 1)
    assert await b.connect("s", clean_start=False, expiry=600)  # (the session was present)
    got = await take(b, "s", 2)
    assert [d.payload for d in got] == [b"right after the stop", b"after the purge"]


async def test_a_node_without_persistent_sessions_purges_itself_at_its_stop(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    a = await start_node("a", **TTL)
    await start_node("b", **TTL)
    await a.subscribe("worker", "jobs/#", qos=1)  # (Session Expiry 0: ends with the stop)
    await a.stop()
    assert await registered(redis_client, keys) == ["b"]
    assert (await a.routes.snapshot("a")).generation is None


async def test_a_retiring_node_keeps_the_routes_of_its_persistent_sessions_alone(
    start_node: StartNode,
) -> None:
    """The routes of its clean sessions (ended with the stop) go at once: a share group's
    copies are no longer given to the retired node's member, nor plain copies sent to an
    inbox nobody reads for them; the persistent session's route stays for its adoption."""
    a = await start_node("a", **TTL)
    await away_session(a)
    await a.subscribe("worker", "$share/g/jobs/#", qos=1)
    await a.subscribe("worker", "t", qos=1)
    await a.subscribe("other", "jobs/#")
    await a.stop()
    assert (await a.routes.snapshot("a")).routes == {"t": 1}


async def test_a_retired_node_is_shown_leaving_not_down_and_adopted_by_the_next_node(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """Alone, a node that stops with a persistent session stays registered, retired: the
    operator views say it left and its sessions await adoption (not alive, not down; no
    ``node_down`` event). The next node that starts adopts the session and purges it,
    telling that it left gracefully."""
    a = await start_node("a", **TTL)
    await away_session(a)
    await a.stop()
    [info] = await NodeRegistry(redis_client, keys).nodes()
    assert (info.node_id, info.alive, info.retired) == ("a", False, True)
    [row] = await cluster_nodes(redis_client, keys)
    assert (row["alive"], row["retired"], row["down_since_ms"]) == (False, True, None)
    overview = await cluster_overview(redis_client, keys, 0)
    assert (overview["nodes"]["down"], overview["nodes"]["retired"]) == ([], ["a"])
    [status] = await node_statuses(redis_client, keys)
    assert (status.alive, status.retired, status.registered) == (False, True, True)
    [problem] = (await reconcile(redis_client, keys, repair=True)).problems
    assert (problem.kind, problem.repair) == ("dead_node", "node")  # (kept for adoption)
    assert "retired" in problem.detail and problem.repaired is None

    b = await start_node("b", **TTL)
    await waiting.eventually(lambda: b.stats()["nodes_purged"] == 1, 30.0, "b purged a")
    assert b.stats()["sessions_adopted"] == 1
    events = EventLog(redis_client, keys)

    async def told_purged() -> bool:
        return bool(await events.recent(10, kinds=["node_purged"]))

    await waiting.eventually(told_purged, 10.0, "b's node_purged event")
    [purged] = await events.recent(10, kinds=["node_purged"])
    assert purged.subject == "a" and "left gracefully" in purged.text and "by node b" in purged.text
    assert await events.recent(10, kinds=["node_down"]) == []
    assert [row["node_id"] for row in await cluster_nodes(redis_client, keys)] == ["b"]
    assert await b.connect("s", clean_start=False, expiry=600)


async def test_a_retired_node_restarted_under_its_id_adopts_its_own_sessions(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """The rolling upgrade of a node alone: it retires at its stop, and its next process
    (a new incarnation, not retired) adopts its sessions before it reads its inbox; what
    was queued for the session before the stop and what is published after the restart
    reach the client."""
    a = await start_node("a", **TTL)
    await away_session(a)
    await a.publish("t", b"before the stop", qos=1)
    await waiting.eventually(lambda: a.stats()["session_queued"] == 1, 10.0, "queued in Redis")
    await a.stop()
    again = await start_node("a", **TTL)
    [info] = await NodeRegistry(redis_client, keys).nodes()
    assert (info.incarnation, info.alive, info.retired) == (again.incarnation, True, False)
    assert again.stats()["sessions_adopted"] == 1
    await again.publish("t", b"after the restart", qos=1)
    assert await again.connect("s", clean_start=False, expiry=600)
    got = await take(again, "s", 2)
    assert [d.payload for d in got] == [b"before the stop", b"after the restart"]


async def test_moves_done_waits_for_a_handoff_with_its_grace(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain lets the moves of sessions finish before it stops the node (a stop cuts
    their grace short): the client of ``roamer`` reconnected to c while b, its node,
    drains; a's mirror has not seen c's routes yet, so b's grace lasts (the move's fence
    cannot pass) and what a sends b meanwhile goes on to c with the tail."""
    a, b, c = await move_started(start_node)
    release = hold_back(a, "c", monkeypatch)
    resumed = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))
    await waiting.eventually(lambda: not b.serves("roamer"), 5, "b handed the session on")
    assert await b.moves_done(0.05) is False  # (the grace runs)
    late = await a.publish("news", b"in the grace", qos=1)
    assert late.nodes == ["b"]
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await b.moves_done(30.0) is True
    log.warning("b's move finished %.3f s after the drain began waiting", loop.time() - began)
    assert await b.moves_done(0.0) is True
    await b.stop()
    assert await resumed
    release()
    got = await take(c, "roamer", 1)
    assert [d.payload for d in got] == [b"in the grace"]
