"""``router bench redis`` through click's CliRunner, on tiny sizes (the shape, not the speed)."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from router.bench.redis import PREFIX_STEM, RedisBenchConfig, _Best, _report
from router.cli import app
from router.errors import BenchSetupError

TINY = [
    "--subscriptions",
    "20",
    "--batched-subscriptions",
    "60",
    "--subscribe-batch",
    "25",
    "--messages",
    "120",
    "--publish-batch",
    "50",
    "--fetch-max",
    "30",
    "--rounds",
    "2",
]
RATES = (
    "subscribe_per_s",
    "subscribe_batched_per_s",
    "channel_publish_per_s",
    "raw_publish_per_s",
    "publish_ratio",
    "fetch_ack_per_s",
    "bytes_per_subscription",
    "bytes_per_channel_message",
)


def run_json(*extra: str) -> dict[str, object]:
    result = CliRunner().invoke(app, ["bench", "redis", "--json", *TINY, *extra])
    assert result.exit_code == 0, result.output
    report: dict[str, object] = json.loads(result.output)
    return report


@pytest.mark.redis  # the embedded Redis is a real redis-server where one is installed
def test_json_shape_on_an_embedded_redis() -> None:
    report = run_json()
    for field in RATES:
        value = report[field]
        assert isinstance(value, int | float), field
        assert value > 0, field
    assert report["publish_batch"] == 50
    assert report["subscribe_batch"] == 25
    assert report["fetch_max"] == 30
    assert report["messages"] == 120
    assert report["payload_bytes"] == 256
    assert isinstance(report["redis_version"], str)
    assert report["redis_version"].count(".") == 2
    # A message stores at least its 256-byte payload (body key) and its dedup key.
    assert isinstance(report["bytes_per_channel_message"], float)
    assert report["bytes_per_channel_message"] > 256
    assert isinstance(report["publish_target_met"], bool)
    assert isinstance(report["subscribe_target_met"], bool)


def test_given_redis_is_left_without_bench_keys(redis_standalone_url: str) -> None:
    client = redis.Redis.from_url(redis_standalone_url)
    try:
        before = set(client.scan_iter(match=f"{PREFIX_STEM}*"))
        run_json("--redis", redis_standalone_url)
        assert set(client.scan_iter(match=f"{PREFIX_STEM}*")) == before
    finally:
        client.close()


def test_table_output(redis_standalone_url: str) -> None:
    result = CliRunner().invoke(
        app, ["bench", "redis", *TINY, "--rounds", "1", "--redis", redis_standalone_url]
    )
    assert result.exit_code == 0, result.output
    assert "publish_ratio" in result.output
    assert "bytes_per_subscription" in result.output


def test_cluster_is_refused(redis_cluster_url: str) -> None:
    result = CliRunner().invoke(app, ["bench", "redis", *TINY, "--redis", redis_cluster_url])
    assert result.exit_code != 0
    assert "standalone" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("field", ["messages", "publish_batch", "rounds"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(BenchSetupError):
        RedisBenchConfig(**{field: 0})


def test_ratios_are_cut_never_rounded() -> None:
    config = RedisBenchConfig(subscriptions=100, batched_subscriptions=100, messages=1000)
    seconds = {
        "subscribe": 1.4272,
        "subscribe_batched": 1.0,
        "channel_publish": 1.0,
        "raw_publish": 1.14956,
        "fetch_ack": 1.0,
    }
    memory = dict.fromkeys(
        ("bytes_per_subscription", "bytes_per_channel_message", "used_memory_per_channel_message"),
        1.0,
    )
    report = _report(config, "7.0.0", _Best(seconds, memory))
    assert report["publish_ratio"] == 1.14  # rounded, 1.15 would claim more than measured
    assert report["subscribe_batched_speedup"] == 1.42
