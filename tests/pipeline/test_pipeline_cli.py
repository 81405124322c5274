"""What ``router pipeline`` refuses, each as one ``Error:`` line (never a traceback), and the
pieces under the jobs: the import script, the key patterns, row validation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result

from router.cli import app
from router.core.options import make_options
from router.errors import ScriptError
from router.pipeline import spark_session
from router.pipeline.jobs import is_redis_url
from router.pipeline.loader import ImportCounts, ImportRowError, parse_row, plan_clients
from router.state.keys import Keys
from router.state.scripts import Scripts, script_source
from router.state.subscriptions import pack_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def csv_file(tmp_path: Path, text: str = "client_id,filter,qos\nc,a/b,0\n") -> str:
    path = tmp_path / "subs.csv"
    path.write_text(text)
    return str(path)


# -- refused before Spark starts ---------------------------------------------------------


def test_missing_pyspark_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(spark_session, "find_spec", lambda name: None)
    line = one_error_line(invoke("pipeline", "import", "--subs", csv_file(tmp_path)))
    assert "pyspark is not installed" in line and "router[spark]" in line


def test_a_java_home_without_java_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    line = one_error_line(invoke("pipeline", "export", "--out", str(tmp_path / "out")))
    assert "has no bin/java" in line


def test_an_old_java_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = tmp_path / "jdk8" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"1.8.0_292\"' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    line = one_error_line(
        invoke("pipeline", "report", "--traffic", "t", "--subs", "s", "--out", "o")
    )
    assert "Java 17+" in line and "Java 8" in line


def test_a_missing_subscriptions_file_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(invoke("pipeline", "import", "--subs", str(tmp_path / "nope.csv")))
    assert "no subscriptions file at" in line


def test_an_unknown_format_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "subs.txt"
    path.write_text("x")
    line = one_error_line(invoke("pipeline", "import", "--subs", str(path)))
    assert "cannot tell the format" in line


def test_a_bad_redis_url_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(
        invoke("pipeline", "import", "--redis", "redis://:x:y", "--subs", csv_file(tmp_path))
    )
    assert "Redis URL" in line


def test_an_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(
        invoke(
            "pipeline", "import", "--redis", "redis://127.0.0.1:1/0", "--subs", csv_file(tmp_path)
        )
    )
    assert "cannot reach Redis" in line


def test_export_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    line = one_error_line(invoke("pipeline", "export", "--out", str(tmp_path)))
    assert "--overwrite" in line
    assert (tmp_path / "keep.txt").read_text() == "mine"


# -- refused by the Spark side -------------------------------------------------------------


def test_a_missing_column_is_one_line(
    spark: SparkSession, redis_standalone_url: str, tmp_path: Path
) -> None:
    path = csv_file(tmp_path, "client_id,topic\nc,a/b\n")
    line = one_error_line(
        invoke("pipeline", "import", "--redis", redis_standalone_url, "--subs", path)
    )
    assert "has no column filter, qos" in line


def test_a_missing_traffic_log_is_one_line(spark: SparkSession, tmp_path: Path) -> None:
    subs = csv_file(tmp_path)
    args = ["--subs", subs, "--out", str(tmp_path / "out")]
    line = one_error_line(invoke("pipeline", "report", "--traffic", str(tmp_path / "no"), *args))
    assert "no traffic log at" in line


def test_a_traffic_log_spark_cannot_read_is_one_line(spark: SparkSession, tmp_path: Path) -> None:
    traffic = tmp_path / "traffic.parquet"
    traffic.write_bytes(b"not parquet, not json")
    subs = tmp_path / "subs.parquet"
    subs.write_bytes(b"PAR1 broken")
    args = ["--traffic", str(traffic), "--subs", str(subs), "--out", str(tmp_path / "out")]
    line = one_error_line(invoke("pipeline", "report", *args))
    assert line.startswith("Error: Spark job failed: ")


# -- the import script ---------------------------------------------------------------------


def test_the_import_script_opens_with_its_contract() -> None:
    text = script_source("import_subscriptions")
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    for pattern in (r"^-- KEYS\[1\] = ", r"^-- ARGV\[1\]", r"^-- returns "):
        assert re.search(pattern, header, re.M)
    for line in text.splitlines():
        code = line.split("--", 1)[0]
        assert not re.match(r"^\s*(function\b|[A-Za-z_]\w*\s*=[^=])", code), line


async def test_the_import_script_writes_only_changes(redis_client: Any, keys: Keys) -> None:
    scripts = Scripts(redis_client)
    key = [keys.client_subscriptions("c{1}")]
    one, two = pack_options(make_options()), pack_options(make_options(qos=1))
    assert await scripts.run("import_subscriptions", key, ["a", one, "b", one]) == [1, 1]
    assert await scripts.run("import_subscriptions", key, ["a", one, "b", two]) == [0, 2]
    assert await redis_client.hgetall(key[0]) == {b"a": one, b"b": two}
    for bad in ([], ["a"], ["", one], ["a", ""]):
        with pytest.raises(ScriptError):
            await scripts.run("import_subscriptions", key, bad)
    assert await redis_client.hgetall(key[0]) == {b"a": one, b"b": two}


# -- keys and rows -------------------------------------------------------------------------


@pytest.mark.parametrize("client_id", ["plain", "{", "}{", "a}:subs", "%7B", "ü x"])
def test_subscription_keys_name_their_client(client_id: str) -> None:
    keys = Keys("p[1]")
    key = keys.client_subscriptions(client_id)
    assert keys.client_of_subscriptions_key(key) == client_id
    assert keys.client_of_subscriptions_key(keys.client_owner(client_id)) is None
    assert keys.client_subscriptions_pattern() == "p\\[1\\]:{c:*}:subs"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ((None, "a", "0"), "client_id is missing"),
        (("c", None, "0"), "filter is missing"),
        (("c", "a", " "), "qos is missing"),
        (("c", "a", "x"), "qos must be an integer"),
        (("c", "a", "3"), "qos must be 0, 1 or 2"),
        (("c", "a/#/b", "0"), "must be the last level"),
        (("c", "a", "0", "maybe"), "no_local must be true or false"),
        (("c", "a", "0", "", "", "9"), "retain_handling must be 0, 1 or 2"),
        (("c", "a", "0", "", "", "", "0"), "subscription_identifier must be"),
        (("c", "$share/g/a", "0", "1"), "shared subscription cannot set no_local"),
    ],
)
def test_rows_are_rejected_with_their_reason(row: tuple[str | None, ...], reason: str) -> None:
    with pytest.raises(ImportRowError, match=re.escape(reason)):
        parse_row(row)


def test_a_row_with_every_option() -> None:
    row = ("c", "a/+", "2", "TRUE", "1", "2", "42")
    assert parse_row(row) == (
        "c",
        "a/+",
        make_options(
            qos=2,
            no_local=True,
            retain_as_published=True,
            retain_handling=2,
            subscription_identifier=42,
        ),
    )


def test_a_client_with_a_bad_row_is_left_out_whole() -> None:
    counts = ImportCounts()
    plans = plan_clients(
        [("a", "x", "0"), ("b", "y", "0"), ("a", "bad/#/x", "0"), ("b", "y", "1")], counts
    )
    assert plans == {"b": {"y": make_options(qos=1)}}
    assert (counts.rejected, counts.skipped) == (2, 1)
    first, second = counts.rejects
    assert (first.filter, first.reason) == ("x", "another row of this client was rejected")
    assert second.filter == "bad/#/x" and "'#' must be the last level" in second.reason


@pytest.mark.parametrize(
    ("source", "is_redis"),
    [
        ("redis://127.0.0.1:6379/0", True),
        ("rediss://h:6380/0", True),
        ("unix:///tmp/redis.sock", True),
        ("redis+sentinel://s1:26379,s2:26379/mymaster", True),
        ("rediss+sentinel://s1/mymaster", True),
        ("subs.csv", False),
        ("./export-dir", False),
    ],
)
def test_a_subscriptions_source_is_a_redis_url_or_a_file(source: str, is_redis: bool) -> None:
    assert is_redis_url(source) is is_redis
