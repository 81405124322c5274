"""Messages as they travel: what a publisher sent, and what one client receives.

A :class:`Message` is what crosses between nodes (packed with msgpack into an inbox
channel); a :class:`Delivery` is one client's copy, with the QoS and retain flag that MQTT
gives that client's subscription.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from router.errors import RouterError


class MalformedMessageError(RouterError, ValueError):
    """A packed message or batch that this router did not write."""


@dataclass(frozen=True, slots=True)
class Message:
    """One publish: ``id`` (16 bytes, unique cluster-wide), ``topic``, ``payload`` bytes,
    ``qos`` 0..2, ``retain``, the publishing client (if any) and the monotonic clock
    reading when it was published (for latency measurements on one machine)."""

    id: bytes
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    publisher: str | None = None
    sent_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One client's copy of a message.

    ``qos`` is min(message QoS, the best matching subscription's QoS); ``retain`` is the
    message's flag only where a matching subscription asked for retain-as-published (or
    the copy comes from the retained store); ``subscription_ids`` lists the MQTT 5
    subscription identifiers of the matching subscriptions; ``expiry_interval`` is the
    seconds the message has left (set on copies from the retained store), None for never.
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool
    message_id: bytes
    publisher: str | None = None
    subscription_ids: tuple[int, ...] = ()
    sent_at: float = 0.0
    expiry_interval: int | None = None


@dataclass(frozen=True, slots=True)
class Forward:
    """A message as sent to one node: the message, the share groups that node serves, and
    the nodes that already failed to serve those groups (a re-dispatch skips them)."""

    message: Message
    groups: tuple[str, ...] = ()
    tried: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Takeover:
    """A notice for the node that served a client's session before: another node took the
    session of ``client_id`` over with owner epoch ``epoch`` (MQTT-3.1.4-3)."""

    client_id: str
    epoch: int


def pack_takeover(notice: Takeover) -> bytes:
    """Pack a takeover notice into one inbox record (read back by :func:`unpack_record`)."""
    packed: bytes = msgpack.packb({"takeover": [notice.client_id, notice.epoch]}, use_bin_type=True)
    return packed


def pack_batch(forwards: list[Forward]) -> bytes:
    """Pack forwards for one node's inbox into one binary record."""
    packed: bytes = msgpack.packb(
        [
            [
                f.message.id,
                f.message.topic,
                f.message.payload,
                f.message.qos,
                f.message.retain,
                f.message.publisher,
                f.message.sent_at,
                list(f.groups),
                list(f.tried),
            ]
            for f in forwards
        ],
        use_bin_type=True,
    )
    return packed


def unpack_record(data: bytes) -> list[Forward] | Takeover:
    """Unpack an inbox record: a batch of forwards (:func:`pack_batch`) or a takeover
    notice (:func:`pack_takeover`); raises :class:`MalformedMessageError` for anything else."""
    try:
        record: Any = msgpack.unpackb(data, raw=False)
        if type(record) is dict:
            client_id, epoch = record["takeover"]
            if type(client_id) is not str or type(epoch) is not int or len(record) != 1:
                raise TypeError("a takeover notice is a client id and an integer epoch")
            return Takeover(client_id, epoch)
        return [
            Forward(
                Message(
                    bytes(row[0]),
                    str(row[1]),
                    bytes(row[2]),
                    int(row[3]),
                    bool(row[4]),
                    row[5],
                    float(row[6]),
                ),
                tuple(row[7]),
                tuple(row[8]),
            )
            for row in record
        ]
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise MalformedMessageError(f"not a router inbox record: {exc}") from None
