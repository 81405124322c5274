"""The python-socketio manager across real servers: each on a node of its own, on one
Redis (standalone; the 3-master cluster too for the tests taking ``redis_url``), with
real socket.io clients.

What a server did not get is read from its manager's counts once a later message from
the same server has arrived: copies from one node to another arrive in order, so a copy
that was sent would have been there first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

import router
from router.integrations.socketio_manager import RouterManager
from router.state.keys import Keys
from tests.support.cli import delete_namespace
from tests.support.proxy import Proxy
from tests.support.socketio_servers import (
    FAST,
    Client,
    Server,
    clients,
    socketio_servers,
    start_server,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(60)
MARKS = itertools.count(1)


@pytest.fixture
def standalone(redis_standalone_url: str, keys: Keys) -> Iterator[str]:
    """The standalone Redis, for what runs on it only (``prefix``: the test's keys, deleted
    afterwards)."""
    try:
        yield redis_standalone_url
    finally:
        delete_namespace(redis_standalone_url, keys)


def received(servers: list[Server]) -> list[int]:
    return [server.manager.stats()["received"] for server in servers]


async def mark(server: Server, *targets: Client, to: str | None = None) -> None:
    """Emit a marker from ``server`` (to everyone, or one sid) and wait until each target
    has it: what ``server`` sent before has been handled by then."""
    number = next(MARKS)
    await server.sio.emit("mark", number, to=to)
    for target in targets:
        await target.wait_for("mark", number)


async def test_an_emit_to_a_room_reaches_only_the_servers_with_a_member(
    redis_url: str, prefix: str
) -> None:
    async with (
        socketio_servers([redis_url] * 3, prefix) as servers,
        clients(*servers) as (one, two, three),
    ):
        assert await two.sio.call("join", "lobby") == "joined"
        before = received(servers)
        await servers[0].sio.emit("chat", "hello", room="lobby")
        await two.wait_for("chat", "hello")
        await mark(servers[0], one, two, three)  # a broadcast reaches every server
        assert one.got("chat") == three.got("chat") == []
        after = received(servers)
        # server-3 had no member of the lobby: it got only the broadcast
        assert [a - b for a, b in zip(after, before, strict=True)] == [0, 2, 1]
        assert [s.manager.stats()["stray"] for s in servers] == [0, 0, 0]


async def test_an_emit_to_a_sid_and_its_callback_cross_servers(redis_url: str, prefix: str) -> None:
    async with (
        socketio_servers([redis_url] * 3, prefix) as servers,
        clients(*servers) as (_, two, three),
    ):
        before = received(servers)
        answer = await servers[0].sio.call("ask", "the time", to=two.sid, timeout=10)
        assert answer == "answer to the time"
        await mark(servers[0], three, to=three.sid)
        assert three.got("ask") == []
        after = received(servers)
        # server-1 got the answer, server-2 the question, server-3 its marker only
        assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1]


async def test_a_server_disconnects_a_client_of_another(redis_url: str, prefix: str) -> None:
    async with (
        socketio_servers([redis_url] * 2, prefix) as servers,
        clients(*servers) as (_, two),
    ):
        manager, sid = servers[1].manager, two.sid
        assert manager.stats()["rooms_subscribed"] == 2  # its namespace and its sid
        sid_topic = manager.topics.room("/", sid)
        mirror = servers[0].manager.node.mirror
        assert "server-2" in mirror.match(sid_topic).nodes
        await servers[0].sio.disconnect(sid)
        await eventually(lambda: not two.sio.connected, 10, "client two disconnected")
        await eventually(lambda: manager.stats()["rooms_subscribed"] == 0, 10, manager.stats)
        await eventually(lambda: not mirror.match(sid_topic).nodes, 10, "the sid's route gone")


async def test_a_server_moves_a_client_of_another_between_rooms(
    redis_url: str, prefix: str
) -> None:
    async with (
        socketio_servers([redis_url] * 2, prefix) as servers,
        clients(*servers) as (_, two),
    ):
        first = servers[0].sio
        # enter_room returns once server-2 subscribed: the emit right after reaches it
        await first.enter_room(two.sid, "news")
        await first.emit("news", 1, room="news")
        await two.wait_for("news", 1)
        assert servers[1].sio.rooms(two.sid) == [two.sid, "news"]
        await first.leave_room(two.sid, "news")
        await first.emit("news", 2, room="news")
        await mark(servers[0], two, to=two.sid)
        assert two.got("news") == [1]
        assert servers[0].manager.stats()["acks_missed"] == 0


async def test_skip_sid_and_close_room_across_servers(standalone: str, keys: Keys) -> None:
    async with (
        socketio_servers([standalone] * 3, keys.prefix) as servers,
        clients(*servers) as (one, two, three),
    ):
        for client in (two, three):
            assert await client.sio.call("join", "lobby") == "joined"
        await servers[0].sio.emit("chat", "not you", room="lobby", skip_sid=two.sid)
        await three.wait_for("chat", "not you")
        await mark(servers[0], two, to=two.sid)
        assert two.got("chat") == []

        await servers[0].sio.close_room("lobby")
        for server in servers[1:]:  # each left the room's topic
            await eventually(
                lambda s=server: s.manager.stats()["rooms_subscribed"] == 2, 10, "unsubscribed"
            )
        before = received(servers)
        await servers[0].sio.emit("chat", "anyone?", room="lobby")
        await mark(servers[0], one, two, three)
        assert [a - b for a, b in zip(received(servers), before, strict=True)] == [0, 1, 1]
        assert two.got("chat") == [] and three.got("chat") == ["not you"]


async def test_an_emit_to_several_rooms_reaches_each_member_once(
    standalone: str, keys: Keys
) -> None:
    async with (
        socketio_servers([standalone] * 3, keys.prefix) as servers,
        clients(*servers) as (one, two, three),
    ):
        for client, room in ((two, "a"), (two, "b"), (three, "b")):
            assert await client.sio.call("join", room) == "joined"
        await servers[0].sio.emit("multi", "x", room=["a", "b"])
        await mark(servers[0], one, two, three)
        assert two.got("multi") == three.got("multi") == ["x"]
        assert servers[1].manager.stats()["duplicates"] == 1  # (its copy for b)


ROOM_NAMES = ["a", "a/b", "a/+", "+", "#", "$SYS", "", "nul\x00", "%2F", "/", "é", 5, "5"]


async def test_any_room_name_routes_to_its_members_only(standalone: str, keys: Keys) -> None:
    async with (
        socketio_servers([standalone] * 3, keys.prefix) as servers,
        clients(*servers) as (one, two, three),
    ):
        mine = [(two, ROOM_NAMES[::2]), (three, ROOM_NAMES[1::2])]
        for client, rooms in mine:
            for room in rooms:
                assert await client.sio.call("join", room) == "joined"
        for index, room in enumerate(ROOM_NAMES):
            await servers[0].sio.emit("room", index, room=room)
        await mark(servers[0], one, two, three)
        for client, rooms in mine:
            assert client.got("room") == [ROOM_NAMES.index(r) for r in rooms]
        assert [s.manager.stats()["stray"] for s in servers] == [0, 0, 0]


async def test_a_write_only_manager_emits_from_outside_the_servers(
    standalone: str, keys: Keys
) -> None:
    async with (
        socketio_servers([standalone], keys.prefix) as servers,
        clients(*servers) as (one,),
    ):
        assert await one.sio.call("join", "lobby") == "joined"
        options = {"prefix": keys.prefix, **FAST}
        outside = RouterManager(standalone, write_only=True, node_options=options)
        try:
            await outside.emit("chat", "from a worker", room="lobby")
            await one.wait_for("chat", "from a worker")
            assert outside.stats()["published"] == 1
        finally:
            await outside.close()


async def test_a_dropped_redis_connection_loses_nothing_acknowledged(
    standalone: str, keys: Keys
) -> None:
    port = urlsplit(standalone).port
    assert port is not None
    proxies = [Proxy(port), Proxy(port)]
    urls = [f"redis://127.0.0.1:{proxy.port}/0" for proxy in proxies]
    options = {"heartbeat_ttl": 3.0, "publish_timeout": 1.0, "redis_timeout": 1.0}
    try:
        async with (
            socketio_servers(urls, keys.prefix, **options) as servers,
            clients(*servers) as (_, two),
        ):
            assert await two.sio.call("join", "room") == "joined"
            sender = servers[0].sio
            # the receiver's connections drop: what is sent meanwhile waits in its inbox
            proxies[1].cut()
            for n in range(20):
                await sender.emit("n", n, room="room")
            proxies[1].heal()
            await eventually(lambda: len(two.got("n")) == 20, 20, lambda: two.got("n"))
            assert two.got("n") == list(range(20))
            # the sender's drop: its publishes fail (counted), later ones go through
            proxies[0].cut()
            for n in range(20, 22):
                await sender.emit("n", n, room="room")
            proxies[0].heal()
            for n in range(22, 25):
                await sender.emit("n", n, room="room")
            await two.wait_for("n", 24, timeout=20)
            stats = servers[0].manager.stats()
            missing = set(range(25)) - set(two.got("n"))
            assert missing <= {20, 21}, missing
            assert len(missing) <= stats["publish_failures"], stats
            assert stats["publish_failures"] >= 1, stats
    finally:
        for proxy in proxies:
            proxy.close()


async def test_a_server_kicked_off_its_node_attaches_again(redis_url: str, prefix: str) -> None:
    async with (
        socketio_servers([redis_url] * 2, prefix) as servers,
        clients(*servers) as (_, two),
    ):
        assert await two.sio.call("join", "lobby") == "joined"
        manager = servers[1].manager
        assert manager.node is not None
        assert await manager.node.kick(manager.client_id)  # (an operator's kick)
        await eventually(lambda: manager.stats()["reattached"] == 1, 10, manager.stats)
        # its rooms and its sid are routed to it again
        await servers[0].sio.emit("chat", "back?", room="lobby")
        await servers[0].sio.emit("chat", "you?", to=two.sid)
        await two.wait_for("chat", "back?")
        await two.wait_for("chat", "you?")
        assert manager.stats()["rooms_subscribed"] == 3


async def test_servers_may_share_a_node_of_the_caller(standalone: str, keys: Keys) -> None:
    async with router.connect(standalone, node_id="shared", prefix=keys.prefix, **FAST) as node:
        servers = [await start_server(RouterManager(node=node)) for _ in range(2)]
        try:
            async with clients(*servers) as (one, two):
                assert await two.sio.call("join", "lobby") == "joined"
                await servers[0].sio.emit("chat", "next door", room="lobby")
                await two.wait_for("chat", "next door")
                await mark(servers[0], one, two)
                assert one.got("chat") == []
                assert received(servers) == [0, 2]  # (no copy of its own back: no_local)
        finally:
            for server in servers:
                await server.close()
        assert node.running  # (a given node is the caller's to stop)


async def test_a_cut_past_the_ttl_is_counted_and_the_server_comes_back(
    standalone: str, keys: Keys
) -> None:
    port = urlsplit(standalone).port
    assert port is not None
    proxy = Proxy(port)
    urls = [standalone, f"redis://127.0.0.1:{proxy.port}/0"]
    try:
        async with (
            socketio_servers(urls, keys.prefix, redis_timeout=0.5) as servers,
            clients(*servers) as (_, two),
        ):
            assert await two.sio.call("join", "room") == "joined"
            manager, first = servers[1].manager, servers[0].manager
            assert manager.node is not None and first.node is not None
            await eventually(first.node.liveness.steady, 10, "server-1 may purge others")
            proxy.cut()
            # past its TTL (1 s) the node knows it is cut off: what it misses now is counted
            await eventually(lambda: manager.stats()["cut_offs"] == 1, 10, manager.stats)
            proxy.heal()

            async def back() -> bool:  # (registered again: emits reach it again)
                await servers[0].sio.emit("n", "again", room="room")
                return "again" in two.got("n")  # (an emit that got there shows next poll)

            await eventually(back, 20, "an emit reaching server-2 again", poll=0.05)
            assert first.stats()["cut_offs"] == 0
    finally:
        proxy.close()
