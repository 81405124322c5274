"""The workloads of ``router bench match`` (and of its ``hot`` run): seeded subscriptions
and publish topics, the same for the same seed.

Workloads:

* ``devices``: 100k subscriptions of device fleets, ~70% exact filters and the rest with
  ``+``/``#`` close to the device, so few clients want any one publish;
* ``dashboards``: the same plus dashboards with broad wildcards, so a publish goes to
  more than 20 clients on average.

Shapes written to check that the core is not tuned to those two (each also beside
paho):

* ``fanout``: 4-level topics over 96 values a level; 40% exact filters, 30% one ``+``,
  15% two ``+``, 15% ``#`` after 1-3 levels: about 55 clients a topic at 100k
  subscriptions, through exact, ``+`` and ``#`` filters alike;
* ``deep``: 10-level topics over 6 values a level, filters with 0-3 ``+`` anywhere and a
  fifth of them cut short by ``#``: a few hundred matching filters a topic;
* ``large``: ten times the subscriptions (1M by default) of an ``org/S/dev/D/M`` fleet,
  80% exact; asked for by name only (it takes a minute).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from router.errors import BenchSetupError

METRICS = ("telemetry", "status", "cmd", "alert", "config")
SITES = 100
DEVICES_PER_SITE = 1000


@dataclass(frozen=True)
class MatchWorkload:
    """Subscriptions (client, filter) and the publish topics to match."""

    name: str
    subscriptions: list[tuple[str, str]]
    topics: list[str]


def _device(rng: random.Random) -> tuple[int, int]:
    return rng.randrange(SITES), rng.randrange(DEVICES_PER_SITE)


def device_subscription(rng: random.Random, index: int) -> tuple[str, str]:
    site, device = _device(rng)
    metric = rng.choice(METRICS)
    base = f"site/{site}/device/{device}"
    roll = rng.random()
    if roll < 0.70:
        topic_filter = f"{base}/{metric}"
    elif roll < 0.82:
        topic_filter = f"{base}/+"
    elif roll < 0.92:
        topic_filter = f"{base}/#"
    elif roll < 0.97:
        topic_filter = f"site/{site}/device/+/{metric}/{rng.randrange(50)}"
    else:
        topic_filter = f"site/+/device/{device}/{metric}"
    return f"app-{index % 40_000}", topic_filter


def _dashboard_subscription(rng: random.Random, index: int) -> tuple[str, str]:
    site = rng.randrange(SITES)
    metric = rng.choice(METRICS)
    roll = rng.random()
    if roll < 0.60:
        topic_filter = f"site/{site}/#"
    elif roll < 0.90:
        topic_filter = f"site/{site}/device/+/{metric}"
    elif roll < 0.995:
        topic_filter = f"site/+/device/+/{metric}"
    else:
        topic_filter = "#"
    return f"dash-{index}", topic_filter


def _topics(rng: random.Random, count: int) -> list[str]:
    topics = []
    for _ in range(count):
        site, device = _device(rng)
        topics.append(f"site/{site}/device/{device}/{rng.choice(METRICS)}")
    return topics


def _levels(rng: random.Random, values: int, count: int) -> list[str]:
    return [f"v{rng.randrange(values)}" for _ in range(count)]


def _fanout_filter(rng: random.Random) -> str:
    levels = _levels(rng, 96, 4)
    roll = rng.random()
    if roll < 0.30:
        levels[rng.randrange(1, 4)] = "+"
    elif roll < 0.45:
        for position in rng.sample(range(4), 2):
            levels[position] = "+"
    elif roll < 0.60:
        levels = [*levels[: rng.randrange(1, 4)], "#"]
    return "/".join(levels)


def _deep_filter(rng: random.Random) -> str:
    levels = _levels(rng, 6, 10)
    for position in rng.sample(range(10), rng.randrange(4)):
        levels[position] = "+"
    if rng.random() < 0.2:
        levels = [*levels[: rng.randrange(2, 10)], "#"]
    return "/".join(levels)


def _fleet_filter(rng: random.Random) -> str:
    site, device, metric = rng.randrange(1000), rng.randrange(1000), rng.choice(METRICS)
    roll = rng.random()
    if roll < 0.80:
        return f"org/{site}/dev/{device}/{metric}"
    if roll < 0.90:
        return f"org/{site}/dev/{device}/+"
    if roll < 0.97:
        return f"org/{site}/dev/{device}/#"
    return f"org/{site}/+/{device}/{metric}"


#: Every workload by name; ``large`` only when asked for.
WORKLOADS = ("devices", "dashboards", "fanout", "deep", "large")
DEFAULT_WORKLOADS = ("devices", "dashboards", "fanout", "deep", "hot")


def make_workload(name: str, subscriptions: int, topics: int, seed: int) -> MatchWorkload:
    """Build the workload ``name`` (one of :data:`WORKLOADS`), the same for the same seed.

    Raises BenchSetupError for an unknown name."""
    rng = random.Random(seed)
    if name == "devices":
        subs = [device_subscription(rng, i) for i in range(subscriptions)]
    elif name == "dashboards":
        broad = subscriptions // 100
        subs = [device_subscription(rng, i) for i in range(subscriptions - broad)]
        subs += [_dashboard_subscription(rng, i) for i in range(broad)]
    elif name == "fanout":
        subs = [(f"f-{i % 30_000}", _fanout_filter(rng)) for i in range(subscriptions)]
        return MatchWorkload(name, subs, ["/".join(_levels(rng, 96, 4)) for _ in range(topics)])
    elif name == "deep":
        subs = [(f"d-{i}", _deep_filter(rng)) for i in range(subscriptions)]
        return MatchWorkload(name, subs, ["/".join(_levels(rng, 6, 10)) for _ in range(topics)])
    elif name == "large":
        subs = [(f"u-{i % 200_000}", _fleet_filter(rng)) for i in range(10 * subscriptions)]
        fleet = [
            f"org/{rng.randrange(1000)}/dev/{rng.randrange(1000)}/{rng.choice(METRICS)}"
            for _ in range(topics)
        ]
        return MatchWorkload(name, subs, fleet)
    else:
        raise BenchSetupError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return MatchWorkload(name, subs, _topics(rng, topics))
