"""Topic aliases (MQTT 5.0, 3.3.2.3.4): per client, one table per direction.

``client`` is the inbound namespace (aliases the client set on its PUBLISH packets),
``server`` the outbound one (aliases this server chose for PUBLISH packets it sends).
Each namespace maps alias -> topic and topic -> alias and keeps both directions
consistent: binding an alias to a new topic forgets the alias's old topic, and binding a
topic to a new alias forgets the topic's old alias. Aliases are 1..65535 and, when a
Topic Alias Maximum was given for the client, at most that.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from router.core.topics import validate_topic
from router.errors import InvalidAliasError

Namespace = Literal["client", "server"]
NAMESPACES: Final[tuple[str, ...]] = get_args(Namespace)
MAX_ALIAS: Final = 65535


def check_namespace(namespace: str) -> None:
    """Raise :class:`InvalidAliasError` unless ``namespace`` is ``client`` or ``server``."""
    if namespace not in NAMESPACES:
        raise InvalidAliasError(namespace, f"the namespace must be one of {NAMESPACES}")


def check_alias(alias: object, maximum: int = MAX_ALIAS) -> int:
    """Return ``alias`` if it is an int in 1..maximum, else raise :class:`InvalidAliasError`."""
    if type(alias) is not int:
        raise InvalidAliasError(alias, "an alias must be an int")
    if not 1 <= alias <= maximum:
        raise InvalidAliasError(alias, f"an alias must be between 1 and {maximum}")
    return alias


class _Table:
    __slots__ = ("by_alias", "by_topic", "maximum")

    def __init__(self, maximum: int) -> None:
        self.by_alias: dict[int, str] = {}
        self.by_topic: dict[str, int] = {}
        self.maximum = maximum


class AliasTable:
    """Topic aliases of many clients, in two namespaces each."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, str], _Table] = {}

    def set_maximum(self, client_id: str, namespace: Namespace, maximum: int) -> None:
        """Set the client's Topic Alias Maximum for a namespace (0 forbids aliases).

        Existing aliases above the new maximum are dropped.
        """
        check_namespace(namespace)
        if type(maximum) is not int or not 0 <= maximum <= MAX_ALIAS:
            raise InvalidAliasError(maximum, f"a maximum must be between 0 and {MAX_ALIAS}")
        table = self._table(client_id, namespace, create=True)
        assert table is not None
        table.maximum = maximum
        for alias in [a for a in table.by_alias if a > maximum]:
            del table.by_topic[table.by_alias.pop(alias)]

    def bind(self, client_id: str, namespace: Namespace, alias: int, topic: str) -> None:
        """Make ``alias`` stand for ``topic`` in the client's namespace.

        Raises :class:`InvalidAliasError` for an alias outside 1..maximum and
        :class:`InvalidTopicError` for an invalid topic name; nothing changes then.
        """
        check_namespace(namespace)
        validate_topic(topic)
        table = self._table(client_id, namespace, create=False)
        check_alias(alias, table.maximum if table is not None else MAX_ALIAS)
        table = self._table(client_id, namespace, create=True)
        assert table is not None
        old_topic = table.by_alias.get(alias)
        if old_topic == topic:
            return
        if old_topic is not None:
            del table.by_topic[old_topic]
        old_alias = table.by_topic.get(topic)
        if old_alias is not None:
            del table.by_alias[old_alias]
        table.by_alias[alias] = topic
        table.by_topic[topic] = alias

    def topic(self, client_id: str, namespace: Namespace, alias: int) -> str | None:
        """The topic ``alias`` stands for, or None."""
        check_namespace(namespace)
        table = self._table(client_id, namespace, create=False)
        return table.by_alias.get(alias) if table is not None else None

    def alias(self, client_id: str, namespace: Namespace, topic: str) -> int | None:
        """The alias bound to ``topic``, or None."""
        check_namespace(namespace)
        table = self._table(client_id, namespace, create=False)
        return table.by_topic.get(topic) if table is not None else None

    def aliases(self, client_id: str, namespace: Namespace) -> dict[int, str]:
        """A copy of the namespace's alias -> topic map."""
        check_namespace(namespace)
        table = self._table(client_id, namespace, create=False)
        return dict(table.by_alias) if table is not None else {}

    def remove_client(self, client_id: str) -> int:
        """Forget every alias of the client (both namespaces); return how many there were."""
        removed = 0
        for namespace in NAMESPACES:
            table = self._tables.pop((client_id, namespace), None)
            if table is not None:
                removed += len(table.by_alias)
        return removed

    def _table(self, client_id: str, namespace: str, *, create: bool) -> _Table | None:
        key = (client_id, namespace)
        table = self._tables.get(key)
        if table is None and create:
            table = self._tables[key] = _Table(MAX_ALIAS)
        return table
