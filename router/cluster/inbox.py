"""The inbox wire format: what one node leaves in another node's inbox channel.

An inbox record is one msgpack value, either

* a *batch of forwards*: a list of rows ``[id, topic, payload, qos, retain, publisher,
  sent_at, groups, tried, properties, expires_at]``, one :class:`Forward` each
  (:func:`pack_batch`; ``properties`` is None or :meth:`MessageProperties.as_row`,
  ``expires_at`` None or wall-clock seconds; a row of 10 items is a message without
  expiry, from a node of the version before); or
* a *takeover notice*: ``{"takeover": [client_id, epoch, resume]}`` (:func:`pack_notice`;
  a notice of two items, from the version before, does not resume); or
* a *kick notice*: ``{"kick": [client_id]}`` (:func:`pack_notice`); or
* a *reload notice*: ``{"reload": [asked_by]}`` (:func:`pack_notice`).

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
from router.core.topics import TopicFilter
from router.errors import MalformedMessageError


@dataclass(slots=True)
class Forward:
    """A message as sent to one node: the message, the share groups that node serves, and
    the nodes that already failed to serve those groups (a re-dispatch skips them)."""

    message: Message
    groups: tuple[TopicFilter, ...] = ()
    tried: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Takeover:
    """A notice for the node that served a client's session before: another node took the
    session of ``client_id`` over with owner epoch ``epoch`` (MQTT-3.1.4-3); ``resume``
    says the new node goes on with the session (clean start 0), so this node hands on
    what it holds for the client (see :mod:`router.cluster.sessions.keeper`)."""

    client_id: str
    epoch: int
    resume: bool = False


@dataclass(frozen=True, slots=True)
class Kick:
    """A notice for the node serving ``client_id``: end its connection (an operator's
    ``router clients kick``); a persistent session stays, as after any disconnect."""

    client_id: str


@dataclass(frozen=True, slots=True)
class Reload:
    """A notice for a node: reread its configuration files (``router node reload``;
    :mod:`router.cluster.reloads`); ``asked_by`` says who asked, for its event."""

    asked_by: str


@dataclass(frozen=True, slots=True)
class Drain:
    """A notice for a node: drain and leave (``router node drain``: :mod:`router.ops.
    draining`); ``asked_by`` says who asked, for its event."""

    asked_by: str


Notice = Takeover | Kick | Reload | Drain


def pack_notice(notice: Notice) -> bytes:
    """Pack a notice into one inbox record (read back by :func:`unpack_record`)."""
    if isinstance(notice, Kick):
        record: dict[str, list[object]] = {"kick": [notice.client_id]}
    elif isinstance(notice, Reload):
        record = {"reload": [notice.asked_by]}
    elif isinstance(notice, Drain):
        record = {"drain": [notice.asked_by]}
    else:
        record = {"takeover": [notice.client_id, notice.epoch, notice.resume]}
    packed: bytes = msgpack.packb(record, use_bin_type=True)
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
                f.groups,  # tuples, packed as arrays like lists
                f.tried,
                None if f.message.properties is None else f.message.properties.as_row(),
                f.message.expires_at,
            ]
            for f in forwards
        ],
        use_bin_type=True,
    )
    return packed


def unpack_record(data: bytes) -> list[Forward] | Notice:
    """Unpack an inbox record: a batch of forwards (:func:`pack_batch`) or a notice
    (:func:`pack_notice`); raises :class:`MalformedMessageError` for anything else."""
    try:
        record: Any = msgpack.unpackb(data, raw=False)
        if type(record) is dict:
            return _unpack_notice(record)
        return [_forward(row) for row in record]
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise MalformedMessageError(f"not a router inbox record: {exc}") from None


def _forward(row: list[Any]) -> Forward:
    """One row of a batch (see the module docstring); raises ``TypeError`` or
    ``ValueError`` for a row this router did not write."""
    if len(row) == 10:  # (a row of the version before: no expiry)
        row = [*row, None]
    message_id, topic, payload, qos, retain, publisher, sent_at, groups, tried, props, expires = row
    if (
        type(message_id) is not bytes
        or type(topic) is not str
        or type(payload) is not bytes
        or qos not in (0, 1, 2)
        or type(retain) is not bool
        or (publisher is not None and type(publisher) is not str)
    ):
        raise TypeError("a row's id, topic, payload, qos, retain or publisher")
    return Forward(
        Message(
            message_id,
            row[1],  # the topic (a TopicName: validated where the publish entered)
            payload,
            qos,
            retain,
            publisher,
            float(sent_at),
            None if props is None else MessageProperties.from_row(props),
            None if expires is None else float(expires),
        ),
        tuple(groups) if groups else (),  # share filters: validated where they entered
        tuple(tried) if tried else (),
    )


def _unpack_notice(record: dict[Any, Any]) -> Notice:
    if len(record) != 1:
        raise TypeError("a notice has one kind")
    if "kick" in record:
        (client_id,) = record["kick"]
        if type(client_id) is not str:
            raise TypeError("a kick notice names a client id")
        return Kick(client_id)
    if "reload" in record:
        (asked_by,) = record["reload"]
        if type(asked_by) is not str:
            raise TypeError("a reload notice names who asked")
        return Reload(asked_by)
    if "drain" in record:
        (asked_by,) = record["drain"]
        if type(asked_by) is not str:
            raise TypeError("a drain notice names who asked")
        return Drain(asked_by)
    client_id, epoch, *rest = record["takeover"]
    resume = rest[0] if rest else False
    if type(client_id) is not str or type(epoch) is not int or type(resume) is not bool:
        raise TypeError("a takeover notice is a client id, an integer epoch and a flag")
    if len(rest) > 1:
        raise TypeError("a takeover notice has at most three items")
    return Takeover(client_id, epoch, resume)
