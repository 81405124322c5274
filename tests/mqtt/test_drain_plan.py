"""The decisions of a drain (:class:`router.mqtt.drain.DrainPlan`), without a socket: how
many connections end when, and what each client is told."""

from __future__ import annotations

import pytest

from router.errors import InvalidSettingError
from router.mqtt.drain import DrainPlan, DrainReport, DrainSettings
from router.mqtt.reason_codes import ReasonCode


def test_a_paced_drain_ends_rate_connections_a_second_and_the_rest_after_the_grace() -> None:
    plan = DrainPlan(DrainSettings(grace=10.0, rate=100, window=0))
    assert plan.due(0.0, 1_000) == 1  # (one at once)
    assert plan.due(0.005, 999) == 0
    assert plan.due(0.5, 999) == 50  # (51 by half a second)
    assert plan.due(0.5, 949) == 0
    assert plan.due(2.0, 949) == 150
    assert plan.due(10.0, 799) == 799  # (the grace ran out: every one left)
    assert plan.ended == 1_000


def test_a_drain_at_rate_0_and_window_0_ends_every_connection_at_once() -> None:
    plan = DrainPlan(DrainSettings(grace=30.0, rate=0, window=0))
    assert plan.due(0.0, 5_000) == 5_000


def test_fewer_connections_than_the_pace_allows_end_as_they_are() -> None:
    plan = DrainPlan(DrainSettings(grace=30.0, rate=1_000, window=0))
    assert plan.due(1.0, 3) == 3
    assert plan.due(1.1, 2) == 2  # (newly accepted ones: the pace allows them too)


def test_mqtt5_clients_go_round_the_peers_references_and_others_are_closed() -> None:
    plan = DrainPlan(DrainSettings(), ["10.0.0.2:1883", "10.0.0.3:1883"])
    told = [plan.disconnect(5, True) for _ in range(3)]
    assert told == [
        (ReasonCode.USE_ANOTHER_SERVER, "10.0.0.2:1883"),
        (ReasonCode.USE_ANOTHER_SERVER, "10.0.0.3:1883"),
        (ReasonCode.USE_ANOTHER_SERVER, "10.0.0.2:1883"),
    ]
    assert plan.disconnect(4, True) == (None, None)  # (3.1.1: no DISCONNECT from a server)
    assert plan.disconnect(5, False) == (None, None)  # (no CONNACK yet)


def test_without_references_mqtt5_clients_are_told_the_server_shuts_down() -> None:
    assert DrainPlan(DrainSettings()).disconnect(5, True) == (
        ReasonCode.SERVER_SHUTTING_DOWN,
        None,
    )


@pytest.mark.parametrize(
    "settings",
    [{"grace": -1.0}, {"grace": float("nan")}, {"rate": -1}, {"rate": 1.5}, {"window": -1}],
)
def test_bad_drain_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(InvalidSettingError):
        DrainSettings(**settings)  # type: ignore[arg-type]


def test_a_report_adds_up_what_it_ended() -> None:
    report = DrainReport(redirected=3, shut_down=2, closed=1, unfinished=0, seconds=1.23456)
    assert report.ended == 6
    assert report.as_dict()["seconds"] == 1.235


def test_a_drain_ends_no_more_while_its_window_of_sessions_is_on_their_way() -> None:
    plan = DrainPlan(DrainSettings(grace=30.0, rate=0, window=100))
    assert plan.due(0.0, 1_000, on_their_way=0, moved_lately=0) == 32  # (the least window)
    assert plan.due(0.5, 968, on_their_way=32, moved_lately=0) == 0  # (none resumed yet)
    assert plan.due(1.0, 968, on_their_way=12, moved_lately=20) == 20  # (20 resumed)
    assert plan.due(30.0, 948, on_their_way=32, moved_lately=0) == 948  # (the grace ran out)


def test_the_window_follows_what_the_other_nodes_took_in_lately() -> None:
    plan = DrainPlan(DrainSettings(window=256))
    assert plan.window(0) == 32  # (nothing moved yet: the least)
    assert plan.window(150) == 150  # (150 resumed over the last 2 s: as many on their way)
    assert plan.window(10_000) == 256  # (at most the setting)
    assert DrainPlan(DrainSettings(window=0)).window(0) == 0  # (no bound)


def test_a_window_of_0_leaves_the_pace_to_the_rate() -> None:
    plan = DrainPlan(DrainSettings(grace=30.0, rate=0, window=0))
    assert plan.due(0.0, 5_000, on_their_way=5_000) == 5_000
