"""The inbox wire format: what one node leaves in another node's inbox channel.

An inbox record is one msgpack value, either

* a *batch of forwards*: a list of rows ``[id, topic, payload, qos, retain, publisher,
  sent_at, groups, tried, properties]``, one :class:`Forward` each (:func:`pack_batch`;
  ``properties`` is None or :meth:`MessageProperties.as_row`); or
* a *takeover notice*: ``{"takeover": [client_id, epoch]}`` (:func:`pack_takeover`).

:func:`unpack_record` reads both and raises :class:`MalformedMessageError` for anything
else, so a reader never acts on a record this router did not write. Topics and share
filters in a record are not validated again: only router nodes write inboxes, and they
validated them where the publish entered (:mod:`router.core.topics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from router.core.messages import Message, MessageProperties
from router.core.topics import TopicFilter, TopicName
from router.errors import MalformedMessageError


@dataclass(frozen=True, slots=True)
class Forward:
    """A message as sent to one node: the message, the share groups that node serves, and
    the nodes that already failed to serve those groups (a re-dispatch skips them)."""

    message: Message
    groups: tuple[TopicFilter, ...] = ()
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
                None if f.message.properties is None else f.message.properties.as_row(),
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
                    TopicName(str(row[1])),  # validated where the publish entered
                    bytes(row[2]),
                    int(row[3]),
                    bool(row[4]),
                    row[5],
                    float(row[6]),
                    None if row[9] is None else MessageProperties.from_row(row[9]),
                ),
                tuple(row[7]),  # share filters: validated where they entered the cluster
                tuple(row[8]),
            )
            for row in record
        ]
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise MalformedMessageError(f"not a router inbox record: {exc}") from None
