"""Hooks: callbacks that the node runs at named points, in priority order (EMQX semantics).

Rules:

* Callbacks of a hook point run highest ``priority`` first; equal priorities run in the
  order they were registered. The same callback (by ``==``, so the same bound method
  counts) cannot be registered twice at one point: :class:`DuplicateHookError`.
* :meth:`HookRegistry.run` notifies: each callback gets ``*args``; a callback that returns
  :data:`STOP` (or ``Stop(x)``) ends the chain, anything else lets it go on.
* :meth:`HookRegistry.run_fold` folds an accumulator through the chain: each callback gets
  ``*args, acc`` and returns

  ===================  ==========================================
  ``OK`` or ``None``   go on with ``acc`` unchanged
  ``Ok(new)``          go on with ``new``
  ``STOP``             end the chain, return ``acc``
  ``Stop(new)``        end the chain, return ``new``
  ===================  ==========================================

* A callback that raises is skipped: the error is logged on the ``router.core.hooks`` logger
  with its traceback and the chain goes on with the accumulator it had. A callback that
  returns anything else is logged and treated as ``OK``. ``BaseException`` that is not an
  ``Exception`` (cancellation, KeyboardInterrupt) is not swallowed.
* A chain runs over the callbacks registered when it started: registering or removing
  callbacks from inside a callback takes effect at the next run.
* A fold may be given a ``check``: each ``Ok(new)``/``Stop(new)`` value goes through it
  before it is used (it returns the value to use or raises). A value it refuses is
  logged and that callback is skipped like one that raised, so one bad callback cannot
  undo what the others did, nor push a value the caller cannot use.
* Listeners (:meth:`HookRegistry.add_listener`) are called after every change of the
  callbacks, so a caller can keep cheap "is anything registered here?" flags instead of
  asking on every message.
* Synchronous and asynchronous callbacks: :meth:`~HookRegistry.run` and
  :meth:`~HookRegistry.run_fold` are plain calls for plain callbacks. An authentication
  or ACL backend that asks a server must not block the node's event loop, so
  :meth:`~HookRegistry.arun` and :meth:`~HookRegistry.arun_fold` also await a callback
  that returns an awaitable (an ``async def``), with the same fold rules. The synchronous
  runs refuse awaitables: such a result is closed, logged and skipped. This module
  imports no event loop; ``await`` is all it needs.

Hook points and what they pass (the node follows this contract):

===========================  =================================  ==========================
point                        args                               fold accumulator
===========================  =================================  ==========================
``client.authenticate``      ``(client, password)``             :class:`Decision`
``client.check_acl``         ``(client, action, topic)``        :class:`Decision`
``client.connected``         ``(client,)``                      (notification)
``client.disconnected``      ``(client, reason)``               (notification)
``client.subscribe``         ``(client,)``                      (filter, options) or None
``client.unsubscribe``       ``(client,)``                      filter or None
``message.publish``          ``(client,)``                      the message or None
``message.delivered``        ``(client, delivery)``             (notification)
``message.acked``            ``(client, delivery)``             (notification)
``message.dropped``          ``(message, reason, client)``      (notification)
===========================  =================================  ==========================

``client`` is a :class:`ClientInfo` (for ``message.publish`` the publisher, None for a
message the embedding program publishes itself; for ``message.dropped`` the subscriber
whose copy was dropped, else the publisher or None); ``action`` an
:class:`router.core.acl.AclAction`; for ``client.check_acl`` ``topic`` is the topic name of a
publish or the filter of a subscribe (what a client may receive is judged on each delivery
by the node's configured ACL, not at this point); ``reason`` of ``message.dropped`` is a
:class:`DropReason`. How the node folds each point (what None means, which rewrites it
accepts) is written in :mod:`router.cluster.policy`.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from router.errors import DuplicateHookError, HookError, InvalidIdError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class HookPoint(enum.StrEnum):
    """The hook points the node runs (each member is also its plain string)."""

    CLIENT_AUTHENTICATE = "client.authenticate"
    CLIENT_CHECK_ACL = "client.check_acl"
    CLIENT_CONNECTED = "client.connected"
    CLIENT_DISCONNECTED = "client.disconnected"
    CLIENT_SUBSCRIBE = "client.subscribe"
    CLIENT_UNSUBSCRIBE = "client.unsubscribe"
    MESSAGE_PUBLISH = "message.publish"
    MESSAGE_DELIVERED = "message.delivered"
    MESSAGE_ACKED = "message.acked"
    MESSAGE_DROPPED = "message.dropped"


class DropReason(enum.StrEnum):
    """Why a message was dropped (the ``reason`` of ``message.dropped``)."""

    NO_SUBSCRIBERS = "no_subscribers"
    DENIED = "denied"
    STOPPED = "stopped"  # a message.publish hook stopped it
    QUEUE_FULL = "queue_full"
    EXPIRED = "expired"
    TOO_LARGE = "too_large"


class Flow(enum.Enum):
    """The bare fold results: go on unchanged, or stop with the current accumulator."""

    OK = "ok"
    STOP = "stop"


OK: Final = Flow.OK
STOP: Final = Flow.STOP


@dataclass(frozen=True, slots=True)
class Ok(Generic[T]):
    """Fold result: go on with ``value`` as the new accumulator."""

    value: T


@dataclass(frozen=True, slots=True)
class Stop(Generic[T]):
    """Fold result: end the chain and return ``value``."""

    value: T


#: What a callback may return (None counts as OK).
HookResult = Flow | Ok[Any] | Stop[Any] | None
Callback = Callable[..., Any]
#: Vets a fold value: returns the value to use, or raises to skip the callback.
Check = Callable[[T], T]


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """Who a hook is about: the client id and, if it gave one, its username.

    Raises :class:`InvalidIdError` if ``client_id`` is not a non-empty str or ``username``
    is neither None nor a str.
    """

    client_id: str
    username: str | None = None

    def __post_init__(self) -> None:
        if type(self.client_id) is not str or not self.client_id:
            raise InvalidIdError(f"a client id must be a non-empty str, not {self.client_id!r}")
        if self.username is not None and type(self.username) is not str:
            raise InvalidIdError(f"a username must be a str or None, not {self.username!r}")


@dataclass(frozen=True, slots=True)
class Decision:
    """An allow/deny answer with a reason for logs and for the client (fold accumulator of
    ``client.authenticate`` and ``client.check_acl``).

    ``expires_at`` (``client.authenticate`` only): the wall-clock time (epoch seconds)
    at which the accepted credentials stop being valid, such as a JWT's ``exp``; the
    MQTT connection they opened is then closed (DISCONNECT 0xA0, Maximum connect time).
    None: they do not expire."""

    allowed: bool
    reason: str
    expires_at: float | None = None

    @classmethod
    def allow(cls, reason: str, expires_at: float | None = None) -> Decision:
        """An allowing decision (valid until ``expires_at``, when given)."""
        return cls(True, reason, expires_at)

    @classmethod
    def deny(cls, reason: str) -> Decision:
        """A denying decision."""
        return cls(False, reason)


@dataclass(frozen=True, slots=True)
class HookEntry:
    """One registered callback: what runs, its priority and its registration order."""

    callback: Callback
    priority: int
    order: int

    @property
    def name(self) -> str:
        """The callback's qualified name, for logs."""
        callback = self.callback
        name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
        module = getattr(callback, "__module__", None)
        return f"{module}.{name}" if module else str(name)


def _close(result: Any) -> None:
    close = getattr(result, "close", None)
    if callable(close):
        close()  # a coroutine that is never awaited would warn at garbage collection


class HookRegistry:
    """Callbacks by hook point; runs them in order with the fold rules of this module.

    ``points`` are the hook points it accepts (every :class:`HookPoint` by default);
    :meth:`declare` adds more (for plugins with their own points).
    """

    def __init__(self, points: Iterable[str] = HookPoint) -> None:
        self._chains: dict[str, tuple[HookEntry, ...]] = {}
        self._registered = 0
        self._listeners: list[Callable[[], None]] = []
        for point in points:
            self.declare(point)

    def declare(self, point: str) -> None:
        """Accept ``point`` as a hook point (nothing happens if it already is one).

        Raises :class:`HookError` if it is not a non-empty str.
        """
        if not isinstance(point, str) or not point:
            raise HookError(f"a hook point must be a non-empty str, not {point!r}")
        self._chains.setdefault(str(point), ())

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every later :meth:`register` and :meth:`unregister`."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def active(self, point: str) -> bool:
        """True if ``point`` has at least one callback (False for an unknown point)."""
        return bool(self._chains.get(point))

    def callbacks(self, point: str) -> tuple[Callback, ...]:
        """The callbacks at ``point``, in the order they run (none for an unknown point)."""
        return tuple(entry.callback for entry in self._chains.get(point, ()))

    def points(self) -> list[str]:
        """Every hook point this registry accepts, sorted."""
        return sorted(self._chains)

    def _chain(self, point: str) -> tuple[HookEntry, ...]:
        chain = self._chains.get(point)
        if chain is None:
            raise HookError(f"unknown hook point {point!r}; declare() it first")
        return chain

    def register(self, point: str, callback: Callback, priority: int = 0) -> None:
        """Add ``callback`` at ``point``; higher ``priority`` runs earlier.

        Raises :class:`HookError` for an unknown point, a callback that is not callable
        or a priority that is not an int, and :class:`DuplicateHookError` if the callback
        is already registered at this point; nothing changes then.
        """
        chain = self._chain(point)
        if not callable(callback):
            raise HookError(f"a hook callback must be callable, not {callback!r}")
        if type(priority) is not int:
            raise HookError(f"a hook priority must be an int, not {priority!r}")
        if any(entry.callback == callback for entry in chain):
            raise DuplicateHookError(f"{callback!r} is already registered at {point!s}")
        self._registered += 1
        entry = HookEntry(callback, priority, self._registered)
        self._chains[str(point)] = tuple(
            sorted((*chain, entry), key=lambda e: (-e.priority, e.order))
        )
        self._changed()

    def unregister(self, point: str, callback: Callback) -> bool:
        """Remove ``callback`` from ``point``; True if it was there.

        Raises :class:`HookError` for an unknown point.
        """
        chain = self._chain(point)
        kept = tuple(entry for entry in chain if entry.callback != callback)
        self._chains[str(point)] = kept
        self._changed()
        return len(kept) != len(chain)

    def entries(self, point: str) -> list[HookEntry]:
        """The callbacks of ``point`` in the order they run. Raises :class:`HookError`
        for an unknown point."""
        return list(self._chain(point))

    # -- running ---------------------------------------------------------------------

    def run(self, point: str, args: Sequence[Any] = ()) -> bool:
        """Call each callback of ``point`` with ``*args``, in order.

        Returns False if a callback stopped the chain (``STOP`` or ``Stop(...)``), True if
        it ran to the end. Raises :class:`HookError` for an unknown point.
        """
        for entry in self._chain(point):
            try:
                result = entry.callback(*args)
            except Exception:
                logger.exception("hook %s: %s raised; skipped", point, entry.name)
                continue
            if inspect.isawaitable(result):
                self._refuse_awaitable(point, entry, result)
                continue
            if result is STOP or isinstance(result, Stop):
                return False
        return True

    def run_fold(self, point: str, args: Sequence[Any], acc: T, check: Check[T] | None = None) -> T:
        """Fold ``acc`` through the callbacks of ``point`` (each gets ``*args, acc``).

        Returns the accumulator after the last callback or the one a callback stopped
        with (see the module rules; ``check`` vets each new value). Raises
        :class:`HookError` for an unknown point.
        """
        for entry in self._chain(point):
            try:
                result = entry.callback(*args, acc)
            except Exception:
                logger.exception("hook %s: %s raised; skipped", point, entry.name)
                continue
            if inspect.isawaitable(result):
                self._refuse_awaitable(point, entry, result)
                continue
            stop, acc = self._step(point, entry, result, acc, check)
            if stop:
                break
        return acc

    async def arun(self, point: str, args: Sequence[Any] = ()) -> bool:
        """Like :meth:`run`, awaiting callbacks that return an awaitable."""
        for entry in self._chain(point):
            try:
                result = entry.callback(*args)
                if inspect.isawaitable(result):
                    result = await result
            except Exception:
                logger.exception("hook %s: %s raised; skipped", point, entry.name)
                continue
            if result is STOP or isinstance(result, Stop):
                return False
        return True

    async def arun_fold(
        self, point: str, args: Sequence[Any], acc: T, check: Check[T] | None = None
    ) -> T:
        """Like :meth:`run_fold`, awaiting callbacks that return an awaitable."""
        for entry in self._chain(point):
            try:
                result = entry.callback(*args, acc)
                if inspect.isawaitable(result):
                    result = await result
            except Exception:
                logger.exception("hook %s: %s raised; skipped", point, entry.name)
                continue
            stop, acc = self._step(point, entry, result, acc, check)
            if stop:
                break
        return acc

    @staticmethod
    def _step(
        point: str, entry: HookEntry, result: Any, acc: T, check: Check[T] | None
    ) -> tuple[bool, T]:
        """Apply one fold result: (whether to stop, the accumulator from now on)."""
        if result is None or result is OK:
            return False, acc
        if result is STOP:
            return True, acc
        if isinstance(result, Ok | Stop):
            value = result.value
            if check is not None:
                try:
                    value = check(value)
                except Exception as error:
                    logger.error(
                        "hook %s: %s returned %r: %s; skipped", point, entry.name, value, error
                    )
                    return False, acc
            return isinstance(result, Stop), value
        logger.error(
            "hook %s: %s returned %r, not OK, Ok(new), STOP, Stop(new) or None; ignored",
            point,
            entry.name,
            result,
        )
        return False, acc

    @staticmethod
    def _refuse_awaitable(point: str, entry: HookEntry, result: Any) -> None:
        _close(result)
        logger.error(
            "hook %s: %s is asynchronous; run the point with arun/arun_fold; skipped",
            point,
            entry.name,
        )
