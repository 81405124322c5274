"""A pytest plugin for channels_redis's own test suite: its two layers become ours.

``pytest -p tests.integrations.channels_swap`` (run in the unpacked source distribution,
see tests/support/framework_suites.py) replaces ``channels_redis.core.RedisChannelLayer``
and ``channels_redis.pubsub.RedisPubSubChannelLayer`` before the suite imports them, with
a factory that builds a :class:`RouterChannelLayer` on the Redis named by
``$ROUTER_CHANNELS_SUITE_URL``, under the key prefix ``$ROUTER_CHANNELS_SUITE_PREFIX``
(the suite's ``hosts`` point at localhost:6379, which is not ours), plus the xdist worker's
name: the suite's tests share group and channel names. Every test's outcome
goes to the JSON file ``$ROUTER_CHANNELS_SUITE_REPORT`` names: ``{node id: outcome}``,
the outcome one of passed, failed, error, skipped, xfailed, xpassed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import channels_redis.core
import channels_redis.pubsub
import pytest

from router.integrations.channels_layer import RouterChannelLayer

URL_VARIABLE = "ROUTER_CHANNELS_SUITE_URL"
PREFIX_VARIABLE = "ROUTER_CHANNELS_SUITE_PREFIX"
REPORT_VARIABLE = "ROUTER_CHANNELS_SUITE_REPORT"


def router_layer(
    hosts: object = None,
    prefix: str = "asgi",
    expiry: float = 60,
    group_expiry: float = 86400,
    capacity: int = 100,
    channel_capacity: dict[Any, int] | None = None,
    symmetric_encryption_keys: object = None,
    **ignored: Any,
) -> RouterChannelLayer:
    """What the suite's ``RedisChannelLayer(...)`` / ``RedisPubSubChannelLayer(...)`` builds.

    ``hosts`` and the key ``prefix`` give way to the environment's server and namespace
    (every layer of a run shares them, as the suite's layers share localhost:6379)."""
    if symmetric_encryption_keys is not None:
        raise NotImplementedError("RouterChannelLayer does not encrypt messages")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # (each worker a namespace of its own)
    return RouterChannelLayer(
        os.environ[URL_VARIABLE],
        prefix=os.environ[PREFIX_VARIABLE] + worker,
        expiry=expiry,
        group_expiry=group_expiry,
        capacity=capacity,
        channel_capacity=channel_capacity,
    )


channels_redis.core.RedisChannelLayer = router_layer  # type: ignore[assignment,misc]
channels_redis.pubsub.RedisPubSubChannelLayer = router_layer  # type: ignore[assignment,misc]

_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when == "setup" and report.failed:
            outcome = "error"
        else:
            outcome = report.outcome
        _outcomes[report.nodeid] = outcome
    elif report.when == "teardown" and report.failed:
        _outcomes[report.nodeid] = "error"


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(REPORT_VARIABLE)
    if target and not hasattr(session.config, "workerinput"):  # (xdist: the controller's)
        Path(target).write_text(json.dumps(_outcomes, indent=1, sort_keys=True))
