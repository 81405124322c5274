"""The topic aliases of MQTT connections, mirrored to Redis (:mod:`router.mqtt.alias_mirror`)
and shown by ``router aliases CLIENT``: both namespaces within a deadline, gone when the
connection ends, a new connection starting empty, a takeover on another node keeping the
new connection's aliases, and Redis failing a write (counted, the connection unharmed).

In process: nodes on the session's real redis-server, the MQTT servers of
:func:`router.mqtt.serve`, real paho-mqtt 5.0 clients (their own threads), the CLI through
CliRunner (in a thread: it runs an event loop of its own)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import pytest

from router.errors import RouterError, StateUnavailableError
from router.mqtt.server import MqttServer, serve
from router.mqtt.settings import MqttSettings
from router.ops.metrics import NodeCollector
from router.state.alias_store import RedisAliasTable
from router.state.keys import Keys
from tests.support.cli import invoke
from tests.support.mqtt import Paho, connect_properties, publish_properties
from tests.support.nodes import StartNode
from tests.support.waiting import eventually

if TYPE_CHECKING:
    from router.state.alias_store import AliasCopy

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)

WAIT = 10.0  # (a flush every second: well within)
EMPTY: dict[str, list[Any]] = {"client": [], "server": []}
Serve = Callable[[str], Awaitable[MqttServer]]


@pytest.fixture
async def served(start_node: StartNode) -> AsyncIterator[Serve]:
    """``await served(node_id)``: a node with an MQTT listener, closed after the test."""
    async with AsyncExitStack() as stack:

        async def start(node_id: str) -> MqttServer:
            node = await start_node(node_id)
            return await stack.enter_async_context(serve(node, ["127.0.0.1:0"], MqttSettings()))

        yield start


@pytest.fixture
async def paho() -> AsyncIterator[Callable[..., Awaitable[Paho]]]:
    """``await paho(server, client_id, **options)``: a connected 5.0 client that allows 10
    topic aliases from the server, a session of 300 s; closed after the test."""
    made: list[Paho] = []

    async def connect(server: MqttServer, client_id: str, clean: bool = True) -> Paho:
        properties = connect_properties(SessionExpiryInterval=300, TopicAliasMaximum=10)
        port = server.addresses[0][1]
        client = await asyncio.to_thread(Paho, port, client_id, clean=clean, properties=properties)
        client.client.reconnect_delay_set(3600, 3600)  # (taken over: it stays away)
        made.append(client)
        code, _ = await asyncio.to_thread(client.connected)
        assert code == 0
        return client

    try:
        yield connect
    finally:
        for client in made:
            await asyncio.to_thread(client.close)


def shown(url: str, keys: Keys, client_id: str) -> dict[str, Any]:
    """What ``router aliases CLIENT --json`` shows (a client it does not know: EMPTY)."""
    result = invoke(url, keys.prefix, "aliases", client_id, "--json")
    if result.exit_code == 1 and "has no session" in result.stderr:
        return EMPTY
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.stdout)
    return found


async def until_shown(url: str, keys: Keys, client_id: str, expected: dict[str, Any]) -> None:
    async def held() -> bool:
        return await asyncio.to_thread(shown, url, keys, client_id) == expected

    await eventually(held, WAIT, f"router aliases {client_id} shows {expected}")


async def publish(client: Paho, topic: str, alias: int, qos: int = 1) -> None:
    properties = publish_properties(TopicAlias=alias)
    await asyncio.to_thread(client.publish, topic, b"x", qos, properties=properties)


def table(*pairs: tuple[int, str]) -> list[dict[str, Any]]:
    return [{"alias": alias, "topic": topic} for alias, topic in pairs]


async def test_both_namespaces_are_shown_and_gone_with_the_connection(
    served: Serve, paho: Callable[..., Awaitable[Paho]], redis_standalone_url: str, keys: Keys
) -> None:
    url = redis_standalone_url
    server = await served("a")
    client = await paho(server, "aliased")
    assert await asyncio.to_thread(client.subscribe, "t/#", 1) == [1]
    await publish(client, "t/a", 1)  # (binds inbound 1; its copy comes back with outbound 1)
    await until_shown(
        url, keys, "aliased", {"client": table((1, "t/a")), "server": table((1, "t/a"))}
    )
    await publish(client, "t/b", 1)  # (the client re-maps alias 1; t/b gets outbound 2)
    await publish(client, "t/c", 3)
    expected = {
        "client": table((1, "t/b"), (3, "t/c")),
        "server": table((1, "t/a"), (2, "t/b"), (3, "t/c")),
    }
    await until_shown(url, keys, "aliased", expected)
    assert server.stats()["mqtt_alias_writes"] >= 2
    await asyncio.to_thread(client.close)
    await until_shown(url, keys, "aliased", EMPTY)
    result = await asyncio.to_thread(invoke, url, keys.prefix, "aliases", "aliased")
    assert result.exit_code == 0, result.output  # (its session stays, 300 s: known, no alias)


async def test_a_resumed_session_starts_with_empty_tables(
    served: Serve,
    paho: Callable[..., Awaitable[Paho]],
    redis_standalone_url: str,
    keys: Keys,
    redis_client: Any,
) -> None:
    """What an earlier connection left (its node died before it forgot them, say) is
    cleared by the next connection, which binds its own."""
    url = redis_standalone_url
    server = await served("a")
    first = await paho(server, "back")
    await asyncio.to_thread(first.close)
    await until_shown(url, keys, "back", EMPTY)
    left = RedisAliasTable(redis_client, keys)
    await left.bind("back", "client", 5, "left/over")
    await left.bind("back", "server", 6, "left/out")
    again = await paho(server, "back", clean=False)
    assert again.sessions_present.get(timeout=WAIT)
    await until_shown(url, keys, "back", EMPTY)
    await publish(again, "mine/now", 2)
    await until_shown(url, keys, "back", {"client": table((2, "mine/now")), "server": []})


async def test_a_takeover_on_another_node_keeps_the_new_connections_aliases(
    served: Serve, paho: Callable[..., Awaitable[Paho]], redis_standalone_url: str, keys: Keys
) -> None:
    url = redis_standalone_url
    server_a, server_b = await served("a"), await served("b")
    old = await paho(server_a, "moving")
    await publish(old, "old/topic", 1)
    await until_shown(url, keys, "moving", {"client": table((1, "old/topic")), "server": []})
    new = await paho(server_b, "moving", clean=False)  # (takes the session over from a)
    await publish(new, "new/topic", 2)
    expected = {"client": table((2, "new/topic")), "server": []}
    await until_shown(url, keys, "moving", expected)

    await eventually(lambda: server_a.owner("moving") is None, WAIT, "a lets the client go")
    await server_a.aliases.flush()  # (after a's flush under way: what a's end asked is done)
    assert server_a.stats()["mqtt_alias_clients_marked"] == 0
    assert await asyncio.to_thread(shown, url, keys, "moving") == expected
    assert server_a.stats()["mqtt_alias_write_failures"] == 0


class FailingStore:
    """Stands in front of the mirror's store: while ``failing``, Redis is unavailable."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.failing = True

    async def mirror(self, copies: list[AliasCopy]) -> list[int | RouterError]:
        if self.failing:
            raise StateUnavailableError("injected: Redis cannot be reached")
        result: list[int | RouterError] = await self.store.mirror(copies)
        return result


async def test_redis_failing_a_write_is_counted_and_retried_and_the_connection_goes_on(
    served: Serve, paho: Callable[..., Awaitable[Paho]], redis_standalone_url: str, keys: Keys
) -> None:
    url = redis_standalone_url
    server = await served("a")
    store = FailingStore(server.aliases.store)
    server.aliases.store = store
    client = await paho(server, "unlucky")
    assert await asyncio.to_thread(client.subscribe, "u/#", 1) == [1]
    await publish(client, "u/1", 1)
    await eventually(lambda: server.stats()["mqtt_alias_write_failures"] >= 2, WAIT, server.stats)
    await publish(client, "u/2", 2)  # (the connection goes on: PUBACK, and the copy back)
    assert [m.payload for m in await asyncio.to_thread(client.take, 2)] == [b"x", b"x"]
    assert client.disconnects.empty() and server.owner("unlucky") is not None
    families = {family.name: family for family in NodeCollector(server.node, server).collect()}
    [sample] = families["router_mqtt_alias_write_failures"].samples
    assert sample.value >= 2
    store.failing = False  # (Redis is back: the next interval writes what is marked)
    expected = {"client": table((1, "u/1"), (2, "u/2")), "server": table((1, "u/1"), (2, "u/2"))}
    await until_shown(url, keys, "unlucky", expected)
