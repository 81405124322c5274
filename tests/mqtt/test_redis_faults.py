"""MQTT clients of a node whose Redis stops answering (issue 14, silent loss 6): a QoS 1
publish is never acknowledged falsely; the client is told the server is busy."""

from __future__ import annotations

from collections.abc import Callable

from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, Paho, mqtt_node, routed_to
from tests.support.servers import RedisServer, stopped


def test_a_qos1_publish_redis_does_not_take_gets_no_puback_and_disconnect_0x89(
    redis_server_factory: Callable[[], RedisServer], keys: Keys, clients: list[Paho]
) -> None:
    server = redis_server_factory()
    env = {"ROUTER_REDIS_URL": server.url, "ROUTER_PREFIX": keys.prefix}
    bounds = ("--redis-timeout", "0.5", "--publish-timeout", "1")
    with mqtt_node("a", env, *bounds) as (_, port_a), mqtt_node("b", env) as (_, port_b):
        subscriber = Paho(port_b, "listener", V5)
        publisher = Paho(port_a, "talker", V5)
        clients += [subscriber, publisher]
        assert subscriber.subscribe("news/#", 1) == [1]
        routed_to(publisher, "news/probe", subscriber)
        with stopped(server):
            info = publisher.client.publish("news/now", b"unanswered", 1)
            assert publisher.disconnects.get(timeout=TIMEOUT) == 0x89
            assert not info.is_published()


def test_a_client_that_connects_while_redis_is_gone_gets_connack_0x88(
    redis_server_factory: Callable[[], RedisServer], keys: Keys, clients: list[Paho]
) -> None:
    """Redis is gone (its process ended: connections refused, not a timeout): the
    session cannot be looked up, and a redis-py error, not a router one, reaches the
    CONNECT; the client gets CONNACK 0x88 (Server unavailable), not a dropped socket
    (found by the cluster fault tests)."""
    server = redis_server_factory()
    env = {"ROUTER_REDIS_URL": server.url, "ROUTER_PREFIX": keys.prefix}
    with mqtt_node("a", env, "--redis-timeout", "0.5") as (_, port_a):
        server.kill()
        latecomer = Paho(port_a, "latecomer", V5, clean=False)
        clients.append(latecomer)
        assert latecomer.connected()[0] == 0x88
