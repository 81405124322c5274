"""The routing report as plain values: what the Spark job and the plain-Python peer return.

Definitions (one *publish* is one traffic-log record, one *copy* one message sent from a
publishing node to another node's inbox):

* **per node**: publishes a node routed and their payload bytes, copies it sent to other
  nodes and their bytes, copies other nodes sent to it and their bytes, and the copies it
  queued for its own clients (``local_deliveries`` of the log);
* **fan-out**: the subscribers a publish reaches in the subscription snapshot (distinct
  plain subscribers plus one member per matching share group), as a histogram
  ``subscribers -> publishes``; **node fan-out** the same for the nodes a publish was
  forwarded to (from the log);
* **savings**: copies and bytes sent by interest-based routing (the log) against
  broadcasting every publish to every other node (``nodes - 1`` copies each, ``nodes``
  being the nodes seen in the log unless given);
* **hot topics**: topics by publishes, then by name;
* **filter cost**: what matching a filter costs the router: ``deliveries`` is the copies it
  produces (a plain filter: its subscribers for every publish it matches; a share group:
  one), with the publishes it matched and the payload bytes delivered; ordered by
  deliveries, then by filter;
* **no subscriber**: publishes whose topic matches no subscription of the snapshot
  (``unrouted_messages`` counts the log's own view: publishes neither forwarded nor
  delivered locally).

Lists are capped at the report's ``top`` entries; the Parquet tables of the Spark job hold
every row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeTraffic:
    """One node's share of the traffic (see the module docstring)."""

    node: str
    published: int
    published_bytes: int
    sent_copies: int
    sent_bytes: int
    received_copies: int
    received_bytes: int
    local_deliveries: int


@dataclass(frozen=True, slots=True)
class Savings:
    """Interest-based routing against broadcasting to all ``nodes``."""

    nodes: int
    messages: int
    interest_copies: int
    interest_bytes: int
    broadcast_copies: int
    broadcast_bytes: int

    @property
    def saved_copies(self) -> int:
        return self.broadcast_copies - self.interest_copies

    @property
    def saved_bytes(self) -> int:
        return self.broadcast_bytes - self.interest_bytes

    @property
    def saved_fraction(self) -> float:
        """Saved copies over broadcast copies (0.0 when broadcasting sends nothing)."""
        return self.saved_copies / self.broadcast_copies if self.broadcast_copies else 0.0


@dataclass(frozen=True, slots=True)
class TopicTraffic:
    """Publishes and payload bytes of one topic, and the subscribers each reached."""

    topic: str
    messages: int
    bytes: int
    subscribers: int


@dataclass(frozen=True, slots=True)
class FilterCost:
    """What one filter of the snapshot cost (see the module docstring)."""

    filter: str
    subscribers: int
    messages: int
    deliveries: int
    delivered_bytes: int


@dataclass(frozen=True, slots=True)
class Report:
    """The whole report; ``fanout`` and ``node_fanout`` map a count to publishes."""

    messages: int
    bytes: int
    topics: int
    subscriptions: int
    ignored_subscriptions: int
    per_node: tuple[NodeTraffic, ...]
    fanout: dict[int, int]
    node_fanout: dict[int, int]
    savings: Savings
    hot_topics: tuple[TopicTraffic, ...]
    filter_cost: tuple[FilterCost, ...]
    no_subscriber_messages: int
    no_subscriber_topics: tuple[TopicTraffic, ...]
    unrouted_messages: int


def broadcast_savings(
    nodes: int, messages: int, total_bytes: int, copies: int, copy_bytes: int
) -> Savings:
    """:class:`Savings` of ``messages`` publishes (``total_bytes`` of payload) that sent
    ``copies`` copies (``copy_bytes``) in a cluster of ``nodes``."""
    others = max(nodes - 1, 0)
    return Savings(nodes, messages, copies, copy_bytes, messages * others, total_bytes * others)
