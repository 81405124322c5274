"""``router demo``: a local matching demo (the cluster demo arrives with the runtime)."""

from __future__ import annotations

import click

from router import SubscriptionTrie

DEMO_SUBSCRIPTIONS = [
    ("thermostat-app", "home/+/temperature"),
    ("logger", "home/#"),
    ("kitchen-panel", "home/kitchen/+"),
    ("ops", "$SYS/#"),
    ("worker-1", "$share/workers/jobs/#"),
    ("worker-2", "$share/workers/jobs/#"),
]

DEMO_TOPICS = ["home/kitchen/temperature", "home/garage/door", "jobs/resize/42", "$SYS/uptime"]


@click.command()
def demo() -> None:
    """Subscribe a few clients and show who receives which publish."""
    trie = SubscriptionTrie()
    for client_id, topic_filter in DEMO_SUBSCRIPTIONS:
        trie.subscribe(client_id, topic_filter)
    click.echo("Subscriptions:")
    click.echo(trie.dump())
    for topic in DEMO_TOPICS:
        click.echo(f"publish {topic!r:32} -> {', '.join(trie.match(topic)) or '(nobody)'}")
