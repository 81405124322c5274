"""Redis failing, as the state layer tells it: redis-py's errors become the router's.

A table of redis-py's exceptions and what each becomes (router/state/failures.py).
"""

from __future__ import annotations

import pytest
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    ConnectionError as RedisConnectionError,
    CrossSlotTransactionError,
    DataError,
    ExecAbortError,
    MasterDownError,
    MaxConnectionsError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError as RedisTimeoutError,
    TryAgainError,
)

from router.errors import (
    RouterError,
    StateAccessError,
    StateFailureError,
    StateUnavailableError,
)
from router.state.failures import state_error, translating

# -- the mapping -----------------------------------------------------------------------------

# (redis-py's error, the router's class, StateAccessError.credentials or None)
MAPPING: list[tuple[BaseException, type[StateFailureError], bool | None]] = [
    (RedisConnectionError("Connection refused"), StateUnavailableError, None),
    (RedisTimeoutError("Timeout reading from socket"), StateUnavailableError, None),
    (BusyLoadingError("Redis is loading the dataset in memory"), StateUnavailableError, None),
    (MaxConnectionsError("Too many connections"), StateUnavailableError, None),
    (ClusterDownError("The cluster is down"), StateUnavailableError, None),
    (MasterDownError("Link with MASTER is down"), StateUnavailableError, None),
    (ClusterError("TTL exhausted."), StateUnavailableError, None),
    (TryAgainError("Multiple keys request during rehashing of slot"), StateUnavailableError, None),
    (SlotNotCoveredError("slot 3 is not covered"), StateUnavailableError, None),
    (RedisClusterException("Redis Cluster cannot be connected"), StateUnavailableError, None),
    (AuthenticationError("invalid username-password pair"), StateAccessError, True),
    (AuthorizationError("not allowed"), StateAccessError, True),
    (NoPermissionError("this user has no permissions to run 'evalsha'"), StateAccessError, False),
    (
        OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
        StateFailureError,
        None,
    ),
    (ReadOnlyError("You can't write against a read only replica."), StateFailureError, None),
    (ResponseError("WRONGTYPE Operation against a key"), StateFailureError, None),
    (ExecAbortError("Transaction discarded"), StateFailureError, None),
    (DataError("Invalid input of type: 'NoneType'"), StateFailureError, None),
    (CrossSlotTransactionError("keys in different slots"), StateFailureError, None),
]


@pytest.mark.parametrize(
    ("error", "kind", "credentials"), MAPPING, ids=[type(e).__name__ for e, _, _ in MAPPING]
)
def test_each_redis_error_becomes_the_routers(
    error: BaseException, kind: type[StateFailureError], credentials: bool | None
) -> None:
    translated = state_error(error)
    assert type(translated) is kind
    assert isinstance(translated, RouterError)
    assert translated.cause is error
    if credentials is not None:
        assert isinstance(translated, StateAccessError)
        assert translated.credentials is credentials
    assert str(error) in str(translated)


def test_the_messages_say_what_the_cli_said() -> None:
    assert str(state_error(RedisConnectionError("x"))) == "cannot reach Redis: x"
    assert str(state_error(AuthenticationError("x"))) == "Redis refused the credentials: x"
    assert str(state_error(NoPermissionError("x"))).startswith(
        "Redis denies a command the router needs (see README, Redis ACL): "
    )
    assert str(state_error(OutOfMemoryError("x"))) == "Redis error: x"
    assert str(state_error(RedisTimeoutError())) == "cannot reach Redis: TimeoutError"


def test_translating_chains_redis_errors_and_lets_others_pass() -> None:
    cause = RedisTimeoutError("slow")
    with pytest.raises(StateUnavailableError) as raised, translating:
        raise cause
    assert raised.value.__cause__ is cause and raised.value.cause is cause
    with pytest.raises(KeyError), translating:
        raise KeyError("not Redis")
    with translating:
        pass
