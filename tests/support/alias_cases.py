"""One table of topic-alias behaviour, run against every alias store.

Each case is a list of steps. A step is a tuple whose first item names the operation:

    ("bind", client, namespace, alias, topic)          must succeed
    ("bind!", client, namespace, alias, topic)         must raise a RouterError, change nothing
    ("maximum", client, namespace, maximum)            set the Topic Alias Maximum
    ("topic", client, namespace, alias, expected)      lookup alias -> topic (None on a miss)
    ("alias", client, namespace, topic, expected)      lookup topic -> alias (None on a miss)
    ("remove_client", client, expected_count)          forget the client's aliases
"""

from __future__ import annotations

from typing import Any

Step = tuple[Any, ...]

ALIAS_CASES: dict[str, list[Step]] = {
    "bind and look up both ways": [
        ("bind", "c1", "client", 1, "a/b"),
        ("topic", "c1", "client", 1, "a/b"),
        ("alias", "c1", "client", "a/b", 1),
    ],
    "misses return None": [
        ("topic", "c1", "client", 7, None),
        ("alias", "c1", "server", "x", None),
    ],
    "namespaces are separate": [
        ("bind", "c1", "client", 1, "in/topic"),
        ("bind", "c1", "server", 1, "out/topic"),
        ("topic", "c1", "client", 1, "in/topic"),
        ("topic", "c1", "server", 1, "out/topic"),
        ("alias", "c1", "server", "in/topic", None),
    ],
    "clients are separate": [
        ("bind", "c1", "client", 1, "t"),
        ("topic", "c2", "client", 1, None),
    ],
    "rebinding an alias forgets its old topic": [
        ("bind", "c1", "client", 1, "old"),
        ("bind", "c1", "client", 1, "new"),
        ("topic", "c1", "client", 1, "new"),
        ("alias", "c1", "client", "old", None),
        ("alias", "c1", "client", "new", 1),
    ],
    "rebinding a topic forgets its old alias": [
        ("bind", "c1", "server", 1, "t"),
        ("bind", "c1", "server", 2, "t"),
        ("alias", "c1", "server", "t", 2),
        ("topic", "c1", "server", 1, None),
        ("topic", "c1", "server", 2, "t"),
    ],
    "rebinding both at once keeps one pair": [
        ("bind", "c1", "client", 1, "a"),
        ("bind", "c1", "client", 2, "b"),
        ("bind", "c1", "client", 1, "b"),
        ("topic", "c1", "client", 1, "b"),
        ("topic", "c1", "client", 2, None),
        ("alias", "c1", "client", "a", None),
        ("alias", "c1", "client", "b", 1),
    ],
    "the whole alias range": [
        ("bind", "c1", "client", 65535, "last"),
        ("topic", "c1", "client", 65535, "last"),
        ("bind!", "c1", "client", 0, "zero"),
        ("bind!", "c1", "client", 65536, "too/big"),
        ("bind!", "c1", "client", -1, "negative"),
        ("bind!", "c1", "client", "1", "not/an/int"),
        ("alias", "c1", "client", "zero", None),
        ("alias", "c1", "client", "too/big", None),
    ],
    "a per-client maximum": [
        ("maximum", "c1", "client", 10),
        ("bind", "c1", "client", 10, "ten"),
        ("bind!", "c1", "client", 11, "eleven"),
        ("topic", "c1", "client", 11, None),
        ("bind", "c2", "client", 11, "other/client"),
    ],
    "bad namespaces and topics change nothing": [
        ("bind", "c1", "client", 1, "keep"),
        ("bind!", "c1", "sideways", 1, "x"),
        ("bind!", "c1", "client", 1, "wild/+"),
        ("bind!", "c1", "client", 1, ""),
        ("topic", "c1", "client", 1, "keep"),
    ],
    "remove a client": [
        ("bind", "c1", "client", 1, "a"),
        ("bind", "c1", "server", 1, "b"),
        ("bind", "c1", "server", 2, "c"),
        ("bind", "c2", "client", 1, "a"),
        ("remove_client", "c1", 3),
        ("topic", "c1", "client", 1, None),
        ("alias", "c1", "server", "c", None),
        ("topic", "c2", "client", 1, "a"),
        ("remove_client", "c1", 0),
    ],
    "unicode topics": [
        ("bind", "c1", "client", 3, "wetter/zürich/°C"),
        ("alias", "c1", "client", "wetter/zürich/°C", 3),
    ],
}
