"""``router bench fleet --kill``: ``kill -9`` of a node under thousands of persistent
and clean sessions, with the persistent ones' clients coming back to the other node in
three storms.

Two router nodes A and B on one Redis, heartbeat TTL ``ttl`` (interval ``ttl / 4``), then:

1. ``sessions`` MQTT 3.1.1 clients connect to A with clean session 0 and subscribe
   ``fleet/<i>`` at QoS 1, and ``clean_sessions`` more (the next fleet indices) with
   clean session 1 (Session Expiry 0: their sessions end with their connections, so
   with A) and the same subscription, to which nothing but probes is published (a
   refused one tries again: this is set-up); one publisher on B sends QoS 0 probes
   until every client got one (B routes to every session);
2. the publisher's QoS 1 stream (:mod:`router.bench.fleet_publisher`: round ``r`` is seq
   ``r`` to every topic, ``rate`` msg/s) runs until a whole round is acknowledged, then
   A gets ``kill -9``; the stream goes on through the death, the adoption and after;
3. the persistent sessions' clients come back to B (clean session 0, no SUBSCRIBE: the
   session must be there), each third as one storm (every client of it at once, a refused one trying
   again :data:`RETRIES` times, :data:`RETRY_DELAY` apart): the first right after the
   kill, the second once A's heartbeat expired in Redis (B adopts from then on), the
   third once the adoption finished (see :func:`storms`). A client that B drops after
   it was back connects again (``rejoined``);
4. once all are back the stream runs one more round, stops and waits for its last
   acknowledgements; the bench then waits (bounded) until every client got every message
   acknowledged for its topic, or nothing new came for :data:`QUIET` seconds.

Figures: ``acked`` (PUBACKed publishes), ``lost`` (acknowledged, never received by its
session's client, before or after the kill; ``lost_absent``: the same for clients that
never got back), ``duplicates``, ``refused`` (reconnect attempts refused: a CONNACK
other than 0, the connection closed, or no CONNACK within :data:`RECONNECT_TIMEOUT`;
``never_back``: clients refused at every attempt), ``sessions_not_present`` (a
reconnect whose CONNACK said no session: the session was lost), ``claimed_within_s``
(from the kill until no session belonged to A: B holds each, and what is published to it
from then on), ``adopted_within_s`` (until the adoption finished: every session put
away in its Redis queue, as B stamps the adoption's end; ``adopted_seen_within_s``: when
the bench's polls saw it; both None if not within the adoption deadline, and
``left_with_dead_node`` says how many sessions still belong to A at the end),
``reconnect_p50_ms`` / ``p99_ms`` (CONNECT to CONNACK of the reconnects that got in), the
storms' timeline (each storm's own p50 and p99 too) and B's counters from its
``/metrics``. The clean sessions: ``clean_keys_before_kill`` (their keys in Redis just
before the kill: subscriptions, claim, description), and ``clean_keys_left`` and
``clean_sessions_left`` (keys of them still in Redis, and the sessions those belong to,
counted :data:`CLEAN_AFTER_TTL` seconds after A's heartbeat TTL ran out from the kill,
whatever the storms do then; target 0: nothing of a session that ended with its node
outlives the node), ``clean_keys_counted_at_s`` (when, from the kill). Every payload is
checked: one that is not its client's, or a seq never published to it, raises
:class:`BenchDisagreementError`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Final

import redis

from router.errors import BenchDisagreementError, BenchSetupError
from router.state.keys import Keys

from .broker_runs import percentile
from .brokers import delete_prefix
from .fleet_clients import ConnectReport, ConnectSpec
from .fleet_nodes import (
    POLL,
    FleetConfig,
    RunningNode,
    cap_reason,
    capacity,
    fleet_node,
    scrape,
)
from .fleet_pool import WorkerPool, merge

KEEPALIVE: Final = 300
CONNECT_TIMEOUT: Final = 30.0
RECONNECT_TIMEOUT: Final = 20.0
"""Seconds a reconnecting client has from its CONNECT to its CONNACK."""
RETRIES: Final = 5
RETRY_DELAY: Final = 1.0
"""A refused reconnect tries again (RETRIES times at most) after this many seconds."""
PROBE_TIMEOUT: Final = 60.0
WINDOW: Final = 100
"""QoS 1 publishes in flight (below the router's --mqtt-receive-maximum of 128)."""
QUIET: Final = 10.0
"""Seconds without a new delivery after which the bench stops waiting for the rest."""
SETTLE_TIMEOUT: Final = 90.0
CLEAN_AFTER_TTL: Final = 2.0
"""Seconds after the heartbeat TTL (from the kill) at which the keys of the dead node's
clean sessions are counted: by then the survivor must have removed them."""
GROUPS: Final = ("after the kill", "during adoption", "after adoption")
B_COUNTERS: Final = (
    "sessions_adopted",
    "copies_recovered",
    "sessions_restored",
    "sessions_taken_over",
    "nodes_purged",
    "dead_clean_sessions_removed",
    "queue_drops",
)


def adoption_deadline(sessions: int) -> float:
    """Seconds after the kill the bench waits for the adoption before it stops waiting."""
    return 60.0 + sessions / 50


class OwnerWatch:
    """The dead node in Redis: whether its heartbeat expired, and how many of the fleet's
    sessions still belong to it (the owner of client ``<ids>-<i>``)."""

    def __init__(self, url: str, prefix: str, ids: str, count: int, dead: str) -> None:
        self.client = redis.Redis.from_url(url)
        keys = Keys(prefix)
        self.heartbeats = keys.registry_heartbeats()
        self.keys = [keys.client_owner(f"{ids}-{i}") for i in range(count)]
        self.dead = dead.encode()

    def expired(self) -> bool:
        """True once the dead node's heartbeat expired (on Redis time) or it was
        purged: from then on a live node may adopt its sessions."""
        expiry = self.client.zscore(self.heartbeats, self.dead)
        if expiry is None:
            return True
        seconds, micros = self.client.time()
        return expiry <= seconds * 1000 + micros // 1000

    def with_dead(self) -> int:
        left = 0
        for first in range(0, len(self.keys), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in self.keys[first : first + 1000]:
                pipe.hget(key, "node")
            left += sum(1 for node in pipe.execute() if node == self.dead)
        return left

    def close(self) -> None:
        self.client.close()


class CleanWatch:
    """The keys in Redis of the fleet's clean sessions (those of client ``<ids>-<i>`` for
    each of ``indices``: :meth:`Keys.client_keys <router.state.keys.Keys.client_keys>`)."""

    def __init__(self, url: str, prefix: str, ids: str, indices: range) -> None:
        self.client = redis.Redis.from_url(url)
        keys = Keys(prefix)
        self.keys = [keys.client_keys(f"{ids}-{i}") for i in indices]

    def left(self) -> tuple[int, int]:
        """(how many of the keys exist, how many sessions have at least one)."""
        found, sessions = 0, 0
        for first in range(0, len(self.keys), 1000):
            pipe = self.client.pipeline(transaction=False)
            for names in self.keys[first : first + 1000]:
                pipe.exists(*names)
            counts = pipe.execute()
            found += sum(counts)
            sessions += sum(1 for count in counts if count)
        return found, sessions

    def left_at(self, at: float) -> tuple[int, int, float]:
        """:meth:`left` at monotonic time ``at`` (a measurement at a moment, not a wait
        for a condition), and when it was counted."""
        time.sleep(max(0.0, at - time.monotonic()))
        counted = time.monotonic()
        return *self.left(), counted

    def close(self) -> None:
        self.client.close()


def wait_for(what: str, condition: Any, timeout: float) -> None:
    """Poll ``condition()`` until true; :class:`BenchSetupError` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchSetupError(f"not within {timeout:.0f} s: {what}")
        time.sleep(POLL)


def probe(pool: WorkerPool, count: int) -> None:
    """QoS 0 probes to every client that saw none yet, until each saw one."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    waiting = list(range(count))
    while waiting:
        pool.ask(pool.publisher, "burst", waiting, 0xFFFFFFFF, timeout=60)
        time.sleep(POLL * 3)
        waiting = sorted(i for part in pool.ask_clients("unprobed") for i in part)
        if waiting and time.monotonic() > deadline:
            raise BenchSetupError(f"{len(waiting)} clients got no probe in {PROBE_TIMEOUT} s")


def progress(pool: WorkerPool) -> dict[str, Any]:
    answer: dict[str, Any] = pool.ask(pool.publisher, "stream_progress", timeout=30)
    if answer["error"]:
        raise BenchSetupError(answer["error"])
    return answer


def storms(
    pool: WorkerPool, node: RunningNode, spec: ConnectSpec, watch: OwnerWatch, killed: float
) -> tuple[list[dict[str, Any]], float | None, float | None]:
    """Step 3 of the module docstring: the three storms, each launched in the
    background; returns a line per group, ``claimed_within_s`` (no session belongs to
    the dead node any more: the survivor holds each, its copies with it) and
    ``adopted_within_s``.

    The second storm starts once the dead node's heartbeat expired (B may adopt from
    then on, within a heartbeat interval). The adoption counts as finished once no
    session belongs to the dead node and B's ``sessions_adopted`` counter reached the
    sessions whose clients never got back yet (a client that came back after its
    session was adopted counts in both, so this holds at the latest when every session
    not resumed by its client was adopted)."""
    count = len(spec.indices)
    groups = [spec.indices[g :: len(GROUPS)] for g in range(len(GROUPS))]
    timeline: list[dict[str, Any]] = []
    adopted_within: float | None = None
    claimed_within: float | None = None
    deadline = killed + adoption_deadline(count)

    def launch(group: int, figures: dict[str, Any]) -> None:
        pool.connect(_spec(spec, groups[group]), background=True, rejoin=True)
        at = round(time.monotonic() - killed, 3)
        timeline.append(
            {
                "group": GROUPS[group],
                "clients": len(groups[group]),
                "at_s": at,
                **{f"{name}_then": value for name, value in figures.items()},
            }
        )

    launch(0, {})
    while len(timeline) == 1:  # (the expiry starts the adoption: a quick look for it)
        if watch.expired() or time.monotonic() > deadline:
            launch(1, {"with_dead_node": watch.with_dead()})
        time.sleep(POLL / 5)
    while True:
        adopted = scrape(node.metrics or "").get("router_sessions_adopted_total", 0)
        left, back = watch.with_dead(), pool.tally().returned
        now = time.monotonic()
        if left == 0 and claimed_within is None:
            claimed_within = round(now - killed, 3)
        if left == 0 and adopted >= count - back:
            adopted_within = round(now - killed, 3)
        if adopted_within is not None or now > deadline:
            launch(2, {"adopted": int(adopted), "with_dead_node": left, "back": back})
            break
        time.sleep(POLL)
    wait = (RETRIES + 1) * RECONNECT_TIMEOUT + 1.5 * RETRY_DELAY * 2**RETRIES + 60
    reports: list[list[ConnectReport]] = pool.ask_clients("join", timeout=wait)
    for group, line in enumerate(timeline):
        done = merge(part[group] for part in reports)
        line.update(
            ok=done.ok,
            refused=done.refused,
            gave_up=done.gave_up,
            session_present=done.present,
            connack_ns=done.connack_ns,
        )
    return timeline, claimed_within, adopted_within


def finish(
    pool: WorkerPool, node: RunningNode, watch: OwnerWatch, count: int, killed: float
) -> float | None:
    """Seconds from the kill until the adoption finished (as :func:`storms` judges it),
    waiting until the adoption deadline at most; None if it had not by then."""
    deadline = killed + adoption_deadline(count)
    while time.monotonic() < deadline:
        adopted = scrape(node.metrics or "").get("router_sessions_adopted_total", 0)
        if watch.with_dead() == 0 and adopted >= count - pool.tally().returned:
            return round(time.monotonic() - killed, 3)
        time.sleep(POLL)
    return None


def adoption_end(node: RunningNode, killed_at: float) -> float | None:
    """Seconds from the kill (Unix time ``killed_at``) until ``node``'s last adoption
    ended, by the node's own stamp (``router_adoption_last_finished_ms``): the polls
    that see the adoption finished come up to :data:`POLL` and a scrape of a busy node
    later. None if the node stamped none."""
    finished_ms = scrape(node.metrics or "").get("router_adoption_last_finished_ms", 0)
    if not finished_ms:
        return None
    return round(finished_ms / 1000 - killed_at, 3)


def _spec(spec: ConnectSpec, indices: tuple[int, ...]) -> ConnectSpec:
    """A storm: ``indices`` at once, clean session 0 and no SUBSCRIBE."""
    return replace(
        spec,
        indices=indices,
        clean=False,
        subscribe=False,
        in_flight=0,
        timeout=RECONNECT_TIMEOUT,
        retries=RETRIES,
        retry_delay=RETRY_DELAY,
    )


def settle(pool: WorkerPool, acked: dict[int, list[int]]) -> int:
    """Tell each client what it must get; wait until it all came, or :data:`QUIET`
    seconds brought nothing new (at most :data:`SETTLE_TIMEOUT`). Returns the missing."""
    parts = pool.split(range(max(acked, default=-1) + 1))
    pool.ask_clients("expect", [({i: acked.get(i, []) for i in part},) for part in parts])
    deadline = time.monotonic() + SETTLE_TIMEOUT
    last, since = -1, time.monotonic()
    while True:
        missing = sum(pool.ask_clients("missing"))
        if missing == 0 or time.monotonic() > deadline:
            return int(missing)
        if missing != last:
            last, since = missing, time.monotonic()
        elif time.monotonic() - since > QUIET:
            return int(missing)
        time.sleep(POLL * 2)


def check(
    received: dict[int, list[int]],
    acked: dict[int, list[int]],
    sent_upto: dict[int, int],
    absent: set[int],
) -> dict[str, Any]:
    """Lost and duplicates per the module docstring (``lost`` over the clients that are
    back, ``lost_absent`` over those that are not; ``lost_by_round``: seq (the round) ->
    lost, ``lost_by_group``: lost per storm); :class:`BenchDisagreementError` if a client
    got a seq that was never published to its topic."""
    lost, lost_absent, duplicates = 0, 0, 0
    strays: list[tuple[int, int]] = []
    lost_rounds: dict[int, int] = {}
    lost_groups = [0] * len(GROUPS)
    for index in set(received) | set(acked):
        got = received.get(index, [])
        seen = set(got)
        duplicates += len(got) - len(seen)
        strays += [(index, s) for s in seen if not 1 <= s <= sent_upto.get(index, 0)]
        for seq in set(acked.get(index, ())) - seen:
            if index in absent:
                lost_absent += 1
                continue
            lost += 1
            lost_rounds[seq] = lost_rounds.get(seq, 0) + 1
            lost_groups[index % len(GROUPS)] += 1
    if strays:
        raise BenchDisagreementError(
            f"{len(strays)} messages arrived that were never published to their client, "
            f"e.g. (client, seq) {strays[:5]}"
        )
    return {
        "lost": lost,
        "lost_absent": lost_absent,
        "duplicates": duplicates,
        "lost_by_round": dict(sorted(lost_rounds.items())),
        "lost_by_group": lost_groups,
    }


def run_kill(url: str, config: FleetConfig, pool: WorkerPool) -> dict[str, Any]:
    """The kill run (see the module docstring) on ``url``; the object ``--json`` prints."""
    nonce = uuid.uuid4().hex[:8]
    prefix, ids = f"fleet{nonce}", f"fk{nonce}"
    dead, alive = f"fleet{nonce}-a", f"fleet{nonce}-b"
    asked, clean_asked = config.session_count, config.clean_session_count
    options = config.node_options
    try:
        with contextlib.ExitStack() as stack:
            a = stack.enter_context(
                fleet_node(url, prefix, dead, asked + clean_asked + 16, options)
            )
            b = stack.enter_context(fleet_node(url, prefix, alive, asked + 16, options))
            total, fd_limit, files = capacity(a.process.pid, asked + clean_asked)
            count = min(asked, total)
            clean = range(count, total)  # (the fleet indices of the clean sessions)
            spec = ConnectSpec(
                a.address,
                tuple(range(count)),
                ids,
                clean=False,
                keepalive=KEEPALIVE,
                in_flight=config.in_flight,
                timeout=CONNECT_TIMEOUT,
                retries=RETRIES,
                retry_delay=RETRY_DELAY,
            )
            cleans = CleanWatch(url, prefix, ids, clean)
            stack.callback(cleans.close)
            clean_spec = replace(spec, indices=tuple(clean), clean=True)
            before, refused_first = start_stream(pool, spec, clean_spec, b, config)
            clean_before, _ = cleans.left()
            counter = stack.enter_context(ThreadPoolExecutor(1, "clean-keys"))
            killed, killed_at = time.monotonic(), time.time()
            a.process.kill()
            a.process.wait()
            clean_left = counter.submit(cleans.left_at, killed + config.ttl + CLEAN_AFTER_TTL)
            watch = OwnerWatch(url, prefix, ids, count, dead)
            stack.callback(watch.close)
            timeline, claimed_within, adopted_within = storms(
                pool, b, replace(spec, address=b.address), watch, killed
            )
            if adopted_within is None:
                adopted_within = finish(pool, b, watch, count, killed)
            adopted_at = adoption_end(b, killed_at) if adopted_within is not None else None
            left = watch.with_dead()
            all_back = progress(pool)["acked"]
            wait_for(
                "a round acknowledged after the reconnects",
                lambda: progress(pool)["acked"] >= all_back + count,
                3 * count / config.rate + 60,
            )
            stream = pool.ask(pool.publisher, "stream_stop", timeout=120)
            if stream["error"]:
                raise BenchSetupError(stream["error"])
            figures = outcome(pool, stream)
            clean_keys, clean_sessions_left, counted = clean_left.result()
            counters = scrape(b.metrics or "")
            pool.ask_clients("close", [(True,)] * pool.clients, timeout=60)
    finally:
        delete_prefix(url, prefix)
    latencies: list[int] = []
    for line in timeline:
        group = line.pop("connack_ns")
        latencies += group
        line["reconnect_p50_ms"] = round(percentile(group, 0.5), 3) if group else None
        line["reconnect_p99_ms"] = round(percentile(group, 0.99), 3) if group else None
    resumed = sum(line["ok"] for line in timeline)
    return {
        "mode": "kill",
        "sessions": count,
        "sessions_asked": asked,
        "capped": total < asked + clean_asked,
        "cap_reason": cap_reason(total, asked + clean_asked, fd_limit, files),
        "fd_limit": fd_limit,
        "acked": stream["acked"],
        "acked_before_kill": before,
        "refused_before_kill": refused_first,
        "sent": stream["sent"],
        "expired": stream["expired"],
        "publisher_reconnects": stream["publisher_reconnects"],
        **figures,
        "refused": sum(sum(line["refused"].values()) for line in timeline),
        "reconnected": resumed,
        "never_back": sum(line["gave_up"] for line in timeline),
        "sessions_not_present": resumed - sum(line["session_present"] for line in timeline),
        "claimed_within_s": claimed_within,
        "adopted_within_s": adopted_at if adopted_at is not None else adopted_within,
        "adopted_seen_within_s": adopted_within,
        "left_with_dead_node": left,
        "clean_sessions": len(clean),
        "clean_sessions_asked": clean_asked,
        "clean_keys_before_kill": clean_before,
        "clean_keys_left": clean_keys,
        "clean_sessions_left": clean_sessions_left,
        "clean_keys_counted_at_s": round(counted - killed, 3),
        "reconnect_p50_ms": round(percentile(latencies, 0.5), 3),
        "reconnect_p99_ms": round(percentile(latencies, 0.99), 3),
        "ttl_s": config.ttl,
        "heartbeat_interval_s": config.heartbeat_interval,
        "rate": config.rate,
        "rounds": stream["round"],
        "groups": timeline,
        **{f"b_{name}": counters.get(f"router_{name}_total") for name in B_COUNTERS},
        "in_flight": config.in_flight,
        "processes": pool.clients,
    }


def start_stream(
    pool: WorkerPool, spec: ConnectSpec, clean: ConnectSpec, b: RunningNode, config: FleetConfig
) -> tuple[int, dict[str, int]]:
    """Steps 1 and 2 up to the kill: every persistent session of ``spec`` and clean one
    of ``clean`` on A (a refused one tries again), probed through B, the stream running
    and one round of it acknowledged; the messages acknowledged then, and the refusals
    of the persistent sessions' first connects."""
    count = len(spec.indices)
    first = pool.connect(spec)
    assert first is not None
    if first.ok != count:
        raise BenchSetupError(
            f"{count - first.ok} of {count} sessions did not connect to node A: {first.refused}"
        )
    if clean.indices:
        done = pool.connect(clean)
        assert done is not None
        if done.ok != len(clean.indices):
            raise BenchSetupError(
                f"{len(clean.indices) - done.ok} of {len(clean.indices)} clean sessions did "
                f"not connect to node A: {done.refused}"
            )
    pool.ask(pool.publisher, "publisher_connect", b.address, f"{spec.ids}-publisher", timeout=60)
    probe(pool, count + len(clean.indices))
    pool.ask(pool.publisher, "stream", count, config.rate, WINDOW, timeout=30)
    wait_for(
        "a round acknowledged",
        lambda: progress(pool)["acked"] >= count,
        3 * count / config.rate + 60,
    )
    acked: int = progress(pool)["acked"]
    return acked, first.refused


def outcome(pool: WorkerPool, stream: dict[str, Any]) -> dict[str, Any]:
    """Step 4's wait, then what every client received against what was acknowledged
    (:func:`check`), and the clients connected at the end."""
    missing = settle(pool, stream["acked_seqs"])
    received: dict[int, list[int]] = {}
    for part in pool.ask_clients("received", timeout=60):
        received.update(part)
    absent = {i for part in pool.ask_clients("absent") for i in part}
    figures = check(received, stream["acked_seqs"], stream["sent_upto"], absent)
    tally = pool.tally()
    if tally.mismatches:
        raise BenchDisagreementError(f"{tally.mismatches} payloads were not their client's")
    return {
        **figures,
        "missing_at_end": missing,
        "connected_at_end": tally.accepted,
        "rejoined": tally.rejoined,
        "rejoin_refused": tally.rejoin_refused,
    }
