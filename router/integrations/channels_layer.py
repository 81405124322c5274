"""A Django Channels layer on a router node (the ``router[channels]`` extra)::

    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "router.integrations.channels_layer.RouterChannelLayer",
            "CONFIG": {"url": "redis://127.0.0.1:6379/0", "capacity": 100, "expiry": 60},
        }
    }

:class:`RouterChannelLayer` implements the channel layer specification: ``send``,
``receive``, ``new_channel``, the ``groups`` and ``flush`` extensions, ``ChannelFull`` at
capacity, message and group expiry, channel-name validation (channels' own rules), and
msgpack serialization as channels_redis does it. How names become topics and what each
process subscribes to: :mod:`router.integrations.channel_hub`.

One node per process, on a thread of its own (:mod:`router.integrations.node_thread`),
started by the first call that needs it: every event loop of the process uses the same
node (Daphne's, Uvicorn's, and the loop of each ``async_to_sync`` call in a view or a
task), so no call joins or leaves the cluster. ``flush()`` and ``close()`` stop the node
(the next call starts it again); at interpreter exit a running node leaves gracefully.
After ``os.fork()`` the child is a new process with a new identity of its own.

Where messages wait: in the receiving process, one bounded mailbox per channel
(:mod:`router.integrations.channel_mailboxes`). A send to a channel of this very
process goes straight into its mailbox (``ChannelFull`` when it holds ``capacity``);
anything else is published once and reaches only the processes that asked for it.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

import msgpack
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer

from router.cluster.config import NodeConfig
from router.errors import ChannelMessageError, ForeignChannelError, InvalidSettingError
from router.integrations.channel_hub import (
    TOPIC_ROOT,
    ChannelHub,
    ChannelTopics,
    HubSettings,
    process_of,
)
from router.integrations.channel_mailboxes import Mailboxes
from router.integrations.node_thread import NodeThread

#: Options of the node the layer's CONFIG may set besides its own (``router.connect``'s).
NODE_OPTIONS: Final = {f.name for f in fields(NodeConfig)} - {"node_id", "prefix"} | {
    "acl",
    "acl_default",
    "redis_timeout",
    "redis_pool_size",
}


class RouterChannelLayer(BaseChannelLayer):  # type: ignore[misc]  # (channels has no types)
    """A channel layer whose processes share one router cluster (see the module docstring).

    ``url``: the Redis URL (standalone or Cluster; default ``$ROUTER_REDIS_URL``);
    ``prefix``: the router's key prefix (layers and MQTT nodes with the same prefix share
    one cluster); ``expiry``: seconds a message waits to be received (whole seconds, the
    MQTT Message Expiry Interval); ``group_expiry``: seconds a group membership lasts;
    ``capacity`` and ``channel_capacity`` (glob or compiled regex -> capacity): how many
    messages one channel's mailbox holds; ``topic_root``: the topic under which every name
    lives. Any other option goes to the node (``NodeConfig``'s fields, ``redis_timeout``,
    ``acl``...). A bad value raises :class:`InvalidSettingError`.
    """

    extensions: Final = ["groups", "flush"]

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str | None = None,
        expiry: float = 60,
        group_expiry: float = 86400,
        capacity: int = 100,
        channel_capacity: Mapping[Any, int] | None = None,
        topic_root: str = TOPIC_ROOT,
        **node_options: Any,
    ) -> None:
        _check_positive("expiry", expiry)
        _check_positive("group_expiry", group_expiry)
        _check_capacity("capacity", capacity)
        for pattern, value in (channel_capacity or {}).items():
            _check_capacity(f"channel_capacity[{pattern!r}]", value)
        unknown = sorted(set(node_options) - NODE_OPTIONS)
        if unknown:
            raise InvalidSettingError(f"RouterChannelLayer has no option {', '.join(unknown)}")
        if prefix is not None:
            node_options["prefix"] = prefix
        super().__init__(expiry=expiry, capacity=capacity)
        self.channel_capacity = self.compile_capacities(channel_capacity or {})
        self.group_expiry = group_expiry
        self._settings = HubSettings(
            url, ChannelTopics(topic_root), max(1, math.ceil(expiry)), group_expiry, node_options
        )
        self._guard = threading.Lock()
        self._pid = -1
        self._here()

    # -- the channel layer API -----------------------------------------------------------

    async def send(self, channel: str, message: Any) -> None:
        """Send ``message`` (a dict; anything msgpack packs) to ``channel``.

        Raises ``ChannelFull`` when the channel is one of this process's and its mailbox
        is full, or when it is a normal channel no process receives on yet and this
        process keeps ``capacity`` messages for it already; ``TypeError`` for a bad name,
        :class:`ChannelMessageError` for a message msgpack cannot pack.
        """
        self.require_valid_channel_name(channel)
        payload = self.serialize(message)
        deadline = time.time() + self._settings.expiry
        hub, thread, mailboxes = self._here()
        if process_of(channel) == hub.process:
            if not mailboxes.put(channel, payload, deadline):
                raise ChannelFull(channel)
            return
        await thread.call(lambda: hub.send(channel, payload, deadline))

    async def receive(self, channel: str) -> Any:
        """The next message of ``channel``: a channel of this process (made by
        :meth:`new_channel`) or a normal channel (this process then receives on it until
        flush or close; the processes receiving on one normal channel share its
        messages). Raises :class:`ForeignChannelError` for another process's channel."""
        self.require_valid_channel_name(channel)
        hub, thread, mailboxes = self._here()
        process = process_of(channel)
        if process is not None and process != hub.process:
            raise ForeignChannelError(channel, hub.process)
        while True:
            if process is None and not (thread.running and hub.listens(channel)):
                await thread.call(lambda: hub.receive_normal(channel))
            elif not thread.running:
                await thread.start()
            payload = await mailboxes.get(channel)
            if payload is None:  # (flushed meanwhile: as new)
                continue
            try:
                return self.deserialize(payload)
            except (ValueError, msgpack.UnpackException):  # (published by someone else)
                mailboxes.count_malformed()

    async def new_channel(self, prefix: str = "specific") -> str:
        """A new channel of this process: ``<prefix>.<process>!<random>``."""
        hub, thread, _ = self._here()
        await thread.start()
        name = f"{prefix}.{hub.process}!{secrets.token_hex(10)}"
        self.require_valid_channel_name(name)
        return name

    async def group_add(self, group: str, channel: str) -> None:
        """Add ``channel`` to ``group``, held by this process (call it from the channel's
        own process, as consumers do); returns once a group message sent from any process
        reaches it. The membership ends with ``group_discard``, after ``group_expiry``, or
        when this process stops."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        hub, thread, _ = self._here()
        await thread.call(lambda: hub.group_add(group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        """Remove ``channel`` from ``group`` (nothing when it is not a member here)."""
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        hub, thread, _ = self._here()
        if thread.running:
            await thread.call(lambda: hub.group_discard(group, channel))

    async def group_send(self, group: str, message: Any) -> None:
        """Send ``message`` to every member of ``group``, in any process: one publish.
        A member whose mailbox is full misses it (counted as ``full``, never raised)."""
        self.require_valid_group_name(group)
        payload = self.serialize(message)
        deadline = time.time() + self._settings.expiry
        hub, thread, _ = self._here()
        await thread.call(lambda: hub.group_send(group, payload, deadline))

    async def flush(self) -> None:
        """Forget every message and membership of this process and stop its node; the
        layer goes on as new at its next call."""
        _, thread, mailboxes = self._here()
        mailboxes.clear()
        await thread.stop()

    async def close(self) -> None:
        """Stop this process's node (leaving the cluster); the next call starts it again."""
        _, thread, _ = self._here()
        await thread.stop()

    # -- serialization and figures ---------------------------------------------------------

    def serialize(self, message: Any) -> bytes:
        """``message`` as msgpack (channels_redis's format, without its random prefix)."""
        try:
            packed: bytes = msgpack.packb(message, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as error:
            raise ChannelMessageError(message, str(error)) from None
        return packed

    def deserialize(self, payload: bytes) -> Any:
        """The message of :meth:`serialize`'s bytes; ``ValueError`` for other bytes."""
        return msgpack.unpackb(payload, raw=False)

    @property
    def client_prefix(self) -> str:
        """This process's part of its channels' names (``specific.<it>!...``)."""
        return self._here()[0].process

    @property
    def node_id(self) -> str | None:
        """The id of this process's node while it runs (each start makes a new one)."""
        return self._here()[0].node_id

    def stats(self) -> dict[str, int]:
        """What this process received, dropped and holds: ``received`` (copies that came
        from other processes: one per message, whatever the number of members here),
        ``full`` (copies for a channel whose mailbox was full), ``expired``, ``unrouted``
        (sends to a channel whose process is gone), ``parked`` (messages kept for a normal
        channel nobody receives on yet), ``forwarded`` / ``forward_failures`` (group
        messages passed on to channels held here but living elsewhere), ``malformed``,
        ``reattached``, ``cut_offs`` (the node was cut off from Redis longer than its
        TTL: what others sent meanwhile may have missed it), the node's ``queue_drops``,
        how many ``groups`` have members here and how many ``channels`` hold messages
        here (``received``, ``queue_drops``, ``parked`` and ``groups`` since the node
        started, the others since the layer was made)."""
        hub, thread, mailboxes = self._here()
        figures = thread.read(hub.stats)
        figures["expired"] += mailboxes.expired
        figures["malformed"] = mailboxes.malformed
        figures["channels"] = len(mailboxes)
        return figures

    def __str__(self) -> str:
        return f"{type(self).__name__}(process={self.client_prefix})"

    # -- one identity per process ----------------------------------------------------------

    def _here(self) -> tuple[ChannelHub, NodeThread, Mailboxes]:
        """This process's hub, node thread and mailboxes (new ones in a forked child)."""
        if self._pid != os.getpid():
            with self._guard:
                if self._pid != os.getpid():
                    process = uuid.uuid4().hex[:12]
                    mailboxes = Mailboxes(self.get_capacity)
                    hub = ChannelHub(self._settings, process, mailboxes)
                    thread = NodeThread(f"router-channels-{process}", hub.serve)
                    self._parts = (hub, thread, mailboxes)
                    self._pid = os.getpid()
        return self._parts


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidSettingError(f"{name} must be a positive number of seconds, not {value!r}")


def _check_capacity(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSettingError(f"{name} must be a positive int, not {value!r}")
