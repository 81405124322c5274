"""The decisions of an MQTT connection without a socket or a node (router.mqtt.exchange):
CONNECT admission and refusals, CONNACK properties, DISCONNECT, and the QoS 1/2
acknowledgement exchange both ways driven through random orders of packets against a
model of what the client must be answered."""

from __future__ import annotations

import pytest
from hypothesis import settings as hypothesis_settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from router.core.messages import Delivery
from router.errors import InvalidIdError, MqttProtocolError, NotAuthorizedError, StateError
from router.mqtt.exchange import (
    Acknowledgements,
    Admit,
    Refuse,
    Release,
    admit,
    connack_properties,
    disconnect,
    disconnect_ends,
    refusal,
)
from router.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Will,
)
from router.mqtt.properties import Properties
from router.mqtt.reason_codes import ReasonCode as RC, connack_return_code
from router.mqtt.settings import MqttSettings

SETTINGS = MqttSettings(max_keepalive=600, session_expiry_max=3600, allow_anonymous=True)


def new_id() -> str:
    return "auto-1"


def connect(**fields: object) -> Connect:
    return Connect(**{"client_id": "c", **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("packet", "settings", "expected"),
    [
        (connect(client_id="", protocol_level=MQTT_5), SETTINGS, Admit("auto-1", "auto-1", 0)),
        (
            connect(client_id="", protocol_level=MQTT_3_1_1, clean_start=False),
            SETTINGS,
            Refuse(RC.CLIENT_IDENTIFIER_NOT_VALID),
        ),
        (
            connect(client_id="", protocol_level=MQTT_3_1_1),
            SETTINGS,
            Admit("auto-1", "auto-1", 0),
        ),
        (
            connect(protocol_level=MQTT_3_1_1, clean_start=False),
            SETTINGS,
            Admit("c", None, 3600),  # 3.1.1 never ends such a session: the maximum
        ),
        (
            connect(properties=Properties(session_expiry_interval=10**6)),
            SETTINGS,
            Admit("c", None, 3600),
        ),
        (
            connect(properties=Properties(session_expiry_interval=60)),
            SETTINGS,
            Admit("c", None, 60),
        ),
        (connect(), MqttSettings(allow_anonymous=False), Refuse(RC.NOT_AUTHORIZED)),
        (connect(username="u"), MqttSettings(allow_anonymous=False), Admit("c", None, 0)),
        (
            connect(properties=Properties(authentication_method="SCRAM-SHA-256")),
            SETTINGS,
            Refuse(RC.BAD_AUTHENTICATION_METHOD),  # (no enhanced authentication)
        ),
        (
            connect(will=Will("a/b/c", b"")),
            MqttSettings(max_topic_levels=2, allow_anonymous=True),
            Refuse(RC.TOPIC_NAME_INVALID),  # (a will topic past our limits, as a PUBLISH's)
        ),
        (
            connect(will=Will("abcd", b"")),
            MqttSettings(max_topic_length=3, allow_anonymous=True),
            Refuse(RC.TOPIC_NAME_INVALID),
        ),
        (
            connect(will=Will("a/b", b"")),
            MqttSettings(max_topic_levels=2, max_topic_length=3, allow_anonymous=True),
            Admit("c", None, 0),
        ),
    ],
)
def test_admission(packet: Connect, settings: MqttSettings, expected: Admit | Refuse) -> None:
    assert admit(packet, settings, new_id) == expected


def test_a_will_topic_past_our_limits_is_3_1_1_return_code_5() -> None:
    """3.1.1 has no Topic Name invalid: the nearest is Not authorized (as mosquitto's
    for a will too large), not 3, Server unavailable, which tells the client to retry."""
    assert connack_return_code(RC.TOPIC_NAME_INVALID) == 0x05


def test_what_the_node_refused_becomes_the_connack_code() -> None:
    assert refusal(connect(), InvalidIdError("x")) == RC.CLIENT_IDENTIFIER_NOT_VALID
    refused = NotAuthorizedError("c", "connect", "", "no")
    assert refusal(connect(password=b"p"), refused) == RC.BAD_USER_NAME_OR_PASSWORD
    assert refusal(connect(), refused) == RC.NOT_AUTHORIZED
    assert refusal(connect(), StateError("redis is gone")) == RC.SERVER_UNAVAILABLE


@pytest.mark.parametrize(
    ("keepalive", "kept", "announced"), [(0, 600, 600), (601, 600, 600), (30, 30, None)]
)
def test_a_keepalive_of_zero_or_above_the_maximum_is_cut_and_announced(
    keepalive: int, kept: int, announced: int | None
) -> None:
    packet = connect(keepalive=keepalive)
    properties, keeps = connack_properties(packet, SETTINGS, Admit("c", None, 0))
    assert (keeps, properties.server_keep_alive) == (kept, announced)


def test_the_session_expiry_is_announced_only_when_cut_down() -> None:
    for asked, granted, announced in [(60, 60, None), (10**6, 3600, 3600), (None, 0, None)]:
        packet = connect(properties=Properties(session_expiry_interval=asked))
        properties, _ = connack_properties(packet, SETTINGS, Admit("c", "a", granted))
        assert properties.session_expiry_interval == announced
        assert properties.assigned_client_identifier == "a"


def test_disconnect_may_change_the_interval_but_not_from_zero() -> None:
    persistent = connect(properties=Properties(session_expiry_interval=60))
    change = Disconnect(0, Properties(session_expiry_interval=10**6))
    assert disconnect(change, persistent, SETTINGS) == 3600
    assert disconnect(Disconnect(0), persistent, SETTINGS) is None
    assert (
        disconnect(Disconnect(0, Properties(session_expiry_interval=0)), connect(), SETTINGS) == 0
    )
    with pytest.raises(MqttProtocolError):
        disconnect(change, connect(), SETTINGS)
    assert disconnect_ends(Disconnect(RC.NORMAL_DISCONNECTION)).keep_will is False
    assert disconnect_ends(Disconnect(0x04)).keep_will is True


IDS = st.integers(1, 4)
CODES = st.sampled_from([RC.SUCCESS, RC.NO_MATCHING_SUBSCRIBERS, RC.NOT_AUTHORIZED])


class AcknowledgementExchange(RuleBasedStateMachine):
    """The client publishes at QoS 1/2 and releases, the server delivers at QoS 2 and the
    client acknowledges, in any order, with ids it may not have been given. Model: which
    of the client's QoS 2 ids await PUBREL, which deliveries are in flight and released.
    What the outbox does with a :class:`Release` (the delivery leaves the window) is done
    here to ``inflight``, as it does it."""

    def __init__(self) -> None:
        super().__init__()
        self.v5 = True
        self.inflight: dict[int, Delivery] = {}
        self.awaiting: set[int] = set()
        self.acks = Acknowledgements(self.inflight, self.awaiting, self.v5)
        self.model_awaiting: set[int] = set()
        self.model_inflight: dict[int, bool] = {}  # id -> released
        self.published: list[int] = []

    @rule(level=st.sampled_from([MQTT_3_1_1, MQTT_5]))
    def protocol(self, level: int) -> None:
        self.v5 = level >= MQTT_5
        self.acks.v5 = self.v5

    @rule(packet_id=IDS, qos=st.sampled_from([1, 2]), code=CODES)
    def client_publishes(self, packet_id: int, qos: int, code: int) -> None:
        packet = Publish("t", b"p", qos, packet_id=packet_id)
        again = self.acks.resent(packet)
        if qos == 2 and packet_id in self.model_awaiting:
            assert again == PubRec(packet_id)  # published once, however often it comes
            return
        assert again is None
        self.published.append(packet_id)
        sent = code if self.v5 else 0
        ack = self.acks.published(packet, code)
        if qos == 1:
            assert ack == PubAck(packet_id, sent)
        else:
            assert ack == PubRec(packet_id, sent)
            if code < 0x80:
                self.model_awaiting.add(packet_id)

    @rule(packet_id=IDS)
    def client_releases(self, packet_id: int) -> None:
        expected = (
            RC.SUCCESS if packet_id in self.model_awaiting else RC.PACKET_IDENTIFIER_NOT_FOUND
        )
        assert self.acks.on_pubrel(PubRel(packet_id)) == PubComp(packet_id, expected)
        self.model_awaiting.discard(packet_id)

    @rule(packet_id=IDS)
    def server_delivers(self, packet_id: int) -> None:
        if packet_id not in self.inflight:  # (the outbox picks a free id)
            self.inflight[packet_id] = Delivery("t", b"p", 2, False, b"i" * 16)
            self.model_inflight[packet_id] = False

    @rule(packet_id=IDS, failed=st.booleans())
    def client_received(self, packet_id: int, failed: bool) -> None:
        code = RC.UNSPECIFIED_ERROR if failed else RC.SUCCESS
        actions = self.acks.on_pubrec(PubRec(packet_id, code))
        if failed:
            assert actions == [Release(packet_id)]
            self.model_inflight.pop(packet_id, None)
        elif packet_id in self.model_inflight:
            assert actions == [PubRel(packet_id)]
            self.model_inflight[packet_id] = True
        else:
            assert actions == [PubRel(packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND)]
        self._apply(actions)

    @rule(packet_id=IDS)
    def client_completed(self, packet_id: int) -> None:
        actions = self.acks.on_done(PubComp(packet_id))
        assert actions == [Release(packet_id)]
        self.model_inflight.pop(packet_id, None)
        self._apply(actions)

    def _apply(self, actions: list[object]) -> None:
        for action in actions:
            if isinstance(action, Release):
                self.inflight.pop(action.packet_id, None)

    @invariant()
    def the_session_holds_what_the_model_says(self) -> None:
        assert self.awaiting == self.model_awaiting
        assert {i: d.released for i, d in self.inflight.items()} == self.model_inflight


AcknowledgementExchange.TestCase.settings = hypothesis_settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
test_the_acknowledgement_exchange_in_any_order = AcknowledgementExchange.TestCase
