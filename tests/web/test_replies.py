"""What every endpoint shares, without a node: the status of each kind of error (Redis
down is 503, nothing else), errors told in words, and the depth scan of a body (a table,
then against a brute-force scan on any JSON)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from router.errors import (
    AccessDeniedError,
    AclRuleError,
    BodyTooLargeError,
    ClientNotFoundError,
    CorruptStateError,
    InvalidSettingError,
    LoginRequiredError,
    LoginThrottledError,
    PublishTimeoutError,
    RequestError,
    ResyncRequiredError,
    RetainedStoreFullError,
    RouteWriteError,
    ScriptError,
    SessionInUseError,
    SessionOwnershipError,
    StateAccessError,
    StateFailureError,
    StateUnavailableError,
    SubscriptionNotFoundError,
    WeakPasswordError,
)
from router.web.replies import MAX_DEPTH, error_reply, nests_deeper, status_of

STATUSES: list[tuple[BaseException, int]] = [
    (LoginRequiredError("log in"), 401),
    (AccessDeniedError("viewer"), 403),
    (LoginThrottledError("too many", 7.2), 429),
    (ClientNotFoundError("c", "has no session"), 404),
    (SubscriptionNotFoundError("gone"), 404),
    (RequestError("bad field"), 400),
    (BodyTooLargeError(10), 413),
    (InvalidSettingError("position"), 400),
    (AclRuleError("no verb"), 400),
    (WeakPasswordError(12), 400),
    (ScriptError("the position must be an integer >= 0"), 400),  # (was 503)
    (CorruptStateError("not an integer"), 409),  # (was 503)
    (SessionOwnershipError("moved"), 409),  # (was 503)
    (ResyncRequiredError("gone"), 409),  # (was 503)
    (SessionInUseError("kick it first"), 409),
    (RetainedStoreFullError("t", 10), 409),
    (StateUnavailableError(ConnectionError("refused")), 503),
    (StateAccessError(ConnectionError("NOAUTH"), credentials=True), 503),
    (StateFailureError(RuntimeError("OOM")), 503),
    (PublishTimeoutError(5.0), 503),
    (RouteWriteError("n1", RuntimeError("down")), 503),
    (TimeoutError(), 503),
    (RuntimeError("a bug"), 500),
]


@pytest.mark.parametrize(("error", "status"), STATUSES, ids=lambda v: type(v).__name__)
def test_only_redis_failing_is_503(error: BaseException, status: int) -> None:
    assert status_of(error) == status


@pytest.mark.parametrize(("error", "status"), STATUSES, ids=lambda v: type(v).__name__)
def test_every_error_reply_names_its_type_and_says_what_in_words(
    error: BaseException, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    answer = error_reply(error)
    body = json.loads(answer.body)  # type: ignore[arg-type]
    assert answer.status == status and set(body) == {"error", "message"}
    assert body["message"] and body["message"] != body["error"]
    assert not body["message"].endswith(":")
    if status == 429:
        assert answer.headers["Retry-After"] == "8"  # (whole seconds, rounded up)


def test_an_error_without_a_message_is_told_by_its_description() -> None:
    body = json.loads(error_reply(SessionInUseError()).body)  # type: ignore[arg-type]
    assert body == {
        "error": "SessionInUseError",
        "message": "An operator asked to clear the session of a connected client: kick it "
        "first (HTTP 409).",
    }


def nest(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


DEPTHS: list[tuple[str, bool]] = [
    ("", False),
    ('{"topic": "t"}', False),
    (nest(MAX_DEPTH), False),
    (nest(MAX_DEPTH + 1), True),
    ("[" * MAX_DEPTH, False),  # (unpaired, not deep: the parser refuses it)
    ("[" * (MAX_DEPTH + 1), True),
    ("[" * 100_000, True),
    ("]" * 100 + "[" * 10, False),
    ("{" * 17 + nest(16) + "}" * 17, True),
    ("{" * 16 + nest(16) + "}" * 16, False),
    ("[[]" * 40, True),
    ("[[]" * 30 + "]" * 30, False),
    (nest(20) * 50, False),
    ('{"p": "' + "[{" * 50_000 + '"}', False),  # (brackets in a string are text)
    ('["\\"' + "[" * 100 + '"]', False),  # (an escaped quote does not end the string)
    ('["\\\\"' + "[" * 100, True),  # (an escaped backslash does not escape the quote)
    (nest(MAX_DEPTH - 1, '["a[", {"b": []}]'), True),
]


@pytest.mark.parametrize(("text", "deeper"), DEPTHS, ids=lambda v: repr(v)[:30])
def test_the_depth_scan(text: str, deeper: bool) -> None:
    assert nests_deeper(text.encode()) is deeper


def brute_depth(text: str) -> int:
    """The deepest nesting, one character at a time (the model of nests_deeper)."""
    depth = deepest = 0
    inside = escaped = False
    for char in text:
        if inside:
            escaped, inside = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            inside = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


JSON = st.recursive(
    st.none() | st.integers() | st.text(alphabet='ab[]{}"\\', max_size=4),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(alphabet='k[{"\\', max_size=3), children, max_size=3)
    ),
    max_leaves=80,
)


@given(value=JSON, limit=st.integers(1, 8))
def test_the_depth_scan_agrees_with_a_brute_force_one(value: object, limit: int) -> None:
    text = json.dumps(value)
    assert nests_deeper(text.encode(), limit) is (brute_depth(text) > limit)
