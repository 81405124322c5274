"""A client's shared state in Redis: subscriptions and the session owner, atomic per client.

Every key of a client carries the client's hash tag (see :mod:`router.state.keys`), so each
operation is one Lua script on one slot, also on Redis Cluster::

    rt:{c:ID}:subs    hash  filter -> packed options (msgpack [qos, no_local, rap, rh, id])
    rt:{c:ID}:owner   hash  node -> owning node id, epoch -> its epoch
    rt:{c:ID}:session hash  the session's description (see router.state.session_store)

Session ownership: :meth:`SubscriptionStore.claim` makes a node the owner with a new epoch
(epochs only grow, even across :meth:`~SubscriptionStore.remove_client`). A write may carry
the :class:`Owner` the caller believes in; if another node (or a newer epoch of the same
node) took the session over since, the write raises :class:`SessionOwnershipError` and
changes nothing, so a node that lost a client cannot change its state anymore.
``owner=None`` skips the check (for tools and tests, not for nodes serving clients).

Input is validated twice: in Python (filters, ids, options) and again in Lua (a script
called with missing or malformed ARGV refuses with :class:`ScriptError`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Final, NamedTuple

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.core.options import DEFAULT_OPTIONS, SubscriptionOptions, make_options
from router.core.topics import TopicFilter, validate_filter
from router.errors import (
    CorruptStateError,
    InvalidIdError,
    InvalidOptionsError,
    RouterError,
    SessionOwnershipError,
)
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import read_each
from router.state.scripts import RedisClient, Scripts

_OPTION_FIELDS: Final = 5


class Owner(NamedTuple):
    """The node that serves a client's session, and the epoch of its claim."""

    node_id: str
    epoch: int


class RemovedClient(NamedTuple):
    """What :meth:`SubscriptionStore.remove_client` deleted."""

    subscriptions: int
    aliases: int
    owner: bool


@lru_cache(maxsize=4096)
def pack_options(options: SubscriptionOptions) -> bytes:
    """The compact stored form of subscription options (cached: options are few and frozen)."""
    packed: bytes = msgpack.packb(
        [
            options.qos,
            options.no_local,
            options.retain_as_published,
            options.retain_handling,
            options.subscription_identifier,
        ]
    )
    return packed


def unpack_options(data: bytes) -> SubscriptionOptions:
    """Options from their stored form; :class:`CorruptStateError` if it is not one."""
    try:
        fields = msgpack.unpackb(data)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise CorruptStateError(f"stored subscription options are not msgpack: {exc}") from None
    if not isinstance(fields, list) or len(fields) != _OPTION_FIELDS:
        raise CorruptStateError(f"stored subscription options have the wrong shape: {fields!r}")
    qos, no_local, rap, handling, ident = fields
    try:
        return make_options(
            qos=qos,
            no_local=no_local,
            retain_as_published=rap,
            retain_handling=handling,
            subscription_identifier=ident,
        )
    except InvalidOptionsError as exc:
        raise CorruptStateError(f"stored subscription options are invalid: {exc}") from None


def unpack_filters(pairs: Sequence[Any]) -> dict[str, SubscriptionOptions]:
    """The filters of a subscriptions hash read as a flat list (filter, packed options,
    ...); :class:`CorruptStateError` if a stored value is not what the router wrote."""
    return {
        _decode(pairs[i], "filter"): unpack_options(bytes(pairs[i + 1]))
        for i in range(0, len(pairs), 2)
    }


def _owner_args(owner: Owner | None) -> list[str | bytes]:
    if owner is None:
        return ["", ""]
    if not isinstance(owner, Owner):
        raise TypeError(f"owner must be an Owner or None, not {owner!r}")
    check_id(owner.node_id, "node id")
    if type(owner.epoch) is not int or owner.epoch < 1:
        raise InvalidIdError(f"an owner epoch is a positive int, not {owner.epoch!r}")
    return [owner.node_id, str(owner.epoch)]


def _decode(value: Any, what: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored {what} is not UTF-8 text: {value!r}") from None


#: How client_claim.lua records a claimer with an empty user name: '' records none (as
#: owner hashes always did), and no user name holds U+0000 (MQTT-1.5.4-2).
EMPTY_USER: Final = "\x00"


def _claimer(user: str | None) -> str:
    """The user name as client_claim.lua records it (see :data:`EMPTY_USER`)."""
    if user is None:
        return ""
    return user or EMPTY_USER


def _owner_of(node: Any, epoch: Any) -> Owner | None:
    """The :class:`Owner` an owner hash's (node, epoch) fields hold, None without a node."""
    if node is None:
        return None
    text = _decode(epoch, "owner epoch") if epoch is not None else ""
    if not text.isdigit() or not text.isascii():
        raise CorruptStateError(f"the stored owner epoch is not an integer: {epoch!r}")
    return Owner(_decode(node, "owner node id"), int(text))


class SubscriptionStore:
    """Subscriptions and session owners of clients, in one Redis (or Redis Cluster)."""

    def __init__(self, redis: RedisClient, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys if keys is not None else Keys()
        self._scripts = Scripts(redis)

    def client_keys(self, client_id: str) -> list[str]:
        """Every key of the client, in the order ``client_remove.lua`` and
        ``client_claim.lua`` expect them."""
        return self.keys.client_keys(client_id)

    # -- session owner ---------------------------------------------------------------

    async def claim(self, client_id: str, node_id: str) -> Owner:
        """Make ``node_id`` the owner of the client's session; return the new :class:`Owner`.

        The new epoch is larger than every epoch the client had before. Raises
        :class:`InvalidIdError` for a bad id, :class:`CorruptStateError` if the stored epoch
        is not an integer.
        """
        _previous, owner = await self.claim_over(client_id, node_id)
        return owner

    async def claim_over(
        self,
        client_id: str,
        node_id: str,
        *,
        fresh: bool = False,
        user: str | None = None,
        shared: bool = True,
        open_session: Sequence[str | int] | None = None,
    ) -> tuple[Owner | None, Owner]:
        """Claim the client's session for ``node_id`` (see :meth:`claim`) in one script;
        return the owner it had (None if none) and the new one. ``fresh``: the client's
        subscriptions, aliases and session description are deleted in the same step (a
        new session under an old id), as by :meth:`remove_client` but keeping the epoch
        growing from the stored one. ``user``: the connecting client's user name (None:
        none), which the claim records; unless ``shared``, a session that records another
        is refused with :class:`SessionUserError` and nothing changes. ``open_session``:
        the session hash's pairs (:func:`~router.state.session_store.open_fields`), the
        session marked connected in the same step, as by :meth:`SessionStore.mark_open
        <router.state.session_store.SessionStore.mark_open>`."""
        check_id(node_id, "node id")
        if user is not None and (type(user) is not str or "\x00" in user):
            raise InvalidIdError(f"a user name is a str without U+0000, not {user!r}")
        args: list[str | int] = [
            node_id,
            "fresh" if fresh else "keep",
            _claimer(user),
            "shared" if shared else "bound",
        ]
        if open_session is not None:
            args += ["open", *open_session]
        node, epoch, new, _since = await self._scripts.run(
            "client_claim", self.client_keys(client_id), args
        )
        return _owner_of(node, epoch), Owner(node_id, int(new))

    async def restore_owner(self, client_id: str, owner: Owner) -> bool:
        """Write ``owner`` back as the client's session owner after Redis lost it; True
        when written, False when some node owns the session now (nothing changes)."""
        key = self.keys.client_owner(client_id)
        restored = await self._scripts.run("client_restore", [key], [owner.node_id, owner.epoch])
        return int(restored) == 1

    async def owner(self, client_id: str) -> Owner | None:
        """The client's session owner, or None if no node owns it."""
        with translating:
            node, epoch = await self.redis.hmget(
                self.keys.client_owner(client_id), ["node", "epoch"]
            )
        return _owner_of(node, epoch)

    async def owners(self, client_ids: Sequence[str]) -> list[Owner | None]:
        """The session owner of each client, in order (see :func:`read_each`);
        :class:`CorruptStateError` if a stored epoch is not an integer."""
        owner_keys = [self.keys.client_owner(client_id) for client_id in client_ids]
        replies = await read_each(self.redis, "HMGET", owner_keys, "node", "epoch")
        return [_owner_of(node, epoch) for node, epoch in replies]

    # -- subscriptions ---------------------------------------------------------------

    async def subscribe(
        self,
        client_id: str,
        topic_filter: str,
        options: SubscriptionOptions = DEFAULT_OPTIONS,
        *,
        owner: Owner | None = None,
    ) -> bool:
        """Subscribe the client to one filter; True if it is new, False if it replaced one."""
        (new,) = await self.subscribe_many(client_id, [(topic_filter, options)], owner=owner)
        return new

    async def subscribe_many(
        self,
        client_id: str,
        items: Iterable[tuple[str, SubscriptionOptions]],
        *,
        owner: Owner | None = None,
    ) -> list[bool]:
        """Subscribe the client to a batch of filters in one atomic script call.

        Returns one bool per item: True if the filter was new, False if it replaced a
        subscription (a later item for the same filter replaces an earlier one). Raises
        :class:`InvalidTopicError` / :class:`InvalidOptionsError` / :class:`InvalidIdError`
        for bad input and :class:`SessionOwnershipError` if ``owner`` is stale; then
        nothing changed.
        """
        checked = []
        for topic_filter, options in items:
            if not isinstance(options, SubscriptionOptions):
                raise InvalidOptionsError(f"options must be SubscriptionOptions, not {options!r}")
            checked.append((validate_filter(topic_filter), options))
        return await self.write_subscriptions(client_id, checked, owner=owner)

    async def write_subscriptions(
        self,
        client_id: str,
        items: Iterable[tuple[TopicFilter, SubscriptionOptions]],
        *,
        owner: Owner | None = None,
    ) -> list[bool]:
        """:meth:`subscribe_many` for filters and options validated where they entered
        (the node's ``subscribe``); raises only for a bad client id or a stale owner."""
        args = _owner_args(owner)
        for topic_filter, options in items:
            args += [topic_filter, pack_options(options)]
        if len(args) == 2:
            check_id(client_id, "client id")
            return []
        keys = [self.keys.client_subscriptions(client_id), self.keys.client_owner(client_id)]
        results = await self._scripts.run("client_subscribe", keys, args)
        return [int(flag) == 1 for flag in results]

    async def unsubscribe(
        self, client_id: str, topic_filter: str, *, owner: Owner | None = None
    ) -> bool:
        """Unsubscribe the client from one filter; True if it was subscribed."""
        (removed,) = await self.unsubscribe_many(client_id, [topic_filter], owner=owner)
        return removed

    async def unsubscribe_many(
        self, client_id: str, filters: Iterable[str], *, owner: Owner | None = None
    ) -> list[bool]:
        """Remove a batch of the client's filters atomically; one bool (was it there) each.

        Raises like :meth:`subscribe_many`; nothing changes then.
        """
        return await self.delete_subscriptions(
            client_id, [validate_filter(topic_filter) for topic_filter in filters], owner=owner
        )

    async def delete_subscriptions(
        self, client_id: str, filters: Iterable[TopicFilter], *, owner: Owner | None = None
    ) -> list[bool]:
        """:meth:`unsubscribe_many` for filters validated where they entered."""
        args: list[str | bytes] = _owner_args(owner)
        args.extend(filters)
        if len(args) == 2:
            check_id(client_id, "client id")
            return []
        keys = [self.keys.client_subscriptions(client_id), self.keys.client_owner(client_id)]
        results = await self._scripts.run("client_unsubscribe", keys, args)
        return [int(flag) == 1 for flag in results]

    async def subscriptions(self, client_id: str) -> dict[str, SubscriptionOptions]:
        """The client's filters and their options (empty if it has none).

        Raises :class:`CorruptStateError` if a stored value is not what the router wrote.
        """
        with translating:
            stored: dict[Any, Any] = await self.redis.hgetall(
                self.keys.client_subscriptions(client_id)
            )
        return {
            _decode(topic_filter, "filter"): unpack_options(bytes(packed))
            for topic_filter, packed in stored.items()
        }

    async def subscription_counts(self, client_ids: Sequence[str]) -> list[int]:
        """How many filters each client holds, in order (see :func:`read_each`)."""
        subscription_keys = [self.keys.client_subscriptions(client_id) for client_id in client_ids]
        return [int(count) for count in await read_each(self.redis, "HLEN", subscription_keys)]

    # -- everything ------------------------------------------------------------------

    async def remove_client(self, client_id: str, *, owner: Owner | None = None) -> RemovedClient:
        """Delete all of the client's data (subscriptions, aliases, owner, session
        description) in one script.

        Returns what was deleted (all zero/False when the client had nothing). Raises
        :class:`SessionOwnershipError` if ``owner`` is stale; nothing changes then.
        """
        args = _owner_args(owner)
        subscriptions, aliases, had_owner = await self._scripts.run(
            "client_remove", self.client_keys(client_id), args
        )
        return RemovedClient(int(subscriptions), int(aliases), int(had_owner) == 1)

    async def remove_clients(self, clients: Sequence[tuple[str, Owner]]) -> list[bool]:
        """:meth:`remove_client` of each (client id, the claim it must still hold) of
        ``clients``, pipelined on a standalone server (:meth:`Scripts.run_many
        <router.state.scripts.Scripts.run_many>`): True where the client's data went,
        False where another claim holds it now (nothing changed for that client).
        Raises the first other refusal (the others still ran)."""
        calls = [(self.client_keys(client_id), _owner_args(owner)) for client_id, owner in clients]
        replies = await self._scripts.run_many("client_remove", calls)
        removed: list[bool] = []
        for reply in replies:
            if isinstance(reply, SessionOwnershipError):
                removed.append(False)
            elif isinstance(reply, RouterError):
                raise reply
            else:
                removed.append(True)
        return removed


__all__ = [
    "Owner",
    "RemovedClient",
    "SubscriptionStore",
    "pack_options",
    "unpack_filters",
    "unpack_options",
]
