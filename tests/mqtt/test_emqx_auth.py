"""Users and ACL entries where EMQX keeps them in Redis (``mqtt_user:NAME``,
``mqtt_acl:NAME``): the hashes EMQX's documented algorithms make, checked against
published vectors, and a ``router node run --auth-emqx-redis`` process judging paho-mqtt
clients by entries written as EMQX's documentation writes them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from router.cli import app
from router.cluster.emqx_auth import EmqxPasswordHash
from router.errors import InvalidSettingError
from router.state.keys import Keys
from tests.support.mqtt import V5, V311, Paho, mqtt_node

EMQX_U_HASH = "44edc2d57cde8d79c98145003e105b90a14f1460b79186ea9cfe83942fc5abb5"


@pytest.mark.parametrize(
    ("spec", "password", "stored", "salt"),
    [
        # EMQX's documentation: user emqx_u, password public, salt slat_foo123, sha256 suffix.
        ("sha256,suffix", b"public", EMQX_U_HASH, "slat_foo123"),
        ("md5,disable", b"password", "5f4dcc3b5aa765d61d8327deb882cf99", ""),
        ("sha", b"password", "5baa61e4c9b93f3f0682250b6cf8331b7ee68fd8", ""),  # (no salt given)
        # RFC 6070, PBKDF2-HMAC-SHA1, c = 4096, dkLen = 20.
        ("pbkdf2,sha,4096,20", b"password", "4b007901b765489abead49d926f721d065a429c1", "salt"),
        # OpenBSD's bcrypt test vector ("U*U", cost 5).
        ("bcrypt", b"U*U", "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW", ""),
        ("plain", b"public", "public", ""),
    ],
)
def test_emqx_hashes_check_published_vectors(
    spec: str, password: bytes, stored: str, salt: str
) -> None:
    algorithm = EmqxPasswordHash.parse(spec)
    assert algorithm.verify(password, stored, salt)
    assert not algorithm.verify(password + b"x", stored, salt)
    assert not algorithm.verify(password, "0" * len(stored), salt)


@pytest.mark.parametrize("spec", ["", "sha256,middle", "pbkdf2,md4,10", "pbkdf2,sha256,0", "rot13"])
def test_bad_hash_specs_are_refused(spec: str) -> None:
    with pytest.raises(InvalidSettingError):
        EmqxPasswordHash.parse(spec)


USER = "emqx_u"
ACL = {"t/${username}/#": "publish", "t/in": "subscribe", "t/both": "all", "t/bad/#/x": "all"}


@pytest.fixture
def emqx_data(redis_standalone_url: str, keys: Keys) -> Iterator[str]:
    """EMQX's documented user, a superuser and ACL entries, in the standalone Redis."""
    client = redis.Redis.from_url(redis_standalone_url)
    written = [f"mqtt_user:{USER}", "mqtt_user:admin", f"mqtt_acl:{USER}"]
    try:
        documented = {"is_superuser": "0", "salt": "slat_foo123", "password_hash": EMQX_U_HASH}
        client.hset(written[0], mapping=documented)
        admin_hash = hashlib.sha256(b"pw").hexdigest()  # (no salt: sha256 of the password)
        client.hset(written[1], mapping={"password": admin_hash, "is_superuser": "true"})
        client.hset(written[2], mapping=ACL)
        yield redis_standalone_url
    finally:
        client.delete(*written)
        client.close()


@pytest.fixture
def port(emqx_data: str, keys: Keys) -> Iterator[int]:
    env = {"ROUTER_REDIS_URL": emqx_data, "ROUTER_PREFIX": keys.prefix}
    options = ("--auth-emqx-redis", emqx_data, "--emqx-password-hash", "sha256,suffix")
    with mqtt_node("emqx", env, *options, "--no-allow-anonymous") as (_, node_port):
        yield node_port


def test_emqx_users_and_acl_entries_judge_mqtt_clients(port: int) -> None:
    for protocol, password, expected in ((V5, "public", 0), (V311, "public", 0), (V5, "x", 0x86)):
        probe = Paho(port, f"probe-{protocol}", protocol, user=(USER, password))
        try:
            assert probe.connected()[0] == expected
        finally:
            probe.close()
    client = Paho(port, "emqx-app", V5, user=(USER, "public"))
    admin = Paho(port, "admin-app", V5, user=("admin", "pw"))  # (in EMQX 4's field)
    try:
        assert client.connected()[0] == 0 and admin.connected()[0] == 0
        assert client.subscribe("t/in", 1) == [1]
        assert client.subscribe("t/both", 1) == [1]
        assert client.subscribe("t/emqx_u/x", 1) == [0x87]  # (publish only)
        assert admin.subscribe("#", 1) == [1]  # (a superuser)
        client.publish("t/emqx_u/data", b"mine", 1)
        client.publish("t/other", b"not mine", 1)  # (PUBACK 0x87: not delivered)
        client.publish("t/both", b"both", 1)
        got = sorted((m.topic, m.payload) for m in admin.take(2))
        assert got == [("t/both", b"both"), ("t/emqx_u/data", b"mine")]
        assert [(m.topic, m.payload) for m in client.take(1)] == [("t/both", b"both")]
        assert admin.nothing_more()
    finally:
        client.close()
        admin.close()


def test_the_emqx_source_excludes_the_others_in_one_error_line() -> None:
    for args in (
        ["--auth-emqx-redis", "redis://127.0.0.1:1", "--acl", "acl.conf"],
        ["--auth-emqx-redis", "redis://127.0.0.1:1"],
        ["--auth-emqx-redis", "redis://127.0.0.1:1", "--emqx-password-hash", "rot13"],
    ):
        result = CliRunner().invoke(app, ["node", "run", *args])
        errors = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert result.exit_code != 0 and len(errors) == 1
        assert "Traceback" not in result.output
