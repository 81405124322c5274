"""A client id connecting again, on either node, with its old connection open, closed or
on a dead node: takeover and resume as MQTT says (5.0 3.1.2.4, 3.1.2.11.2, 3.1.3.2.2,
3.1.4; 3.1.1 3.1.2.4, 3.1.4), with real paho-mqtt clients on ``router node run --mqtt``
processes over a real Redis and the 3-master Redis Cluster, and CONNECTs of one client id
racing on two nodes.

What each combination must show:

* CONNACK 0, Session Present 1 exactly when a session is resumed: Clean Start 0 and the
  old session outlives its connection (Session Expiry above 0; 3.1.1: clean session 0).
  A session whose interval was 0 ends when its network connection closes, and the
  takeover closes it: the new connection starts a session of its own (as on one node,
  and as Mosquitto does).
* The old connection, still open, gets DISCONNECT 0x8E (5.0) or is closed (3.1.1).
* The subscription and the QoS 1 message kept for the client (in flight on the old
  connection, or queued while it was away or its node dead) are there exactly when the
  session was resumed.
* The will of the old connection [MQTT-3.1.3-9]: published unless the new connection
  resumes the session within the Will Delay Interval (Clean Start 0, a delay above 0, a
  session that outlives its connection); a dead node's wills die with it (no will is
  set there).

The matrix is chosen, not full (the suite stays near ten minutes on two cores): every
combination of Clean Start, Session Expiry (0, 300, the maximum) and protocol with the
old connection open or away; a will delay of 0 and of 30 s each with every Clean Start
and interval; the old node dead for four of them; each case on one backend, the two
backends taking turns, so each backend sees each old state; and seven of them with the
new connection on the old one's node (one node behaves as two). Both node processes of
a backend serve every case of it (one client id each): only a dead node is started for
its case.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from router.mqtt.codec import encode
from router.mqtt.packets import MQTT_5, ConnAck, Connect, Disconnect, PingReq, PingResp, Will
from router.mqtt.properties import Properties as MqttProperties
from router.state.keys import Keys
from tests.support.cli import Process, delete_namespace
from tests.support.mqtt import V5, V311, Paho, connect_properties, mqtt_node
from tests.support.raw_mqtt import RawClient

NEVER = 0xFFFFFFFF
WILL_DELAY = 30
RACES = 20


@dataclass(frozen=True)
class Case:
    """One reconnect of a client id: ``protocol`` of both connections, the Session Expiry
    Interval they ask for (``expiry``; 3.1.1: 0 is clean session 1, anything else clean
    session 0), the new connection's Clean Start, where the old connection is
    (``open``, ``away``: closed without DISCONNECT, ``dead``: its node killed), the old
    connection's Will Delay Interval, and the backend."""

    protocol: int
    expiry: int
    clean: bool
    old: str
    will_delay: int
    backend: str
    same_node: bool = False  # (the new connection on the old one's node)

    @property
    def resumed(self) -> bool:
        return not self.clean and self.expiry > 0

    @property
    def will_published(self) -> bool:
        return self.old != "dead" and (self.will_delay == 0 or self.clean or self.expiry == 0)

    def __str__(self) -> str:
        version = "v5" if self.protocol == V5 else "v311"
        expiry = {0: "0", NEVER: "max"}.get(self.expiry, str(self.expiry))
        clean = f"clean{int(self.clean)}"
        where = "-same-node" if self.same_node else ""
        return (
            f"{version}-exp{expiry}-{clean}-{self.old}{where}-delay{self.will_delay}-{self.backend}"
        )


def _matrix() -> list[Case]:
    cases = []
    backends = ["redis_standalone_url", "redis_cluster_url"]
    turn = 0
    for old in ("open", "away"):
        for expiry in (0, 300, NEVER):
            for clean in (False, True):
                for delay in (0, WILL_DELAY) if old == "open" else (WILL_DELAY,):
                    cases.append(Case(V5, expiry, clean, old, delay, backends[turn % 2]))
                    turn += 1
        for expiry in (0, NEVER):
            for clean in (False, True):
                cases.append(Case(V311, expiry, clean, old, 0, backends[turn % 2]))
                turn += 1
    cases += [
        Case(V5, 300, False, "dead", 0, backends[0]),
        Case(V5, 0, False, "dead", 0, backends[1]),
        Case(V5, NEVER, True, "dead", 0, backends[1]),
        Case(V311, NEVER, False, "dead", 0, backends[0]),
    ]
    cases += [  # (one node behaves as two)
        Case(V5, 0, False, "open", WILL_DELAY, backends[0], same_node=True),
        Case(V5, 300, False, "open", WILL_DELAY, backends[1], same_node=True),
        Case(V5, 300, False, "open", 0, backends[0], same_node=True),
        Case(V5, 300, True, "open", WILL_DELAY, backends[1], same_node=True),
        Case(V5, NEVER, False, "away", WILL_DELAY, backends[0], same_node=True),
        Case(V311, NEVER, False, "open", 0, backends[1], same_node=True),
        Case(V311, 0, False, "open", 0, backends[0], same_node=True),
    ]
    return cases


class Pair:
    """Node processes a and b on one backend (their ports), and their logs."""

    def __init__(self, env: dict[str, str], processes: list[Process], ports: list[int]) -> None:
        self.env = env
        self.processes = processes
        self.ports = ports

    def complaints(self) -> list[str]:
        """The lines of the nodes' logs so far that tell of a failure."""
        lines = []
        for process in self.processes:
            lines += [line for line in process.logged() if "Traceback" in line or "ERROR" in line]
        return lines


@pytest.fixture(scope="module")
def pairs(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Pair]]:
    """``pairs(backend)``: nodes a and b on that backend (its URL fixture's name), started
    the first time a test asks and stopped with the module, their keys deleted."""
    started: dict[str, Pair] = {}
    with contextlib.ExitStack() as stack:

        def pair(backend: str) -> Pair:
            if backend not in started:
                url = request.getfixturevalue(backend)
                keys = Keys(f"tk{uuid.uuid4().hex[:8]}")
                stack.callback(delete_namespace, url, keys)
                env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
                processes, ports = [], []
                for node_id in "ab":
                    process, port = stack.enter_context(mqtt_node(node_id, env))
                    processes.append(process)
                    ports.append(port)
                started[backend] = Pair(env, processes, ports)
            return started[backend]

        yield pair


@pytest.fixture
def made() -> Iterator[list[Paho]]:
    """Clients a test made: closed when it ends."""
    clients: list[Paho] = []
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def client(
    made: list[Paho], port: int, client_id: str, case: Case, clean: bool, **options: Any
) -> Paho:
    """A connection of ``client_id`` as ``case`` says, with Clean Start ``clean`` (3.1.1:
    clean session 1 also for an interval of 0); it never reconnects by itself."""
    if case.protocol == V5:
        expiry = connect_properties(SessionExpiryInterval=case.expiry)
        made.append(Paho(port, client_id, V5, clean=clean, properties=expiry, **options))
    else:
        made.append(Paho(port, client_id, V311, clean=clean or case.expiry == 0, **options))
    made[-1].client.reconnect_delay_set(3600, 3600)
    return made[-1]


def old_connection(
    made: list[Paho], port: int, client_id: str, case: Case, will_topic: str
) -> Paho:
    """The first connection of ``client_id``, with a will (5.0: delayed as ``case``
    says), leaving what it gets unacknowledged."""
    will: tuple[Any, ...] = (will_topic, b"gone", 1)
    if case.protocol == V5:
        properties = Properties(PacketTypes.WILLMESSAGE)
        properties.WillDelayInterval = case.will_delay
        will += (properties,)
    fresh = case.protocol == V5  # (3.1.1: clean session 0 for a session that is kept)
    old = client(made, port, client_id, case, fresh, will=will, manual_ack=True)
    assert old.connected()[0] == 0
    return old


def leave_behind(case: Case, old: Paho, publisher: Paho, topic: str, node: Process | None) -> bytes:
    """Put the old connection where ``case`` says (its ``node`` killed when dead), with
    a QoS 1 message kept for its session: in flight on the open connection, else
    published once it is away; returns that message."""
    if case.old == "open":
        publisher.publish(topic, b"held", 1)
        [held] = old.take(1)  # (not acknowledged: in flight)
        return bytes(held.payload)
    if node is not None:
        node.kill()
    old.drop()
    publisher.publish(topic, b"queued", 1)
    return b"queued"


@pytest.mark.parametrize("case", _matrix(), ids=str)
def test_a_client_id_connecting_again_takes_over_and_resumes_as_mqtt_says(
    case: Case, pairs: Callable[[str], Pair], made: list[Paho]
) -> None:
    pair = pairs(case.backend)
    port_a, port_b = pair.ports
    client_id = f"tk-{uuid.uuid4().hex[:10]}"
    topic, will_topic = f"tk/{client_id}", f"will/{client_id}"
    watcher = Paho(port_b, f"{client_id}-w", V5)
    made.append(watcher)
    assert watcher.subscribe(will_topic, 1) == [1]
    publisher = Paho(port_a, f"{client_id}-p", V5)
    made.append(publisher)
    with contextlib.ExitStack() as stack:
        dying, old_port = None, port_a
        if case.old == "dead":
            dying, old_port = stack.enter_context(mqtt_node(f"c{client_id[-6:]}", pair.env))
        old = old_connection(made, old_port, client_id, case, will_topic)
        assert old.subscribe(topic, 1) == [1]
        kept = leave_behind(case, old, publisher, topic, dying)
        new = client(made, old_port if case.same_node else port_b, client_id, case, case.clean)
        assert new.connected()[0] == 0
        assert new.sessions_present.get(timeout=10) is case.resumed
        if case.old == "open":
            code = old.expect_disconnect()
            assert code == 0x8E if case.protocol == V5 else code != 0
        if case.resumed:
            assert [m.payload for m in new.take(1)] == [kept]
        publisher.publish(topic, b"live", 1)
        if case.resumed:
            assert [m.payload for m in new.take(1)] == [b"live"]
        if case.will_published:
            assert [m.payload for m in watcher.take(1)] == [b"gone"]
        assert new.nothing_more(0.5)
        assert watcher.messages.empty()  # (a will would have come by now: no second one)
    assert pair.complaints() == []


async def attempt(
    opened: list[RawClient], port: int, client_id: str, clean: bool, expiry: int, side: int
) -> tuple[RawClient, ConnAck | None]:
    """A 5.0 CONNECT of ``client_id`` (the connection joins ``opened``) with a will on
    ``race-will/ID`` that names its ``side``: the connection and its CONNACK (None: the
    server closed the connection without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = RawClient(client_id, reader, writer)
    opened.append(raw)
    raw.packets.level = MQTT_5
    properties = MqttProperties(session_expiry_interval=expiry)
    will = Will(f"race-will/{client_id}", b"%d" % side, qos=1)
    connect = Connect(client_id, MQTT_5, clean, keepalive=60, will=will, properties=properties)
    writer.write(encode(connect))
    try:
        [connack] = await raw.next(ConnAck, 1, 15)
    except ConnectionError:
        return raw, None
    assert isinstance(connack, ConnAck)
    return raw, connack


async def survivor(pair: tuple[RawClient, RawClient]) -> RawClient:
    """Of two accepted connections of one client id, the one left once the other was
    taken over (DISCONNECT 0x8E, then closed)."""
    tasks = {asyncio.ensure_future(raw.closed(15)): raw for raw in pair}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(done) == 1, "neither connection was taken over"
    [ended] = [tasks[task] for task in done]
    assert [p.reason_code for p in ended.pending if isinstance(p, Disconnect)] == [0x8E]
    [left] = [raw for raw in pair if raw is not ended]
    return left


async def race(
    opened: list[RawClient], ports: list[int], client_id: str, clean: bool, expiry: int
) -> tuple[RawClient, int | None]:
    """CONNECTs of ``client_id`` on both ``ports`` at once: each gets a CONNACK, and
    exactly one connection is left (the other refused, or accepted and then taken over).
    Returns the one left and the side (0, 1) of the one taken over (None: refused)."""
    pair = await asyncio.gather(
        *(attempt(opened, port, client_id, clean, expiry, side) for side, port in enumerate(ports))
    )
    codes = [None if connack is None else connack.reason_code for _, connack in pair]
    assert None not in codes, f"{client_id}: a connection closed without CONNACK: {codes}"
    accepted = [raw for raw, connack in pair if connack is not None and connack.reason_code == 0]
    for raw, connack in pair:
        if connack is not None and connack.reason_code != 0:
            assert connack.reason_code >= 0x80
            await raw.closed(15)
    assert accepted, f"{client_id}: both refused: {codes}"
    if len(accepted) == 1:
        return accepted[0], None
    left = await survivor((accepted[0], accepted[1]))
    return left, 1 - [raw for raw, _ in pair].index(left)


@pytest.mark.parametrize("nodes", ["two nodes", "one node"])
@pytest.mark.parametrize("backend", ["redis_standalone_url", "redis_cluster_url"])
async def test_racing_connects_of_one_client_id_leave_one_connection_and_no_traceback(
    backend: str, nodes: str, pairs: Callable[[str], Pair]
) -> None:
    """On two nodes, racing CONNECTs used to end in SessionStateError tracebacks and a
    close without CONNACK; on one node, both were attached to the one session. The
    connection taken over publishes its will (no delay), the one left does not."""
    pair = pairs(backend)
    ports = pair.ports if nodes == "two nodes" else [pair.ports[0]] * 2
    prefix = uuid.uuid4().hex[:8]
    watcher = await RawClient.connect(ports[1], f"race-{prefix}-w", clean_start=True, expiry=0)
    opened: list[RawClient] = [watcher]
    await watcher.subscribe("race-will/#", 1)
    races = [
        race(opened, ports, f"race-{prefix}-{n}", n % 2 == 0, 0 if n % 4 < 2 else 300)
        for n in range(RACES)
    ]
    try:
        outcomes = await asyncio.gather(*races, return_exceptions=True)
        failures = [outcome for outcome in outcomes if not isinstance(outcome, tuple)]
        assert not failures, failures
        wills = set()
        for left, taken in outcomes:  # (still attached: it answers)
            assert isinstance(left, RawClient)
            left.writer.write(encode(PingReq(), MQTT_5))
            await left.next(PingResp, 1, 10)
            if taken is not None:
                wills.add((f"race-will/{left.client_id}", b"%d" % taken))
        got = await watcher.take(len(wills), 15)
        assert {(p.topic, p.payload) for p in got} == wills
        with pytest.raises(TimeoutError):  # (no other will: the ones left are attached)
            await watcher.take(1, 0.5)
    finally:
        for raw in opened:
            raw.drop()
    assert pair.complaints() == []
