"""A pytest plugin for python-socketio's own suite: the manager it builds is the router's.

``tests/integrations/test_socketio_suite.py`` runs the suite of the pinned release
(``tests/support/framework_suites.py``) in a subprocess, with this directory on
``PYTHONPATH`` and ``-p socketio_swap`` (a top-level name: the suite's own package is
called ``tests`` too). The environment says what to swap and where:

* ``ROUTER_SUITE_SWAP``: ``pubsub`` (``socketio.async_pubsub_manager.AsyncPubSubManager``,
  for ``tests/async/test_pubsub_manager.py``) or ``manager``
  (``socketio.async_manager.AsyncManager``, for ``tests/async/test_manager.py``);
* ``ROUTER_SUITE_REDIS_URL`` and ``ROUTER_SUITE_PREFIX``: the Redis and key prefix of the
  nodes the managers start (each manager its own, on first use);
* ``ROUTER_SUITE_CONTROL=1``: swap in python-socketio's own ``AsyncRedisManager`` on that
  Redis instead (the control: a test that fails with it too fails for being a pub/sub
  manager, not for being the router's).

The suite builds its managers by attribute (``async_pubsub_manager.AsyncPubSubManager()``),
so replacing the attribute swaps every one; each is closed (its node stopped) after its
test, in the test's event loop. The session ends with a line ``socketio_swap: built B,
started S`` (managers built, nodes they started), so the caller sees the swap happened.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
import socketio.async_manager
import socketio.async_pubsub_manager
from socketio.async_redis_manager import AsyncRedisManager

from router.integrations.socketio_manager import RouterManager

URL = os.environ["ROUTER_SUITE_REDIS_URL"]
OPTIONS = {
    "prefix": os.environ["ROUTER_SUITE_PREFIX"],
    "heartbeat_interval": 0.2,
    "heartbeat_ttl": 1.0,
}
_made: list[RouterManager] = []
_figures = {"built": 0, "started": 0}


class SuiteManager(RouterManager):
    """The router's manager, built with python-socketio's arguments (the suite's)."""

    def __init__(
        self,
        channel: str = "socketio",
        write_only: bool = False,
        logger: Any = None,
        json: Any = None,
    ) -> None:
        super().__init__(URL, channel, write_only, logger, json, node_options=OPTIONS)
        _made.append(self)
        _figures["built"] += 1


class ControlManager(AsyncRedisManager):  # type: ignore[misc]
    """python-socketio's Redis manager, built with the suite's arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(URL, *args, **kwargs)
        _figures["built"] += 1


SWAPPED = ControlManager if os.environ.get("ROUTER_SUITE_CONTROL") == "1" else SuiteManager
if os.environ["ROUTER_SUITE_SWAP"] == "manager":
    socketio.async_manager.AsyncManager = SWAPPED
else:
    socketio.async_pubsub_manager.AsyncPubSubManager = SWAPPED


@pytest_asyncio.fixture(autouse=True, loop_scope="function")
async def close_managers() -> AsyncIterator[None]:
    yield
    while _made:
        manager = _made.pop()
        _figures["started"] += manager.node is not None
        await manager.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(
        f"socketio_swap: built {_figures['built']}, started {_figures['started']}"
    )
