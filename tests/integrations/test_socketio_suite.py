"""python-socketio's own manager tests with the router's manager swapped in.

The suite of the pinned release (``suite_root("python_socketio")``) runs in a subprocess,
in its own directory with its own configuration, with our plugin
(``tests/integrations/socketio_swap.py``) making every manager it builds a
:class:`RouterManager` on the test's Redis; the results are read from a JUnit report.

* ``tests/async/test_pubsub_manager.py`` (python-socketio's pub/sub manager tests, with
  ``AsyncPubSubManager`` swapped): every test passes. The manager publishes the dict
  python-socketio builds, so the tests that mock ``_publish`` and assert that dict see
  it unchanged; the route (the topic) is chosen inside ``_publish``.
* ``tests/async/test_manager.py`` (the single-server ``AsyncManager``'s tests, with
  ``AsyncManager`` swapped): the tests listed in :data:`MANAGER_FAILURES` fail, each for
  a behaviour of every pub/sub manager, not of ours: python-socketio's own
  ``AsyncRedisManager``, swapped in the same way (the control), fails exactly the same.
* ``tests/async/test_redis_manager.py`` is not run: it tests ``AsyncRedisManager`` by name
  (URL schemes, redis-py and valkey connections), which no swap reaches.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest

from router.state.keys import Keys
from tests.support import framework_suites
from tests.support.cli import delete_namespace
from tests.support.framework_suites import suite_root

PLUGIN_DIR = Path(__file__).resolve().parent  # (socketio_swap.py, imported by its own name)
RUN_TIMEOUT = 120.0

PUBSUB_TESTS = "tests/async/test_pubsub_manager.py"
PUBSUB_COUNT = 49
MANAGER_TESTS = "tests/async/test_manager.py"
MANAGER_COUNT = 32
# The swap took: managers the suite built (one a test, and a few more), and the nodes they
# started on Redis (a test that connects a client starts one; the others mock _publish).
MINIMUM_BUILT = {PUBSUB_TESTS: 53, MANAGER_TESTS: 32}
MINIMUM_STARTED = {PUBSUB_TESTS: 9, MANAGER_TESTS: 30}
# A pub/sub manager's disconnect goes through the server (AsyncPubSubManager._handle_
# disconnect awaits server.disconnect(..., ignore_queue=True)); the suite's mock server
# for the plain AsyncManager has no awaitable disconnect, as the plain manager never
# calls it: TypeError "object MagicMock can't be used in 'await' expression".
THROUGH_THE_SERVER = "a pub/sub manager disconnects through the server, which the suite mocks"
MANAGER_FAILURES = {
    "test_pre_disconnect": THROUGH_THE_SERVER,
    "test_disconnect": THROUGH_THE_SERVER,
    "test_disconnect_default_namespace": THROUGH_THE_SERVER,
    "test_disconnect_twice": THROUGH_THE_SERVER,
    "test_disconnect_all": THROUGH_THE_SERVER,
    "test_disconnect_with_callbacks": THROUGH_THE_SERVER,
    "test_get_participants": THROUGH_THE_SERVER,
    # AsyncPubSubManager.emit refuses a callback without a room (ValueError: a reply must
    # find its way back across servers); the test asks one for a whole namespace.
    "test_emit_with_callback": "a pub/sub manager takes a callback only with a room",
}


@pytest.fixture(scope="module")
def suite() -> Path:
    return suite_root("python_socketio")


@pytest.fixture
def namespace(redis_standalone_url: str, keys: Keys) -> Iterator[str]:
    """The test's key prefix on the standalone Redis, deleted afterwards."""
    try:
        yield keys.prefix
    finally:
        delete_namespace(redis_standalone_url, keys)


def run_suite(
    suite: Path, tests: str, swap: str, url: str, prefix: str, report: Path, *, control: bool
) -> dict[str, str]:
    """Run ``tests`` of the suite with ``swap`` swapped; each test's name -> its outcome
    (``passed``, ``failed``, ``error``, ``skipped``)."""
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(PLUGIN_DIR), os.environ.get("PYTHONPATH")])
        ),
        "ROUTER_SUITE_SWAP": swap,
        "ROUTER_SUITE_REDIS_URL": url,
        "ROUTER_SUITE_PREFIX": prefix,
        "ROUTER_SUITE_CONTROL": "1" if control else "0",
    }
    arguments = ["--timeout", "30", f"--junitxml={report}", tests]
    finished = framework_suites.run_suite(suite, "socketio_swap", arguments, env, RUN_TIMEOUT)
    assert report.exists(), finished.stdout[-3000:] + finished.stderr[-3000:]
    swapped = re.search(r"socketio_swap: built (\d+), started (\d+)", finished.stdout)
    assert swapped is not None, finished.stdout[-3000:]
    built, started = int(swapped[1]), int(swapped[2])
    assert built >= MINIMUM_BUILT[tests], finished.stdout[-3000:]
    assert control or started >= MINIMUM_STARTED[tests], finished.stdout[-3000:]
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.attrib["name"]] = (
            {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
        )
    return outcomes


def test_the_pubsub_manager_suite_passes_with_the_router(
    suite: Path, redis_standalone_url: str, namespace: str, tmp_path: Path
) -> None:
    outcomes = run_suite(
        suite,
        PUBSUB_TESTS,
        "pubsub",
        redis_standalone_url,
        namespace,
        tmp_path / "r.xml",
        control=False,
    )
    assert len(outcomes) == PUBSUB_COUNT
    assert {name for name, outcome in outcomes.items() if outcome != "passed"} == set()


@pytest.mark.parametrize("control", [False, True], ids=["router", "redis-manager"])
def test_the_manager_suite_fails_only_where_any_pubsub_manager_does(
    suite: Path, redis_standalone_url: str, namespace: str, tmp_path: Path, control: bool
) -> None:
    outcomes = run_suite(
        suite,
        MANAGER_TESTS,
        "manager",
        redis_standalone_url,
        namespace,
        tmp_path / "r.xml",
        control=control,
    )
    assert len(outcomes) == MANAGER_COUNT
    failed = {name for name, outcome in outcomes.items() if outcome != "passed"}
    assert failed == set(MANAGER_FAILURES)
    assert {outcomes[name] for name in failed} == {"failed"}
