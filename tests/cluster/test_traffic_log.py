"""The traffic log: records, hidden files until complete, rotation, sampling, counted drops,
and the node that writes it (standalone Redis and the cluster)."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from router.cli import app
from router.cluster.traffic_log import FIELDS, TrafficLog, file_stem
from router.core.messages import Message
from router.errors import InvalidSettingError
from tests.support import waiting
from tests.support.nodes import StartNode


def message(topic: str = "a/b", payload: bytes = b"12345", qos: int = 1) -> Message:
    return Message(b"\x01" * 16, topic, payload, qos, False, None, 0.0)


def visible(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def hidden(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith("."))


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in visible(directory) for line in f.read_text().splitlines()]


def test_a_record_holds_every_field_of_the_publish(tmp_path: Path) -> None:
    log = TrafficLog(tmp_path, "node-1")
    log.start()
    log.record(message("sensors/a/t", b"x" * 256, qos=2), {"node-2": None, "node-3": None}, 4)
    log.close()
    [record] = records(tmp_path)
    assert tuple(record) == FIELDS
    assert record["node"] == "node-1"
    assert record["topic"] == "sensors/a/t"
    assert (record["payload_bytes"], record["qos"], record["retain"]) == (256, 2, False)
    assert record["forwarded"] == ["node-2", "node-3"]
    assert record["local_deliveries"] == 4
    assert isinstance(record["time"], float)
    assert log.stats() == {"traffic_records": 1, "traffic_dropped": 0, "traffic_files": 1}


def test_a_file_is_hidden_until_it_is_complete(tmp_path: Path) -> None:
    log = TrafficLog(tmp_path, "n", flush_interval=0.01)
    log.start()
    try:
        log.record(message(), (), 1)
        waiting.wait_until(lambda: bool(hidden(tmp_path)), 5, "the open .part file")
        assert visible(tmp_path) == []
        [part] = hidden(tmp_path)
        assert part.name.endswith(".jsonl.part")
    finally:
        log.close()
    assert hidden(tmp_path) == []
    [complete] = visible(tmp_path)
    assert complete.name.startswith("traffic-n-") and complete.name.endswith(".jsonl")


def test_files_rotate_by_size(tmp_path: Path) -> None:
    log = TrafficLog(tmp_path, "n", max_bytes=1, flush_interval=0.01)
    log.start()
    try:
        for index in range(3):
            log.record(message(f"t/{index}"), (), 0)
            waiting.wait_until(lambda i=index: log.written > i, 5, "the record written")
    finally:
        log.close()
    assert len(visible(tmp_path)) == 3
    assert sorted(r["topic"] for r in records(tmp_path)) == ["t/0", "t/1", "t/2"]


def test_files_rotate_by_age_without_closing(tmp_path: Path) -> None:
    log = TrafficLog(tmp_path, "n", max_seconds=0.05, flush_interval=0.01)
    log.start()
    try:
        log.record(message(), (), 0)
        waiting.wait_until(lambda: len(visible(tmp_path)) == 1, 5, "the file completed by age")
        assert hidden(tmp_path) == []
    finally:
        log.close()


def test_sampling_keeps_the_drawn_fraction(tmp_path: Path) -> None:
    log = TrafficLog(tmp_path, "n", sample=0.25, rng=random.Random(3))
    log.start()
    for index in range(400):
        log.record(message(f"t/{index}"), (), 0)
    log.close()
    draws = random.Random(3)
    expected = [f"t/{i}" for i in range(400) if draws.random() < 0.25]
    assert [r["topic"] for r in records(tmp_path)] == expected
    assert 50 < len(expected) < 150


def test_a_full_buffer_drops_and_counts_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = TrafficLog(tmp_path, "n", buffer_limit=3)
    for index in range(5):  # the writer is not running yet: the buffer fills up
        log.record(message(f"t/{index}"), (), 0)
    assert log.stats()["traffic_dropped"] == 2
    with caplog.at_level(logging.WARNING, logger="router.cluster.traffic_log"):
        log.start()
        log.close()
    assert [r["topic"] for r in records(tmp_path)] == ["t/0", "t/1", "t/2"]
    assert log.stats() == {"traffic_records": 3, "traffic_dropped": 2, "traffic_files": 1}
    assert "2 records dropped" in caplog.text


def test_a_failed_write_counts_its_records_as_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "log"
    log = TrafficLog(directory, "n")
    log.start()
    shutil.rmtree(directory)
    log.record(message(), (), 0)
    with caplog.at_level(logging.ERROR, logger="router.cluster.traffic_log"):
        log.close()
    assert log.stats()["traffic_dropped"] == 1
    assert log.stats()["traffic_records"] == 0
    assert "write failed" in caplog.text


@pytest.mark.parametrize(
    "setting",
    [{"sample": 0}, {"sample": 1.5}, {"sample": "1"}, {"buffer_limit": 0}, {"max_bytes": -1}],
)
def test_bad_settings_are_refused(tmp_path: Path, setting: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettingError):
        TrafficLog(tmp_path, "n", **setting)


def test_node_ids_become_safe_distinct_file_names() -> None:
    assert file_stem("node-1.a_b") == "node-1.a_b"
    odd = [file_stem(n) for n in ("a/b", "a b", "a:b", "../x")]
    assert len(set(odd)) == 4
    assert all("/" not in name and " " not in name for name in odd)


def test_node_run_refuses_a_bad_sample() -> None:
    result = CliRunner().invoke(
        app, ["node", "run", "--traffic-dir", "/tmp/x", "--traffic-sample", "0"]
    )
    assert result.exit_code == 2
    assert "--traffic-sample" in result.output


# -- the node writes it ---------------------------------------------------------------------


@pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)
async def test_a_node_logs_forwards_and_local_deliveries(
    start_node: StartNode, tmp_path: Path
) -> None:
    a = await start_node("a", traffic_dir=str(tmp_path))
    b = await start_node("b")
    await start_node("c")
    await a.subscribe("here-1", "t/#")
    await a.subscribe("here-2", "t/+")
    await b.subscribe("there", "t/x")
    await waiting.eventually(lambda: "b" in a.mirror.match("t/x").nodes, 5, "b's route on a")
    await a.publish("t/x", b"abc", qos=1)
    await a.publish("t/y", b"de")
    await a.publish("nobody/cares", b"f")
    await a.stop()
    assert a.stats()["traffic_records"] == 3
    assert a.stats()["traffic_dropped"] == 0
    logged = {r["topic"]: r for r in records(tmp_path)}
    assert set(logged) == {"t/x", "t/y", "nobody/cares"}
    assert (logged["t/x"]["forwarded"], logged["t/x"]["local_deliveries"]) == (["b"], 2)
    assert (logged["t/y"]["forwarded"], logged["t/y"]["local_deliveries"]) == ([], 2)
    assert (logged["nobody/cares"]["forwarded"], logged["nobody/cares"]["local_deliveries"]) == (
        [],
        0,
    )
    assert logged["t/x"]["payload_bytes"] == 3 and logged["t/x"]["qos"] == 1
    assert {r["node"] for r in logged.values()} == {"a"}


@pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)
async def test_without_a_directory_a_node_writes_no_log(start_node: StartNode) -> None:
    node = await start_node("a")
    await node.publish("t/x", b"1")
    assert "traffic_records" not in node.stats()
