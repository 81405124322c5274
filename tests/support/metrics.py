"""Reading a node's Prometheus endpoint in tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(address: str, timeout: float = 10.0) -> dict[str, float]:
    """The samples of a node's ``/metrics`` at ``address`` (HOST:PORT), by sample name
    (labels dropped: the last sample of a name wins)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
