"""A node process from Python (router.ops.node_process, router.ops.node_settings).

``run_node`` runs in a task of the test's event loop against a real Redis, a real MQTT
client talks to it, and setting ``stop`` ends it; settings that cannot work raise typed
errors before anything connects (the Redis URL of those tests answers nowhere: reaching
it would be another error). Last, the collector settings of a process of its own.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.acl import Permission
from router.errors import (
    AclRuleError,
    InvalidIdError,
    InvalidSettingError,
    JwtSettingError,
    NodeSettingError,
    PasswordFileError,
    StaleIncarnationError,
)
from router.mqtt.settings import MqttSettings
from router.ops.auth_sources import AuthSources
from router.ops.node_process import YOUNG_THRESHOLD, ReadyNode, run_node, settle_collector
from router.ops.node_settings import NodeProcessSettings
from router.ops.processes import free_port, listening
from router.state.client_figures import ClientFigureStore
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.node_history import NodeHistoryStore
from router.web.listener import serve_http
from tests.support.cli import delete_namespace
from tests.support.raw_mqtt import RawClient
from tests.support.waiting import eventually

UNREACHABLE = "redis://127.0.0.1:1/0"
TIMEOUT = 30.0


@pytest.fixture
def url(redis_standalone_url: str, keys: Keys) -> Iterator[str]:
    yield redis_standalone_url
    delete_namespace(redis_standalone_url, keys)


def node_settings(url: str, keys: Keys, port: int, **more: Any) -> NodeProcessSettings:
    return NodeProcessSettings(
        redis_url=url,
        prefix=keys.prefix,
        node_id=f"{keys.prefix}-n1",
        heartbeat_interval=0.2,
        heartbeat_ttl=2.0,
        mqtt_listeners=(f"127.0.0.1:{port}",),
        **more,
    )


# -- running ----------------------------------------------------------------------------------


async def test_run_node_serves_mqtt_and_http_until_stopped(
    url: str, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="router")
    port = free_port()
    settings = node_settings(url, keys, port, metrics="127.0.0.1:0")
    stop = asyncio.Event()
    ready: list[ReadyNode] = []
    task = asyncio.create_task(run_node(settings, stop, http=serve_http, on_ready=ready.append))
    await eventually(lambda: bool(ready) or task.done(), TIMEOUT, "the node to be ready")
    [up] = ready
    assert up.node.node_id == settings.node_id
    assert up.mqtt.listeners == [("mqtt", "127.0.0.1", port)]
    assert up.metrics is not None and up.http is None

    subscriber = await RawClient.connect(port, "sub", clean_start=True, expiry=0)
    publisher = await RawClient.connect(port, "pub", clean_start=True, expiry=0)
    await subscriber.subscribe("t/#", 0)
    await publisher.publish_now("t/x", b"hello")
    [message] = await subscriber.take(1)
    assert (message.topic, message.payload) == ("t/x", b"hello")
    async with (
        aiohttp.ClientSession() as session,
        session.get("http://{}:{}/healthz".format(*up.metrics)) as reply,
    ):
        assert reply.status == 200

    stop.set()
    async with asyncio.timeout(TIMEOUT):
        assert await task is None  # ended cleanly
        for client in (subscriber, publisher):
            await client.closed()  # the listener ended its connections on the way out
            client.drop()
            await client.writer.wait_closed()
    assert not listening(port)
    said = [record.getMessage() for record in caplog.records]
    node_id = settings.node_id
    for line in (f"MQTT on 127.0.0.1:{port}", f"node {node_id} ready", f"node {node_id} stopping"):
        assert line in said
    assert any(line.startswith(f"node {node_id} stopped: ") for line in said)
    assert said.index(f"node {node_id} ready") > said.index(f"MQTT on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("sources", "jwt", "kind"),
    [
        (AuthSources(Permission.DENY, shared=True), True, "redis"),
        (AuthSources(Permission.DENY, emqx_url="redis://x"), False, "emqx"),
        (AuthSources(Permission.DENY, acl_file="acl"), True, "files"),
        (AuthSources(Permission.DENY), True, "jwt"),
        (AuthSources(Permission.DENY), False, "none"),
    ],
)
def test_a_nodes_auth_sources_say_where_its_users_and_rules_come_from(
    sources: AuthSources, jwt: bool, kind: str
) -> None:
    assert sources.kind(jwt=jwt) == kind


@pytest.mark.parametrize(("given", "told"), [({"auth_redis": True}, "redis"), ({}, "none")])
async def test_run_node_tells_the_cluster_where_its_users_and_rules_come_from(
    url: str, keys: Keys, given: dict[str, Any], told: str
) -> None:
    """What the dashboard's Users & ACL page says is enforced comes from this: the
    node's telemetry names its source (``redis`` only with ``--auth-redis``)."""
    settings = node_settings(url, keys, free_port(), http="127.0.0.1:0", **given)
    stop = asyncio.Event()
    ready: list[ReadyNode] = []
    task = asyncio.create_task(run_node(settings, stop, http=serve_http, on_ready=ready.append))
    try:
        await eventually(lambda: bool(ready) or task.done(), TIMEOUT, "the node to be ready")
        redis = ready[0].node.registry.redis
        store = NodeHistoryStore(redis, keys)

        async def says() -> bool:
            record = (await store.read([settings.node_id]))[settings.node_id]
            return record.telemetry is not None and record.telemetry.auth == told

        await eventually(says, TIMEOUT, f"the node's telemetry to say auth {told}")
    finally:
        stop.set()
        async with asyncio.timeout(TIMEOUT):
            await task


async def test_a_node_without_http_publishes_its_figures_and_its_clients(
    url: str, keys: Keys
) -> None:
    """Another node's dashboard shows this one: a node run without ``--http`` samples
    its figures, names its listeners and publishes its clients' figures all the same."""
    port = free_port()
    settings = node_settings(url, keys, port)
    stop = asyncio.Event()
    ready: list[ReadyNode] = []
    task = asyncio.create_task(run_node(settings, stop, on_ready=ready.append))
    try:
        await eventually(lambda: bool(ready) or task.done(), TIMEOUT, "the node to be ready")
        client = await RawClient.connect(port, "device-1", clean_start=True, expiry=0)
        await client.publish_now("t/x", b"hello")
        redis = ready[0].node.registry.redis
        store, figures = NodeHistoryStore(redis, keys), ClientFigureStore(redis, keys)

        async def published() -> bool:
            record = (await store.read([settings.node_id]))[settings.node_id]
            told = await figures.clients({settings.node_id: ["device-1"]})
            return (
                record.telemetry is not None
                and record.telemetry.listeners == (f"mqtt://127.0.0.1:{port}",)
                and "device-1" in told
                and told["device-1"].received == 1
            )

        await eventually(published, TIMEOUT, "the node's figures and its client's")
        client.drop()
    finally:
        stop.set()
        async with asyncio.timeout(TIMEOUT):
            await task


async def test_run_node_raises_when_another_process_takes_its_id(url: str, keys: Keys) -> None:
    settings = node_settings(url, keys, free_port())
    ready: list[ReadyNode] = []
    task = asyncio.create_task(run_node(settings, on_ready=ready.append))
    await eventually(lambda: bool(ready) or task.done(), TIMEOUT, "the node to be ready")
    redis = await open_redis(url)
    try:
        assert settings.node_id is not None
        usurper = RouterNode(redis, NodeConfig(settings.node_id, prefix=keys.prefix))
        await usurper.registry.register(settings.node_id, "another-incarnation")
        async with asyncio.timeout(TIMEOUT):
            with pytest.raises(StaleIncarnationError, match="taken over by another process"):
                await task
    finally:
        await redis.aclose()


# -- settings that cannot work --------------------------------------------------------------

ANONYMOUS_OFF = MqttSettings(allow_anonymous=False)
ANY_PORT = ("127.0.0.1:0",)
TLS_FILES = ("tls_cert", "tls_key")
FILES = ("password_file", "acl_file")
HTTP_TLS = ("http", "http_tls_cert", "http_tls_key")
EMQX = {"emqx_url": "redis://x", "emqx_password_hash": "plain"}
AUTHENTICATORS = ("password_file", "auth_redis", "emqx_url", "jwt_secret", "jwt_public_key")


@pytest.mark.parametrize(
    ("given", "setting", "others"),
    [
        ({"heartbeat_interval": 2, "heartbeat_ttl": 1}, "heartbeat_ttl", ("heartbeat_interval",)),
        ({"mqtt": ANONYMOUS_OFF}, "mqtt.allow_anonymous", AUTHENTICATORS),
        ({"tls_listeners": ANY_PORT}, "tls_listeners", TLS_FILES),
        ({"tls_listeners": ANY_PORT, "tls_cert": "c.pem"}, "tls_listeners", TLS_FILES),
        ({"auth_redis": True, "acl_file": "acl"}, "auth_redis", FILES),
        ({"emqx_url": "redis://x", "password_file": "p"}, "emqx_url", FILES),
        ({"auth_redis": True, **EMQX}, "auth_redis", FILES),
        ({"emqx_password_hash": "plain"}, "emqx_password_hash", ("emqx_url",)),
        ({"emqx_url": "redis://x"}, "emqx_password_hash", ("emqx_url",)),
        ({"http_tls_cert": "c.pem", "http_tls_key": "k.pem"}, "http_tls_cert", HTTP_TLS),
        ({"http": "127.0.0.1:0", "http_tls_cert": "c.pem"}, "http_tls_cert", HTTP_TLS),
        ({"heartbeat_interval": 0}, "heartbeat_interval", ()),
        ({"redis_timeout": float("nan")}, "redis_timeout", ()),
        ({"publish_timeout": True}, "publish_timeout", ()),
        ({"redis_pool_size": 0}, "redis_pool_size", ()),
        ({"queue_limit": 1.5}, "queue_limit", ()),
        ({"queue_bytes": -1}, "queue_bytes", ()),
        ({"max_queued": 0}, "max_queued", ()),
        ({"traffic_sample": 0.0}, "traffic_sample", ()),
        ({"traffic_sample": 1.5}, "traffic_sample", ()),
        ({"jwt_leeway": -1}, "jwt_leeway", ()),
        ({"share_strategy": "nearest{0}"}, "share_strategy", ()),
        ({"acl_default": "maybe"}, "acl_default", ()),
        ({"log_level": "LOUD"}, "log_level", ()),
        ({"mqtt_listeners": "127.0.0.1:1883"}, "mqtt_listeners", ()),
        ({"retained": {"max_count": 1}}, "retained", ()),
        ({"http_proxy_trusted": "127.0.0.1"}, "http_proxy_trusted", ()),
    ],
)
def test_settings_that_cannot_work_name_the_setting(
    given: dict[str, Any], setting: str, others: tuple[str, ...]
) -> None:
    with pytest.raises(NodeSettingError) as caught:
        NodeProcessSettings(redis_url=UNREACHABLE, **given)
    error = caught.value
    assert (error.setting, error.others) == (setting, others)
    assert isinstance(error, InvalidSettingError) and isinstance(error, ValueError)
    assert str(error).startswith(f"{setting}: ")
    for other in others:
        assert other in str(error)


def test_a_front_end_names_the_other_settings_its_own_way() -> None:
    with pytest.raises(NodeSettingError) as caught:
        NodeProcessSettings(heartbeat_interval=2.0, heartbeat_ttl=1.0)
    assert str(caught.value) == "heartbeat_ttl: must be longer than heartbeat_interval"
    as_option = caught.value.explain(lambda name: "--" + name.replace("_", "-"))
    assert as_option == "must be longer than --heartbeat-interval"


@pytest.mark.parametrize(
    ("given", "error", "text"),
    [
        ({"mqtt_listeners": ("localhost",)}, InvalidSettingError, "HOST:PORT"),
        ({"http": "nowhere"}, InvalidSettingError, "HOST:PORT"),
        ({"prefix": "a{b"}, InvalidIdError, "prefix"),
        ({"node_id": ""}, InvalidIdError, "node id"),
    ],
)
def test_bad_addresses_and_names_raise_the_librarys_errors(
    given: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        NodeProcessSettings(redis_url=UNREACHABLE, **given)


def test_settings_take_lists_keep_tuples_and_hide_secrets() -> None:
    settings = NodeProcessSettings(
        redis_url="redis://user:hunter2@127.0.0.1:6379/0",
        mqtt_listeners=["127.0.0.1:0"],  # type: ignore[arg-type]
        jwt_secret="s" * 32,
    )
    assert settings.mqtt_listeners == ("127.0.0.1:0",)
    assert "hunter2" not in repr(settings) and "s" * 32 not in repr(settings)
    assert settings.connect_options()["heartbeat_ttl"] == settings.heartbeat_ttl
    assert NodeProcessSettings(log_level="debug").log_level == "debug"  # (any case)


@pytest.mark.parametrize(
    ("given", "error", "text"),
    [
        ({"password_file": "MISSING"}, PasswordFileError, "MISSING"),
        ({"acl_file": "BAD_ACL"}, AclRuleError, ":1: "),
        ({"acl_default": "allow"}, AclRuleError, "needs an ACL"),
        ({"jwt_public_key": "MISSING"}, JwtSettingError, "cannot read the JWT public key"),
        ({"jwt_secret": "short"}, JwtSettingError, "at least 32 bytes"),
        (
            {"tls_listeners": ("127.0.0.1:0",), "tls_cert": "MISSING", "tls_key": "MISSING"},
            InvalidSettingError,
            "TLS certificate",
        ),
        ({"emqx_url": UNREACHABLE, "emqx_password_hash": "rot13"}, InvalidSettingError, "rot13"),
        ({"metrics": "127.0.0.1:0"}, InvalidSettingError, "serve_http"),
    ],
)
async def test_files_that_cannot_be_used_fail_before_anything_connects(
    tmp_path: Path, given: dict[str, Any], error: type[Exception], text: str
) -> None:
    missing, bad_acl = tmp_path / "missing", tmp_path / "acl.conf"
    bad_acl.write_text("allow everyone\n")
    paths = {"MISSING": str(missing), "BAD_ACL": str(bad_acl)}
    given = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in given.items()}
    settings = NodeProcessSettings(redis_url=UNREACHABLE, **given)
    with pytest.raises(error, match=text.replace("MISSING", str(missing))):
        await run_node(settings)  # (no http argument)


# -- the collector of a process of its own ---------------------------------------------------


def test_objects_alive_when_settled_leave_the_collectors_scans() -> None:
    kept = [object()]
    threshold = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_freeze_count() > 0
        assert not any(obj is kept for obj in gc.get_objects())
        later = [object()]
        assert any(obj is later for obj in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert any(obj is kept for obj in gc.get_objects())


def test_the_young_generation_is_collected_rarely_and_the_older_ones_as_before() -> None:
    threshold = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, threshold[1], threshold[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
