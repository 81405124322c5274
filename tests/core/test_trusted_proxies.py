"""Trusted proxies and forwarded headers (router.core.trusted_proxies): the right-most
untrusted hop, as nginx's real_ip_recursive picks it."""

from __future__ import annotations

import pytest

from router.core.trusted_proxies import TrustedProxies, forwarded_hops, normal_address
from router.errors import InvalidSettingError

LB = TrustedProxies.parse("127.0.0.0/8, ::1,10.0.0.0/8")


@pytest.mark.parametrize(
    ("peer", "forwarded", "x_forwarded_for", "client"),
    [
        ("127.0.0.1", [], ["203.0.113.7"], "203.0.113.7"),
        ("127.0.0.1", [], ["198.51.100.9, 203.0.113.7"], "203.0.113.7"),
        ("127.0.0.1", [], ["198.51.100.9, 10.1.1.1"], "198.51.100.9"),  # two trusted hops
        ("127.0.0.1", [], ["198.51.100.9", "10.1.1.1"], "198.51.100.9"),  # header repeated
        ("127.0.0.1", [], ["10.1.1.1, 10.2.2.2"], "10.1.1.1"),  # all trusted: the left-most
        ("203.0.113.7", [], ["198.51.100.9"], "203.0.113.7"),  # untrusted peer: no word taken
        ("127.0.0.1", [], [], "127.0.0.1"),
        ("127.0.0.1", [], ["unknown, 10.1.1.1"], "10.1.1.1"),  # a name ends the walk
        ("127.0.0.1", [], ["garbage"], "127.0.0.1"),
        ("127.0.0.1", [], ["[2001:db8::7]:4711"], "2001:db8::7"),
        ("127.0.0.1", [], ["192.0.2.60:4711"], "192.0.2.60"),
        ("127.0.0.1", [], ["::ffff:192.0.2.60"], "192.0.2.60"),
        ("::ffff:127.0.0.1", [], ["192.0.2.60"], "192.0.2.60"),
        (
            "127.0.0.1",
            ['for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"'],
            ["198.51.100.1"],  # Forwarded wins over X-Forwarded-For
            "2001:db8:cafe::17",
        ),
        ("127.0.0.1", ["for=_hidden, for=10.0.0.5"], [], "10.0.0.5"),
        ("127.0.0.1", ["proto=https"], [], "127.0.0.1"),  # no for=: an unknown hop
    ],
)
def test_the_client_is_the_right_most_untrusted_hop(
    peer: str, forwarded: list[str], x_forwarded_for: list[str], client: str
) -> None:
    assert LB.client(peer, forwarded, x_forwarded_for) == client


def test_nothing_is_trusted_by_default() -> None:
    assert not TrustedProxies()
    assert not TrustedProxies().trusts("127.0.0.1")
    assert TrustedProxies().client("127.0.0.1", [], ["203.0.113.7"]) == "127.0.0.1"


@pytest.mark.parametrize("spec", ["10.0.0.0/33", "example.org", "10.0.0.0/8,,nope"])
def test_a_bad_network_is_a_typed_error(spec: str) -> None:
    with pytest.raises(InvalidSettingError, match="trusted proxy"):
        TrustedProxies.parse(spec)


def test_networks_are_shown_as_given() -> None:
    assert str(TrustedProxies.parse(["127.0.0.1", "fd00::/8"])) == "127.0.0.1/32,fd00::/8"
    assert forwarded_hops(['For="[::1]:80";proto=http', "by=x"]) == ["[::1]:80", ""]
    assert normal_address("localhost") is None
