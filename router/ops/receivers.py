"""Who would receive a publish to a topic: every node's matching clients, read from Redis.

The route table (a node's mirror, :func:`~router.ops.route_view.explain_match`) says
which nodes would get a copy and by which filters; it does not say which clients. Each
client's subscriptions are in Redis (``rt:{c:ID}:subs``) and its session names its node
(``rt:{c:ID}:session``), so the clients are found by a bounded walk over the clients
with subscriptions, never by asking the other nodes::

    SCAN rt:{c:*}:subs  (pages of PAGE keys)    at most `limit` clients read
      HGETALL each page's subs                  one pipeline a page
      keep the filters matching the topic       (shared ones through their filter part)
      HGETALL the sessions of those that match  the node that serves each, connected or away

A client is listed under its session's node when that node is one the route table names
(a client of a dead node receives nothing until its session is adopted). A plain filter
delivers to every subscriber; a share group ``$share/g/F`` delivers each message to one
of its members, chosen when the message is published: the report gives the group's
members by node and their number, never a chosen one.

The walk reads at most ``limit`` clients (:data:`DEFAULT_LIMIT`) and lists at most
``shown`` per node and per group (:data:`DEFAULT_SHOWN`); ``complete`` is False when it
stopped before it read every client, and the counts are of what it read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from router.core.route_mirror import RouteMirror
from router.core.topics import filter_matches_levels, parse_shared, validate_topic
from router.ops.route_view import MatchReport, explain_match
from router.state.keys import Keys
from router.state.reads import read_each
from router.state.scan import scan_pages
from router.state.scripts import RedisClient
from router.state.session_store import SessionStore
from router.state.subscriptions import SubscriptionStore, unpack_options

DEFAULT_LIMIT: Final = 10_000
"""Clients with subscriptions read at most by one report."""
DEFAULT_SHOWN: Final = 100
"""Clients listed at most per node, and per share group and node."""
PAGE: Final = 500
"""Subscription hashes read per pipeline."""


@dataclass(frozen=True)
class Receiver:
    """A client that would get a copy: by which of its filters, at which QoS (the
    subscription's maximum), and whether it is connected (else its session keeps the
    message until it comes back)."""

    client_id: str
    filter: str
    qos: int
    connected: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "filter": self.filter,
            "qos": self.qos,
            "connected": self.connected,
        }


@dataclass
class MatchedGroup:
    """A matching share group ``$share/{group}/{filter}``: its member count per node as
    the route table holds it (``routes``), and the members found in Redis by node."""

    route: str
    group: str
    filter: str
    routes: dict[str, int]
    members: dict[str, list[str]] = field(default_factory=dict)
    found: int = 0  # members found (``members`` lists at most ``shown`` per node)

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "group": self.group,
            "filter": self.filter,
            "member_count": sum(self.routes.values()),
            "nodes": dict(sorted(self.routes.items())),
            "members": {node: sorted(ids) for node, ids in sorted(self.members.items())},
            "members_found": self.found,
        }


@dataclass
class ReceiversReport:
    """:class:`~router.ops.route_view.MatchReport` with the clients: ``receivers``
    node -> plain subscribers (at most ``shown`` each, by client id), ``receiver_counts``
    node -> how many were found, ``groups`` the matching share groups, ``clients_read``
    the clients whose subscriptions were read, ``complete`` whether they were all."""

    match: MatchReport
    receivers: dict[str, list[Receiver]] = field(default_factory=dict)
    receiver_counts: dict[str, int] = field(default_factory=dict)
    groups: dict[str, MatchedGroup] = field(default_factory=dict)
    clients_read: int = 0
    complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The match report's fields, then ``clients`` (node -> ids of every client that
        would receive, plain subscribers and share-group members), ``receivers``,
        ``receiver_counts``, ``groups`` (sorted by route), ``clients_read``, ``complete``."""
        clients: dict[str, set[str]] = {}
        for node, found in self.receivers.items():
            clients.setdefault(node, set()).update(r.client_id for r in found)
        for group in self.groups.values():
            for node, ids in group.members.items():
                clients.setdefault(node, set()).update(ids)
        return {
            **self.match.as_dict(),
            "clients": {node: sorted(ids) for node, ids in sorted(clients.items())},
            "receivers": {
                node: [r.as_dict() for r in sorted(found, key=lambda r: r.client_id)]
                for node, found in sorted(self.receivers.items())
            },
            "receiver_counts": dict(sorted(self.receiver_counts.items())),
            "groups": [self.groups[route].as_dict() for route in sorted(self.groups)],
            "clients_read": self.clients_read,
            "complete": self.complete,
        }


async def find_receivers(
    redis: RedisClient,
    keys: Keys,
    mirror: RouteMirror,
    topic: str,
    *,
    limit: int = DEFAULT_LIMIT,
    shown: int = DEFAULT_SHOWN,
) -> ReceiversReport:
    """Who would receive a publish to ``topic`` (see the module docstring): the route
    table's answer from ``mirror``, and the clients of every node it names, read from
    Redis. No client is read when no node would get a copy.

    Raises :class:`InvalidTopicError` for an invalid topic name, ``ValueError`` for a
    ``limit`` or ``shown`` below 1, :class:`CorruptStateError` for a subscription or
    session the router did not write, and Redis failures as
    :mod:`router.state.failures` tells them."""
    if limit < 1 or shown < 1:
        raise ValueError(f"limit and shown are at least 1, not {limit!r} and {shown!r}")
    levels = validate_topic(topic).split("/")
    match = explain_match(mirror, topic)
    report = ReceiversReport(match)
    for route, holders in match.shared.items():
        shared = parse_shared(route)
        assert shared is not None  # (explain_match lists share groups only here)
        report.groups[route] = MatchedGroup(route, shared.group, shared.filter, dict(holders))
    nodes = set(match.nodes)
    if not nodes:
        return report
    sessions = SessionStore(redis, keys, SubscriptionStore(redis, keys))
    pattern = keys.client_subscriptions_pattern()
    async for page in scan_pages(redis, pattern, page=PAGE):
        ids = [c for c in (keys.client_of_subscriptions_key(k) for k in page) if c is not None]
        if report.clients_read + len(ids) > limit:
            ids = ids[: limit - report.clients_read]
            report.complete = False
        report.clients_read += len(ids)
        stored = await read_each(redis, "HGETALL", [keys.client_subscriptions(c) for c in ids])
        matching = {
            client_id: found
            for client_id, subs in zip(ids, stored, strict=True)
            if (found := _matching(subs, levels))
        }
        if matching:
            infos = await sessions.describe_many(list(matching))
            for info in infos:
                if info is not None and info.node_id in nodes:
                    _add(report, info.node_id, info.client_id, info.connected, matching, shown)
        if not report.complete:
            break
    return report


def _matching(stored: Any, levels: list[str]) -> list[tuple[str, int]]:
    """The (filter, qos) of a stored subscriptions hash that match the topic's levels."""
    pairs: Sequence[Any] = (
        [item for pair in stored.items() for item in pair]
        if isinstance(stored, Mapping)
        else list(stored or ())
    )
    found = []
    for index in range(0, len(pairs) - 1, 2):
        raw = pairs[index]
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
        shared = parse_shared(text)
        plain = shared.filter if shared is not None else text
        if filter_matches_levels(plain.split("/"), levels):
            found.append((text, unpack_options(bytes(pairs[index + 1])).qos))
    return found


def _add(
    report: ReceiversReport,
    node: str,
    client_id: str,
    connected: bool,
    matching: Mapping[str, list[tuple[str, int]]],
    shown: int,
) -> None:
    plain = [(f, qos) for f, qos in matching[client_id] if parse_shared(f) is None]
    if plain:
        best_filter, best_qos = max(plain, key=lambda pair: pair[1])
        report.receiver_counts[node] = report.receiver_counts.get(node, 0) + 1
        listed = report.receivers.setdefault(node, [])
        if len(listed) < shown:
            listed.append(Receiver(client_id, best_filter, best_qos, connected))
    for route, _ in matching[client_id]:
        group = report.groups.get(route)
        if group is None:  # (shared, but not in the route table: no copy comes by it)
            continue
        group.found += 1
        members = group.members.setdefault(node, [])
        if len(members) < shown:
            members.append(client_id)
