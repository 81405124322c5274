"""The hook registry: priority order, fold results, crash skipping, duplicates, async."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from router.core.hooks import (
    OK,
    STOP,
    ClientInfo,
    Decision,
    DropReason,
    HookPoint,
    HookRegistry,
    HookResult,
    Ok,
    Stop,
)
from router.errors import DuplicateHookError, HookError, InvalidIdError, RouterError

POINT = HookPoint.MESSAGE_PUBLISH


def appender(tag: str, result: HookResult = None) -> Any:
    """A fold callback that appends ``tag`` to the list accumulator it gets."""

    def callback(*args: Any) -> HookResult:
        acc = args[-1]
        if result is None:
            return Ok([*acc, tag])
        return result

    callback.__qualname__ = f"appender_{tag}"
    return callback


def test_every_required_hook_point_exists() -> None:
    required = {
        "client.authenticate",
        "client.check_acl",
        "client.connected",
        "client.disconnected",
        "client.subscribe",
        "client.unsubscribe",
        "message.publish",
        "message.delivered",
        "message.acked",
        "message.dropped",
    }
    assert required <= set(HookRegistry().points())
    assert DropReason.NO_SUBSCRIBERS.value == "no_subscribers"
    assert str(HookPoint.CLIENT_CHECK_ACL) == "client.check_acl"


def test_callbacks_run_by_priority_then_registration_order() -> None:
    registry = HookRegistry()
    registry.register(POINT, appender("low"), priority=-5)
    registry.register(POINT, appender("first0"))
    registry.register(POINT, appender("high"), priority=10)
    registry.register(POINT, appender("second0"))
    registry.register(POINT, appender("higher"), priority=11)
    assert registry.run_fold(POINT, (), []) == ["higher", "high", "first0", "second0", "low"]
    assert [e.priority for e in registry.entries(POINT)] == [11, 10, 0, 0, -5]


@pytest.mark.parametrize(
    ("middle", "expected"),
    [
        (OK, ["a", "c"]),  # go on unchanged
        (None, ["a", "c"]),  # None counts as OK
        (Ok(["new"]), ["new", "c"]),  # go on with new
        (STOP, ["a"]),  # return the current accumulator
        (Stop(["final"]), ["final"]),  # return new
    ],
)
def test_fold_results(middle: HookResult, expected: list[str]) -> None:
    registry = HookRegistry()
    registry.register(POINT, appender("a"), priority=3)
    registry.register(POINT, lambda acc: middle, priority=2)
    registry.register(POINT, appender("c"), priority=1)
    assert registry.run_fold(POINT, (), []) == expected


def test_fold_passes_args_then_the_accumulator() -> None:
    registry = HookRegistry()
    seen = []

    def callback(client: ClientInfo, topic: str, acc: int) -> HookResult:
        seen.append((client.client_id, topic, acc))
        return Ok(acc + 1)

    registry.register(POINT, callback)
    assert registry.run_fold(POINT, (ClientInfo("c1"), "a/b"), 41) == 42
    assert seen == [("c1", "a/b", 41)]


def test_a_crashing_callback_is_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry()

    def broken(acc: list[str]) -> HookResult:
        raise RuntimeError("boom")

    registry.register(POINT, appender("before"), priority=2)
    registry.register(POINT, broken, priority=1)
    registry.register(POINT, appender("after"), priority=0)
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        assert registry.run_fold(POINT, (), []) == ["before", "after"]
    [record] = caplog.records
    assert record.name == "router.core.hooks"
    assert "message.publish" in record.getMessage()
    assert "broken" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)


def test_a_crash_in_run_is_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry()
    calls: list[str] = []
    registry.register(HookPoint.CLIENT_CONNECTED, lambda c: 1 / 0, priority=1)
    registry.register(HookPoint.CLIENT_CONNECTED, calls.append)
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        assert registry.run(HookPoint.CLIENT_CONNECTED, ("c1",)) is True
    assert calls == ["c1"]
    assert len(caplog.records) == 1
    assert caplog.records[0].exc_info is not None


def test_an_unknown_result_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry()
    registry.register(POINT, lambda acc: "stop", priority=1)  # a bare string is not STOP
    registry.register(POINT, appender("next"))
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        assert registry.run_fold(POINT, (), []) == ["next"]
    assert "'stop'" in caplog.records[0].getMessage()


def test_base_exceptions_are_not_swallowed() -> None:
    registry = HookRegistry()

    def interrupt(acc: object) -> HookResult:
        raise KeyboardInterrupt

    registry.register(POINT, interrupt)
    with pytest.raises(KeyboardInterrupt):
        registry.run_fold(POINT, (), None)


def test_run_notifies_until_a_callback_stops() -> None:
    registry = HookRegistry()
    calls: list[str] = []
    point = HookPoint.CLIENT_DISCONNECTED
    registry.register(point, lambda c, r: calls.append("a"), priority=3)
    registry.register(point, lambda c, r: STOP, priority=2)
    registry.register(point, lambda c, r: calls.append("c"), priority=1)
    assert registry.run(point, ("c1", "normal")) is False
    assert calls == ["a"]
    assert HookRegistry().run(point, ("c1", "normal")) is True


def test_duplicate_registration_is_refused() -> None:
    registry = HookRegistry()
    callback = appender("x")
    registry.register(POINT, callback)
    with pytest.raises(DuplicateHookError) as caught:
        registry.register(POINT, callback, priority=9)
    assert isinstance(caught.value, HookError)
    assert isinstance(caught.value, RouterError)
    assert [e.priority for e in registry.entries(POINT)] == [0]
    # The same callback at another point is fine.
    registry.register(HookPoint.MESSAGE_DELIVERED, callback)


def test_the_same_bound_method_counts_as_a_duplicate() -> None:
    class Plugin:
        def on_publish(self, acc: object) -> HookResult:
            return OK

    plugin, other = Plugin(), Plugin()
    registry = HookRegistry()
    registry.register(POINT, plugin.on_publish)
    with pytest.raises(DuplicateHookError):
        registry.register(POINT, plugin.on_publish)
    registry.register(POINT, other.on_publish)  # another object's method is another callback
    assert registry.unregister(POINT, plugin.on_publish) is True
    assert [e.callback for e in registry.entries(POINT)] == [other.on_publish]


def test_unregister() -> None:
    registry = HookRegistry()
    a, b = appender("a"), appender("b")
    registry.register(POINT, a)
    registry.register(POINT, b)
    assert registry.unregister(POINT, a) is True
    assert registry.unregister(POINT, a) is False
    assert registry.run_fold(POINT, (), []) == ["b"]
    registry.register(POINT, a)  # registering again after removal is allowed
    assert registry.run_fold(POINT, (), []) == ["b", "a"]


def test_changes_during_a_run_apply_to_the_next_run() -> None:
    registry = HookRegistry()
    late = appender("late")

    def adder(acc: list[str]) -> HookResult:
        if registry.unregister(POINT, late) is False:
            registry.register(POINT, late)
        return Ok([*acc, "adder"])

    registry.register(POINT, adder, priority=1)
    assert registry.run_fold(POINT, (), []) == ["adder"]
    assert [e.callback for e in registry.entries(POINT)] == [adder, late]


def test_unknown_points_and_bad_registrations_are_refused() -> None:
    registry = HookRegistry()
    with pytest.raises(HookError):
        registry.register("message.publsh", appender("x"))
    with pytest.raises(HookError):
        registry.run_fold("nope", (), None)
    with pytest.raises(HookError):
        registry.run("nope")
    with pytest.raises(HookError):
        registry.register(POINT, "not callable")  # type: ignore[arg-type]
    with pytest.raises(HookError):
        registry.register(POINT, appender("x"), priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(HookError):
        registry.declare("")
    registry.declare("plugin.custom")
    registry.register("plugin.custom", appender("x"))
    assert registry.run_fold("plugin.custom", (), []) == ["x"]
    assert registry.entries(POINT) == []


def test_plain_strings_and_members_name_the_same_point() -> None:
    registry = HookRegistry()
    callback = appender("x")
    registry.register("message.publish", callback)
    with pytest.raises(DuplicateHookError):
        registry.register(HookPoint.MESSAGE_PUBLISH, callback)
    assert registry.run_fold(HookPoint.MESSAGE_PUBLISH, (), []) == ["x"]


def test_sync_runs_refuse_async_callbacks(caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry()

    async def slow(acc: list[str]) -> HookResult:
        return Stop(["never"])

    registry.register(POINT, slow, priority=1)
    registry.register(POINT, appender("sync"))
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        # The coroutine is closed, so no "never awaited" warning (warnings are errors here).
        assert registry.run_fold(POINT, (), []) == ["sync"]
        assert registry.run(POINT, ([],)) is True
    assert len(caplog.records) == 2
    assert all("arun" in record.getMessage() for record in caplog.records)


async def test_async_fold_awaits_and_mixes_with_sync(caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry()

    async def remote(acc: list[str]) -> HookResult:
        return Ok([*acc, "remote"])

    async def crashing(acc: list[str]) -> HookResult:
        raise ValueError("backend down")

    async def stopper(acc: list[str]) -> HookResult:
        return STOP

    registry.register(POINT, remote, priority=4)
    registry.register(POINT, crashing, priority=3)
    registry.register(POINT, appender("sync"), priority=2)
    registry.register(POINT, stopper, priority=1)
    registry.register(POINT, appender("unreached"), priority=0)
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        assert await registry.arun_fold(POINT, (), []) == ["remote", "sync"]
    [record] = caplog.records
    assert "crashing" in record.getMessage()
    assert await registry.arun(POINT, ([],)) is False


async def test_async_run_notifies_everyone() -> None:
    registry = HookRegistry()
    calls = []

    async def note(client: str) -> None:
        calls.append(("async", client))

    registry.register(HookPoint.CLIENT_CONNECTED, note)
    registry.register(HookPoint.CLIENT_CONNECTED, lambda c: calls.append(("sync", c)))
    assert await registry.arun(HookPoint.CLIENT_CONNECTED, ("c9",)) is True
    assert calls == [("async", "c9"), ("sync", "c9")]


def test_client_info_and_decision_values() -> None:
    client = ClientInfo("c1", "alice")
    assert (client.client_id, client.username) == ("c1", "alice")
    assert ClientInfo("c2").username is None
    for bad in ("", None, 3):
        with pytest.raises(InvalidIdError):
            ClientInfo(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        ClientInfo("c1", 5)  # type: ignore[arg-type]
    assert Decision.allow("ok") == Decision(True, "ok")
    assert Decision.deny("no") == Decision(False, "no")


def only_lists(value: Any) -> list[str]:
    """A fold check that accepts lists of str only."""
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise HookError(f"not a list of str: {value!r}")
    return value


@pytest.mark.parametrize("bad", [Ok(42), Stop("nope")])
async def test_a_check_skips_a_value_it_refuses(
    caplog: pytest.LogCaptureFixture, bad: HookResult
) -> None:
    registry = HookRegistry()
    registry.register(POINT, appender("first"), priority=2)
    registry.register(POINT, lambda acc: bad, priority=1)
    registry.register(POINT, appender("last"))
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        # Skipped like a crash: a refused Stop does not stop, a refused Ok changes nothing.
        assert registry.run_fold(POINT, (), [], only_lists) == ["first", "last"]
        assert await registry.arun_fold(POINT, (), [], only_lists) == ["first", "last"]
    assert len(caplog.records) == 2
    assert "not a list of str" in caplog.records[0].getMessage()


def test_listeners_hear_every_change_and_active_says_what_has_callbacks() -> None:
    registry = HookRegistry()
    changes = []
    registry.add_listener(lambda: changes.append(registry.active(POINT)))
    assert registry.active(POINT) is False
    assert registry.active("no.such.point") is False
    callback = appender("x")
    registry.register(POINT, callback)
    assert registry.active(POINT) is True
    registry.unregister(POINT, callback)
    assert changes == [True, False]
    again = appender("y")
    registry.register(POINT, again)
    with pytest.raises(DuplicateHookError):
        registry.register(POINT, again)
    assert changes == [True, False, True]  # a refused registration changes nothing
