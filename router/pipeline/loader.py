"""Bulk-loading subscriptions into Redis: validate rows, write one client per script call.

Row rules (the import's columns are text, as read from CSV, JSON lines or Parquet):
``client_id``, ``filter`` and ``qos`` are required; ``no_local``,
``retain_as_published`` (``true``/``false``/``1``/``0``), ``retain_handling`` and
``subscription_identifier`` are optional (empty: the default). A row that breaks a rule
is *rejected* with its reason.

A client is written whole or not at all: all of its rows go into one call of
``lua/import_subscriptions.lua`` (atomic on its one hash tag), and a client with a
rejected row is not written: its other rows are rejected too, naming the reason. The
script writes only changes, so an import is idempotent: a subscription already stored
with the same options is *skipped*, as is an earlier row for the same (client, filter)
(the last row wins). Everything else is *loaded* (new, or its options replaced).

The import does not check session owners and does not touch routes: it loads the state
of clients that no node serves at the moment (a node adds routes when it serves them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from redis.exceptions import ResponseError

from router.core.options import SubscriptionOptions, make_options
from router.core.topics import parse_shared, validate_filter
from router.errors import ImportRowError, InvalidIdError, InvalidOptionsError, InvalidTopicError
from router.state.blocking import BlockingClient, blocking_client
from router.state.keys import Keys, check_id
from router.state.scripts import script_source, translate_error
from router.state.subscriptions import pack_options

COLUMNS: Final = ("client_id", "filter", "qos")
"""The columns every import source must have."""
OPTION_COLUMNS: Final = (
    "no_local",
    "retain_as_published",
    "retain_handling",
    "subscription_identifier",
)
"""Columns an import source may have besides :data:`COLUMNS`."""
SCRIPT: Final = "import_subscriptions"
MAX_REJECTS: Final = 1000
"""Rejected rows kept with their reason per partition (all are counted)."""
CLIENT_REJECTED: Final = "another row of this client was rejected"

# client_id, filter, qos, then the option columns: text or None each
Row = Sequence[str | None]
Progress = Callable[[int, int], None]
"""Called with (partitions done, partitions in all) while an import runs."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A rejected row (its three required fields as given) and why."""

    client_id: str | None
    filter: str | None
    qos: str | None
    reason: str


@dataclass
class ImportCounts:
    """Rows loaded, skipped and rejected, and up to :data:`MAX_REJECTS` rejected rows."""

    loaded: int = 0
    skipped: int = 0
    rejected: int = 0
    clients: int = 0
    rejects: list[Rejected] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.loaded + self.skipped + self.rejected

    def reject(self, row: Row, reason: str) -> None:
        self.rejected += 1
        if len(self.rejects) < MAX_REJECTS:
            self.rejects.append(Rejected(row[0], row[1], row[2], reason))

    def add(self, other: ImportCounts, keep: int = MAX_REJECTS) -> None:
        """Add another partition's counts (keeping at most ``keep`` rejected rows)."""
        self.loaded += other.loaded
        self.skipped += other.skipped
        self.rejected += other.rejected
        self.clients += other.clients
        self.rejects += other.rejects[: max(0, keep - len(self.rejects))]


_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no", ""})


def _flag(value: str | None, name: str) -> bool:
    text = (value or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ImportRowError(f"{name} must be true or false, not {value!r}")


def _integer(value: str | None, name: str) -> int | None:
    text = (value or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ImportRowError(f"{name} must be an integer, not {value!r}") from None


def parse_row(row: Row) -> tuple[str, str, SubscriptionOptions]:
    """``(client_id, filter, options)`` of a row; :class:`ImportRowError` with the reason."""
    client_id, topic_filter, qos = row[0], row[1], row[2]
    extra = list(row[3:]) + [None] * (len(OPTION_COLUMNS) - len(row[3:]))
    if client_id is None or client_id == "":
        raise ImportRowError("client_id is missing")
    if topic_filter is None:
        raise ImportRowError("filter is missing")
    if qos is None or qos.strip() == "":
        raise ImportRowError("qos is missing")
    try:
        check_id(client_id, "client id")
        validate_filter(topic_filter)
        level = _integer(qos, "qos")
        handling = _integer(extra[2], "retain_handling")
        options = make_options(
            qos=level,
            no_local=_flag(extra[0], "no_local"),
            retain_as_published=_flag(extra[1], "retain_as_published"),
            retain_handling=0 if handling is None else handling,
            subscription_identifier=_integer(extra[3], "subscription_identifier"),
        )
    except (InvalidIdError, InvalidTopicError, InvalidOptionsError) as exc:
        raise ImportRowError(str(exc)) from None
    if options.no_local and parse_shared(topic_filter) is not None:
        raise ImportRowError("a shared subscription cannot set no_local (MQTT-3.8.3-4)")
    return client_id, topic_filter, options


def plan_clients(
    rows: Iterable[Row], counts: ImportCounts
) -> dict[str, dict[str, SubscriptionOptions]]:
    """Group valid rows by client (last row of a filter wins, earlier ones are skipped);
    clients with a rejected row are left out and all their rows rejected (into ``counts``)."""
    by_client: dict[str, list[Row]] = {}
    for row in rows:
        by_client.setdefault(row[0] or "", []).append(row)
    plans: dict[str, dict[str, SubscriptionOptions]] = {}
    for client_rows in by_client.values():
        parsed = []
        failures: dict[int, str] = {}
        for index, row in enumerate(client_rows):
            try:
                parsed.append(parse_row(row))
            except ImportRowError as exc:
                failures[index] = str(exc)
        if failures:
            for index, row in enumerate(client_rows):
                counts.reject(row, failures.get(index, CLIENT_REJECTED))
            continue
        plan: dict[str, SubscriptionOptions] = {}
        for _, topic_filter, options in parsed:
            if topic_filter in plan:
                counts.skipped += 1
                del plan[topic_filter]  # keep the order of the last rows
            plan[topic_filter] = options
        plans[parsed[0][0]] = plan
    return plans


def write_clients(
    client: BlockingClient,
    keys: Keys,
    plans: dict[str, dict[str, SubscriptionOptions]],
    counts: ImportCounts,
) -> None:
    """Write every planned client with one script call each (EVALSHA, loaded on NOSCRIPT).

    Blocking calls, one at a time: in an executor, redis-py's blocking client costs a
    third of its asyncio client per call (measured; the round trip to a local server is
    short), and Spark runs one writer per core. Calls are never pipelined (a cluster
    refuses pipelined EVALSHA). Raises the domain error of a coded script error.
    """
    script: Any = client.register_script(script_source(SCRIPT))
    for client_id, plan in plans.items():
        args: list[str | bytes] = []
        for topic_filter, options in plan.items():
            args += [topic_filter, pack_options(options)]
        try:
            results = script(keys=[keys.client_subscriptions(client_id)], args=args)
        except ResponseError as exc:
            raise translate_error(exc) or exc from None
        unchanged = sum(1 for flag in results if int(flag) == 0)
        counts.skipped += unchanged
        counts.loaded += len(results) - unchanged
        counts.clients += 1


def import_rows(url: str, prefix: str, rows: Iterable[Row]) -> ImportCounts:
    """Validate and write one partition's rows (every row of a client must be in it)."""
    counts = ImportCounts()
    plans = plan_clients(rows, counts)
    if plans:
        client = blocking_client(url)
        try:
            write_clients(client, Keys(prefix), plans, counts)
        finally:
            client.close()
    return counts
