"""A brute-force model of the subscription trie: a dict and a linear scan."""

from __future__ import annotations

from router.core.topics import filter_matches_levels, parse_shared


def plain_part(topic_filter: str) -> str:
    shared = parse_shared(topic_filter)
    return shared.filter if shared else topic_filter


def brute_matches(topic_filter: str, topic: str) -> bool:
    """Match by the written rules, one filter at a time (inputs already valid)."""
    return filter_matches_levels(plain_part(topic_filter).split("/"), topic.split("/"))


class BruteModel:
    """client -> {filter: qos}, matched by scanning every subscription."""

    def __init__(self) -> None:
        self.subs: dict[str, dict[str, int]] = {}

    def subscribe(self, client_id: str, topic_filter: str, qos: int) -> bool:
        mine = self.subs.setdefault(client_id, {})
        new = topic_filter not in mine
        mine[topic_filter] = qos
        return new

    def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        mine = self.subs.get(client_id, {})
        if topic_filter not in mine:
            return False
        del mine[topic_filter]
        if not mine:
            del self.subs[client_id]
        return True

    def remove_client(self, client_id: str) -> int:
        return len(self.subs.pop(client_id, {}))

    def plain_clients(self, topic: str) -> set[str]:
        return {
            client_id
            for client_id, mine in self.subs.items()
            for topic_filter in mine
            if parse_shared(topic_filter) is None and brute_matches(topic_filter, topic)
        }

    def groups(self, topic: str) -> dict[str, set[str]]:
        """Matching shared filters and their members."""
        found: dict[str, set[str]] = {}
        for client_id, mine in self.subs.items():
            for topic_filter in mine:
                if parse_shared(topic_filter) is not None and brute_matches(topic_filter, topic):
                    found.setdefault(topic_filter, set()).add(client_id)
        return found

    def __len__(self) -> int:
        return sum(len(mine) for mine in self.subs.values())
