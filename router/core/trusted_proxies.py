"""The proxies whose word on a client's address is taken, and that word in HTTP headers.

Behind a load balancer every connection comes from the balancer. A balancer tells the
client's address in a PROXY protocol header (:mod:`router.core.proxy_header`) or, for
HTTP and WebSocket, in ``X-Forwarded-For`` or ``Forwarded`` (RFC 7239). Anyone can send
either, so it is believed only from the sources an operator names,
:class:`TrustedProxies` (networks in CIDR form; none by default: nothing is trusted).

A forwarded header is a list of hops, the client first and each proxy appending the
address it got the request from; the node's own peer is the last hop. As nginx's
``real_ip_recursive`` does, :meth:`TrustedProxies.client` walks the hops from the right
while they are trusted proxies and takes the first one that is not (a client cannot
forge the hops a trusted proxy appended after its own)::

    peer 127.0.0.1 (trusted), X-Forwarded-For: 198.51.100.9, 203.0.113.7
        -> 203.0.113.7 (unless 203.0.113.7 is trusted too: then 198.51.100.9)

A hop that is not an address (``unknown``, an obfuscated ``_name``, garbage) ends the
walk: the client is then the trusted hop to its right, never a name it supplied.
``Forwarded`` is read when present, else ``X-Forwarded-For``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from router.errors import InvalidSettingError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def normal_address(text: str) -> str | None:
    """``text`` as an IP address in its normal form (an IPv4-mapped IPv6 one as IPv4, the
    brackets and port of ``[v6]:port`` or ``v4:port`` dropped); None if it is none."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


@dataclass(frozen=True)
class TrustedProxies:
    """The networks whose PROXY headers and forwarded headers are believed (empty: none)."""

    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, specs: str | Iterable[str]) -> TrustedProxies:
        """From ``CIDR[,CIDR...]`` (or several such strings; a bare address is its /32 or
        /128). Raises :class:`InvalidSettingError` naming a spec that is no network."""
        items = [specs] if isinstance(specs, str) else list(specs)
        networks: list[Network] = []
        for item in items:
            for spec in filter(None, (part.strip() for part in item.split(","))):
                try:
                    networks.append(ipaddress.ip_network(spec, strict=False))
                except ValueError:
                    raise InvalidSettingError(
                        f"a trusted proxy is a network such as 10.0.0.0/8, not {spec!r}"
                    ) from None
        return cls(tuple(networks))

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __str__(self) -> str:
        return ",".join(str(network) for network in self.networks)

    def trusts(self, host: str | None) -> bool:
        """Whether ``host`` (an address; None or a name: no) is in a trusted network."""
        address = None if host is None else normal_address(host)
        if address is None or not self.networks:
            return False
        ip = ipaddress.ip_address(address)
        return any(ip in network for network in self.networks)

    def client(
        self, peer: str, forwarded: Sequence[str] = (), x_forwarded_for: Sequence[str] = ()
    ) -> str:
        """The client's address of a request from ``peer`` with these ``Forwarded`` and
        ``X-Forwarded-For`` header values (each header's values in order): ``peer`` unless
        it is trusted and a header names hops (see the module docstring)."""
        if not self.trusts(peer):
            return peer
        hops = forwarded_hops(forwarded) if forwarded else _listed(x_forwarded_for)
        client = peer
        for hop in reversed(hops):
            address = normal_address(hop)
            if address is None:
                break
            client = address
            if not self.trusts(address):
                break
        return client


def _listed(values: Sequence[str]) -> list[str]:
    return [hop.strip() for value in values for hop in value.split(",") if hop.strip()]


def forwarded_hops(values: Sequence[str]) -> list[str]:
    """The ``for=`` of each element of RFC 7239 ``Forwarded`` values, in order (an element
    without one is an unknown hop, ``""``); quotes removed, ``[v6]:port`` kept as sent."""
    hops: list[str] = []
    for element in _listed(values):
        hop = ""
        for pair in element.split(";"):
            name, equals, value = pair.partition("=")
            if equals and name.strip().lower() == "for":
                hop = value.strip().strip('"')
        hops.append(hop)
    return hops
