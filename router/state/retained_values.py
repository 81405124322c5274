"""What the retained store keeps and gives back, apart from Redis: its settings, a message
as read back, the cursors and pages of a walk, how a message is packed for its shard, and
how a filter is planned over the shards (:mod:`router.state.retained_store` does the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.core.messages import MessageProperties
from router.core.topics import (
    MULTI_LEVEL,
    SINGLE_LEVEL,
    TopicFilter,
    parse_shared,
    validate_filter,
)
from router.errors import (
    CorruptStateError,
    InvalidSettingError,
    InvalidTopicError,
    RetainedArgumentError,
)

MAX_LIMIT: Final = 10_000  # messages one call returns, at most
MAX_EXPIRY_INTERVAL: Final = 2**32 - 1  # seconds: MQTT's four-byte integer


@dataclass(frozen=True, slots=True)
class RetainedConfig:
    """Limits of the store and how often a node clears expired messages.

    ``max_payload`` bytes (0: no limit), ``max_count`` topics (0: no limit; by default
    100,000, so that clients cannot grow the shared store without end), ``max_bytes``
    the bytes every stored message together may hold in Redis (0: no limit; by default
    256 MiB), ``clear_interval`` seconds between a node's clearing runs (0: never).
    """

    max_payload: int = 0
    max_count: int = 100_000
    max_bytes: int = 256 << 20
    clear_interval: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_payload", "max_count", "max_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidSettingError(f"{name} must be an int >= 0, not {value!r}")
        interval = self.clear_interval
        if not isinstance(interval, int | float) or not 0 <= interval < math.inf:
            raise InvalidSettingError(f"clear_interval must be seconds >= 0, not {interval!r}")


DEFAULT_RETAINED: Final = RetainedConfig()


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """A retained message as read back: ``expiry_interval`` is the seconds it has left
    (rounded up), None when it never expires; ``properties`` are its MQTT 5 properties."""

    topic: str
    payload: bytes
    qos: int = 0
    message_id: bytes = b""
    publisher: str | None = None
    expiry_interval: int | None = None
    properties: MessageProperties | None = None


@dataclass(frozen=True, slots=True)
class RetainedCursor:
    """Where a match or scan goes on: in ``shard``, after topic ``after`` (None: from the
    shard's start). Opaque to callers; plain data, so it can be stored or shipped."""

    shard: str
    after: str | None = None


@dataclass(frozen=True, slots=True)
class RetainedBatch:
    """Messages of one call, the cursor for the next (None: nothing more), and how many
    stored topics the scripts looked at to find them."""

    messages: list[RetainedMessage]
    cursor: RetainedCursor | None
    examined: int


@dataclass(frozen=True, slots=True)
class RetainedPage:
    """One page of the whole store in topic order; ``has_next`` says whether more follow."""

    messages: list[RetainedMessage]
    page: int
    limit: int
    has_next: bool


@dataclass(frozen=True, slots=True)
class ExpiryRun:
    """What one :meth:`RetainedStore.clear_expired` call removed; pass ``cursor`` to the next
    call (None: the run went through every shard)."""

    removed: int
    cursor: str | None


def first_level(topic: str) -> str:
    """The first level of a topic or filter: the shard it lives in."""
    return topic.partition("/")[0]


def plain_filter(topic_filter: str) -> TopicFilter:
    checked = validate_filter(topic_filter)
    if parse_shared(checked) is not None:
        raise InvalidTopicError(topic_filter, "retained messages are matched by plain filters")
    return checked


def effective_filter(topic_filter: str | None, shard: str) -> str:
    """The filter as it applies inside ``shard``: its first level made literal.

    None (every topic) and ``#`` become ``shard/#``; ``+/rest`` becomes ``shard/rest``.
    """
    head, separator, rest = (topic_filter or MULTI_LEVEL).partition("/")
    if head == MULTI_LEVEL:
        return shard + "/" + MULTI_LEVEL
    if head == SINGLE_LEVEL:
        return shard + separator + rest
    return topic_filter or ""


def scan_plan(effective: str) -> tuple[str, str]:
    """(topic to look at on its own, literal prefix of the range) for a literal-first filter.

    ``a/b`` -> (``a/b``, no range); ``a/b/#`` -> (``a/b``, ``a/b/``); ``a/+/c`` -> (no topic,
    ``a/``). Everything the filter matches is that topic or starts with that prefix.
    """
    levels = effective.split("/")
    for index, level in enumerate(levels):
        if level == MULTI_LEVEL:
            parent = "/".join(levels[:index])
            return parent, parent + "/"
        if level == SINGLE_LEVEL:
            return "", "/".join(levels[:index]) + "/"
    return effective, ""


def check_limit(limit: int, what: str = "limit") -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise RetainedArgumentError(f"{what} must be an int in 1..{MAX_LIMIT}, not {limit!r}")
    return limit


def topic_text(value: Any) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored retained topic is not UTF-8: {value!r}") from None


def pack_message(
    payload: bytes,
    qos: int,
    message_id: bytes,
    publisher: str | None,
    properties: MessageProperties | None,
) -> bytes:
    row = None if properties is None else properties.as_row()
    packed: bytes = msgpack.packb([payload, qos, message_id, publisher, row], use_bin_type=True)
    return packed


def unpack_message(topic: str, packed: Any, left_ms: Any) -> RetainedMessage:
    try:
        payload, qos, message_id, publisher, *rest = msgpack.unpackb(bytes(packed), raw=False)
        row = rest[0] if rest else None  # (stored before properties were kept: none)
        left = int(left_ms)
        return RetainedMessage(
            topic,
            bytes(payload),
            int(qos),
            bytes(message_id),
            publisher if publisher is None else str(publisher),
            None if left < 0 else max(1, math.ceil(left / 1000)),
            None if row is None else MessageProperties.from_row(row),
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptStateError(f"a stored retained message is malformed: {exc}") from None


def unpack_rows(rows: list[Any]) -> list[RetainedMessage]:
    return [
        unpack_message(topic_text(rows[i]), rows[i + 1], rows[i + 2])
        for i in range(0, len(rows), 3)
    ]


def check_retained_input(payload: object, qos: object, expiry_interval: object) -> None:
    """Refuse what :meth:`RetainedStore.store` cannot store, before anything changes."""
    if not isinstance(payload, bytes | bytearray):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    if type(qos) is not int or not 0 <= qos <= 2:
        raise RetainedArgumentError(f"qos must be 0, 1 or 2, not {qos!r}")
    if expiry_interval is not None and (
        type(expiry_interval) is not int or not 1 <= expiry_interval <= MAX_EXPIRY_INTERVAL
    ):
        raise RetainedArgumentError(
            f"expiry_interval must be None or 1..{MAX_EXPIRY_INTERVAL} seconds, "
            f"not {expiry_interval!r}"
        )
