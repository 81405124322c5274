"""redis-py's errors, told as the router's: what the state layer raises when Redis fails.

Nothing above the state layer sees a redis-py exception: every public call of a store
(and of :mod:`~router.state.connection`, :mod:`~router.state.reads`,
:mod:`~router.state.scan`) raises :class:`~router.errors.RouterError`\\ s only, so its
callers catch one hierarchy. redis-py's exception becomes the ``cause`` (and the
``__cause__``) of the router's::

    redis-py raises                                      the state layer raises
    -------------------------------------------------    ------------------------------
    ConnectionError (BusyLoadingError while a server     StateUnavailableError
      loads its data, MaxConnectionsError), TimeoutError,   (the same call may well work
      ClusterError (CLUSTERDOWN, MASTERDOWN, "TTL           a moment later)
      exhausted" after redirects), TryAgainError (a slot
      split by a migration), RedisClusterException (no
      node answered, SlotNotCoveredError)
    AuthenticationError, AuthorizationError,             StateAccessError, credentials
      ExternalAuthProviderError, AUTH with wrong arguments
    NoPermissionError (NOPERM: the ACL user may not)     StateAccessError, not credentials
    ResponseError with a script's code                   its domain error (scripts.py)
    any other RedisError (OOM, READONLY, WRONGTYPE,      StateFailureError
      EXECABORT, an unreadable reply, a DataError), a
      cluster transaction across slots

Authentication errors derive from redis-py's ConnectionError, and NOPERM, CLUSTERDOWN and
TRYAGAIN from its ResponseError: the order of the checks in :func:`state_error` matters.

A caller may wait and try a :class:`~router.errors.StateUnavailableError` again (bounded);
a timeout does not say whether a write happened, so what is retried must be idempotent or
deduplicated. No script stops halfway on a slot split by a migration: the two that touch
keys they do not declare (a channel's publish and fetch: its body keys) also declare one
that never exists (the body-key base), so Redis refuses them there (ASK, then TRYAGAIN)
before they start.

Where: the calls that reach Redis are few (:meth:`Scripts.run
<router.state.scripts.Scripts.run>` and ``run_many``, the pipelines of
:mod:`~router.state.reads`, the scans of :mod:`~router.state.scan`, each store's own
commands), and each translates with a ``try``/``except`` (free in CPython 3.11 when
nothing is raised) or ``with translating:`` (a shared object: no allocation, two calls).
No decorator: it would cost every call on the publish path a coroutine more.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    ClusterError,
    ConnectionError as RedisConnectionError,
    CrossSlotTransactionError,
    ExternalAuthProviderError,
    InvalidPipelineStack,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    TimeoutError as RedisTimeoutError,
    TryAgainError,
)

from router.errors import StateAccessError, StateFailureError, StateUnavailableError

#: What the state layer catches at its boundary: every error of redis-py (its cluster
#: client's own errors do not derive from RedisError).
REDIS_ERRORS: Final = (RedisError, RedisClusterException)

_CREDENTIALS: Final = (
    AuthenticationError,
    AuthorizationError,
    AuthenticationWrongNumberOfArgsError,
    ExternalAuthProviderError,
)
_UNAVAILABLE: Final = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterError,
    TryAgainError,
    RedisClusterException,
)
#: Cluster errors that say the router asked something a cluster cannot do (a defect).
_MISUSE: Final = (CrossSlotTransactionError, InvalidPipelineStack)


def state_error(error: BaseException) -> StateFailureError:
    """The router's error for redis-py's ``error`` (see the table in the module)."""
    if isinstance(error, _CREDENTIALS):
        return StateAccessError(error, credentials=True)
    if isinstance(error, NoPermissionError):
        return StateAccessError(error, credentials=False)
    if isinstance(error, _UNAVAILABLE) and not isinstance(error, _MISUSE):
        return StateUnavailableError(error)
    return StateFailureError(error)


class _Translating:
    """``with translating:``: a redis-py error raised in the block leaves it as
    :func:`state_error` says, chained (``from``); anything else passes unchanged."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, REDIS_ERRORS):
            raise state_error(error) from error


translating: Final = _Translating()
