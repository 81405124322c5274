"""A node's reloads: what rereads its configuration, and what each reload did.

The process that made the node from files (``router node run``:
:mod:`router.ops.node_process`) hands :meth:`Reloads.install` a *reloader*: a function
that rereads those files and applies what they say, all or nothing, and returns the
words of what it loaded; it raises a :class:`~router.errors.RouterError` saying what it
could not use, and then has changed nothing. :meth:`Reloads.reload` runs it when the
process is told to (SIGHUP) or when an operator asks the node through its inbox
(``router node reload``: :class:`~router.cluster.inbox.Reload`), and reports each
reload three ways:

* an event in the cluster's log (``config_reloaded``, or ``config_reload_failed`` as a
  warning), whose text is also the log line: one line, no traceback;
* the node's counters (``reloads``, ``reload_failures``; ``reload_last_ms``, the Unix
  time of the last, a gauge), in ``node.stats()`` and so in ``/metrics``;
* :attr:`Reloads.last` (the last reload's outcome and words, and what the node runs
  with), which the node's telemetry carries to ``/api/v1/nodes``.

A node without a reloader (embedded in an application, which configures it in code, or
one still starting that finds a reload notice in its inbox) answers a reload with a
``config_reload_failed`` event saying so, counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from router.cluster.events import EventReporter
from router.errors import RouterError

Reloader = Callable[[], str]
"""Rereads and applies a node's configuration; returns what it loaded (see the module
docstring)."""


@dataclass(frozen=True)
class ReloadReport:
    """The last reload of a node: ``ok``, when (Unix ms; 0: none yet) and its words (what
    it loaded, or what it could not use); ``loaded``: what the node runs with (the words
    of the last reload that succeeded, or of its start)."""

    ok: bool = True
    at_ms: int = 0
    text: str = ""
    loaded: str = ""


class Reloads:
    """A node's reloader and the record of its reloads (see the module docstring)."""

    def __init__(self, events: EventReporter, node_id: str) -> None:
        self._events = events
        self._node_id = node_id
        self._reloader: Reloader | None = None
        self.succeeded = 0
        self.failed = 0
        self.last = ReloadReport()

    def install(self, reloader: Reloader, loaded: str) -> None:
        """Reload with ``reloader`` from now on; ``loaded``: what the node started with."""
        self._reloader = reloader
        self.last = ReloadReport(loaded=loaded)

    def reload(self, why: str) -> bool:
        """Reread and apply the node's configuration now (``why``: who asked, for the
        event); True when it was applied. Never raises for what the files say: a file
        that cannot be used leaves everything as it was, is logged in one line and counted."""
        at_ms = int(time.time() * 1000)
        if self._reloader is None:
            reason = "no reloader: not run by router node run, or not ready yet"
            return self._failed(at_ms, reason, why)
        try:
            text = self._reloader()
        except RouterError as error:
            return self._failed(at_ms, str(error), why)
        self.succeeded += 1
        self.last = ReloadReport(True, at_ms, text, text)
        self._events.tell(
            "config_reloaded", self._node_id, f"node {self._node_id} reloaded ({why}): {text}"
        )
        return True

    def _failed(self, at_ms: int, reason: str, why: str) -> bool:
        self.failed += 1
        self.last = ReloadReport(False, at_ms, reason, self.last.loaded)
        self._events.tell(
            "config_reload_failed",
            self._node_id,
            f"node {self._node_id} kept its configuration ({why}): {reason}",
            "warning",
        )
        return False

    def stats(self) -> dict[str, int]:
        return {
            "reloads": self.succeeded,
            "reload_failures": self.failed,
            "reload_last_ms": self.last.at_ms,
        }
