"""Topic aliases in Redis, with the semantics of the in-memory :class:`router.AliasTable`.

Per client and namespace (``client`` inbound, ``server`` outbound) three hashes under the
client's hash tag, changed together by one script so both directions stay consistent::

    rt:{c:ID}:alias:NS          alias -> topic
    rt:{c:ID}:alias:NS:topics   topic -> alias
    rt:{c:ID}:alias:max         NS -> Topic Alias Maximum (absent: 65535)

Binding an alias to a new topic forgets the alias's old topic; binding a topic to a new
alias forgets the topic's old alias. Aliases are 1..65535, or 1..the client's maximum for
the namespace. The aliases are deleted with the rest of the client's data
(:meth:`router.state.subscriptions.SubscriptionStore.remove_client`) or alone
(:meth:`RedisAliasTable.remove_client`). The same test table (tests/support/alias_cases.py) runs
against both tables.

An MQTT listener mirrors each connection's tables here (:meth:`RedisAliasTable.mirror`,
:mod:`router.mqtt.alias_mirror`): the whole of both namespaces at once, fenced by the
session's owner claim, so that the node that lost a client's session to a newer claim
(a takeover) can neither overwrite nor forget what the new connection's node wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.core.aliases import MAX_ALIAS, NAMESPACES, Namespace, check_alias, check_namespace
from router.core.topics import validate_topic
from router.errors import CorruptStateError, InvalidAliasError, RouterError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.scripts import RedisClient, Scripts
from router.state.subscriptions import Owner


def _text(value: Any, what: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored {what} is not UTF-8 text: {value!r}") from None


def _alias(value: Any) -> int:
    text = _text(value, "alias")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_ALIAS:
        raise CorruptStateError(f"a stored alias is not 1..{MAX_ALIAS}: {value!r}")
    return int(text)


@dataclass(frozen=True)
class AliasCopy:
    """One connection's topic aliases to store for its client under ``owner`` (the claim
    its node holds): each namespace's alias -> topic map and maximum; ``tables`` None
    forgets them (the connection ended)."""

    client_id: str
    owner: Owner
    tables: tuple[tuple[int, Mapping[int, str]], tuple[int, Mapping[int, str]]] | None


class RedisAliasTable:
    """Topic aliases of many clients, in two namespaces each, kept in Redis."""

    def __init__(self, redis: RedisClient, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys if keys is not None else Keys()
        self._scripts = Scripts(redis)

    def _namespace_keys(self, client_id: str, namespace: str) -> list[str]:
        return [
            self.keys.client_aliases(client_id, namespace),
            self.keys.client_alias_topics(client_id, namespace),
            self.keys.client_alias_maximum(client_id),
        ]

    async def set_maximum(self, client_id: str, namespace: Namespace, maximum: int) -> int:
        """Set the client's Topic Alias Maximum for a namespace (0 forbids aliases).

        Aliases above the new maximum are dropped; returns how many. Raises
        :class:`InvalidAliasError` for a maximum outside 0..65535 or an unknown namespace.
        """
        check_namespace(namespace)
        if type(maximum) is not int or not 0 <= maximum <= MAX_ALIAS:
            raise InvalidAliasError(maximum, f"a maximum must be between 0 and {MAX_ALIAS}")
        keys = self._namespace_keys(client_id, namespace)
        dropped = await self._scripts.run("alias_maximum", keys, [namespace, maximum])
        return int(dropped)

    async def bind(self, client_id: str, namespace: Namespace, alias: int, topic: str) -> bool:
        """Make ``alias`` stand for ``topic`` in the client's namespace.

        Returns False if it already did, True if the binding changed. Raises
        :class:`InvalidAliasError` for an alias outside 1..maximum (or an unknown
        namespace) and :class:`InvalidTopicError` for an invalid topic name; nothing
        changes then.
        """
        check_namespace(namespace)
        validate_topic(topic)
        check_alias(alias)  # the per-client maximum is checked by the script
        keys = self._namespace_keys(client_id, namespace)
        changed = await self._scripts.run("alias_bind", keys, [namespace, alias, topic])
        return int(changed) == 1

    async def topic(self, client_id: str, namespace: Namespace, alias: int) -> str | None:
        """The topic ``alias`` stands for, or None."""
        check_namespace(namespace)
        if type(alias) is not int:
            return None
        with translating:
            value = await self.redis.hget(
                self.keys.client_aliases(client_id, namespace), str(alias)
            )
        return None if value is None else _text(value, "topic")

    async def alias(self, client_id: str, namespace: Namespace, topic: str) -> int | None:
        """The alias bound to ``topic``, or None."""
        check_namespace(namespace)
        if type(topic) is not str or not topic:
            return None
        with translating:
            value = await self.redis.hget(
                self.keys.client_alias_topics(client_id, namespace), topic
            )
        return None if value is None else _alias(value)

    async def aliases(self, client_id: str, namespace: Namespace) -> dict[int, str]:
        """The namespace's alias -> topic map."""
        check_namespace(namespace)
        with translating:
            stored = await self.redis.hgetall(self.keys.client_aliases(client_id, namespace))
        return {_alias(alias): _text(topic, "topic") for alias, topic in stored.items()}

    async def remove_client(self, client_id: str) -> int:
        """Forget every alias of the client (both namespaces); return how many there were."""
        check_id(client_id, "client id")
        keys: list[str] = []
        for namespace in NAMESPACES:
            keys += self._namespace_keys(client_id, namespace)[:2]
        keys.append(self.keys.client_alias_maximum(client_id))
        return int(await self._scripts.run("alias_remove", keys, []))

    async def mirror(self, copies: Sequence[AliasCopy]) -> list[int | RouterError]:
        """Replace (or forget) the aliases of each copy's client with the copy's, in one
        pipeline on a standalone server (``lua/alias_replace.lua``). Returns, per copy,
        the bindings stored, or the refusal: :class:`SessionOwnershipError` when the
        copy's owner is not the client's owner now (a newer claim took the session), and
        nothing of that client changed. Raises :class:`StateFailureError` when Redis
        failed (some copies may have been stored)."""
        calls: list[tuple[list[str], list[Any]]] = []
        for copy in copies:
            keys = self.keys
            client_id = copy.client_id
            script_keys = [keys.client_owner(client_id)]
            for namespace in NAMESPACES:
                script_keys += self._namespace_keys(client_id, namespace)[:2]
            script_keys.append(keys.client_alias_maximum(client_id))
            args: list[Any] = [copy.owner.node_id, copy.owner.epoch]
            if copy.tables is None:
                args.append("forget")
            else:
                (in_max, inbound), (out_max, outbound) = copy.tables
                args += ["set", in_max, out_max, len(inbound)]
                for bound in (inbound, outbound):
                    for alias, topic in bound.items():
                        args += [alias, topic]
            calls.append((script_keys, args))
        replies = await self._scripts.run_many("alias_replace", calls)
        return [reply if isinstance(reply, RouterError) else int(reply) for reply in replies]
