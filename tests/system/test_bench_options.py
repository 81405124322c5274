"""Every option of every ``router bench`` command, given a bad value: one ``Error:`` line
and a non-zero exit, never a traceback, and no process started first."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from router.cli import app

MALFORMED = "nowhere://x"
UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens on port 1
A_FILE = "<a file>"  # replaced by the path of an existing regular file
A_FULL_DIRECTORY = "<a directory with a file in it>"
NOT_AN_ACL = str(Path(__file__).resolve().parents[2] / "README.md")

BAD: dict[str, list[tuple[str, str]]] = {
    "match": [
        ("--subscriptions", "0"),
        ("--subscriptions", "-5"),
        ("--topics", "0"),
        ("--topics", "-1"),
        ("--rounds", "0"),
        ("--rounds", "-1"),
        ("--hot-publishes", "0"),
        ("--hot-publishes", "-3"),
        ("--workload", "nosuch"),
    ],
    "redis": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--subscriptions", "0"),
        ("--batched-subscriptions", "-1"),
        ("--subscribe-batch", "0"),
        ("--messages", "0"),
        ("--publish-batch", "-2"),
        ("--fetch-max", "0"),
        ("--rounds", "0"),
    ],
    "cluster": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--messages", "0"),
        ("--messages", "-1"),
        ("--rate", "0"),
        ("--rate", "-5"),
        ("--rate", "nan"),
        ("--rate", "inf"),
        ("--seconds", "0"),
        ("--seconds", "nan"),
        ("--seconds", "inf"),
        ("--convergence-rounds", "0"),
        ("--traffic-dir", A_FILE),
    ],
    "mqtt": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--messages", "0"),
        ("--publishers", "0"),
        ("--subscribers", "0"),
        ("--subscribers", "9"),
        ("--fanout", "0"),
        ("--fanout", "5"),
        ("--window", "0"),
        ("--rate", "0"),
        ("--rate", "nan"),
        ("--rate", "inf"),
        ("--seconds", "0"),
        ("--seconds", "nan"),
        ("--drain-seconds", "-1"),
        ("--drain-seconds", "nan"),
        ("--acl", "/nonexistent/acl.conf"),
        ("--acl", NOT_AN_ACL),
    ],
    "pipeline": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--publishes", "0"),
        ("--subscriptions", "0"),
        ("--topics", "-1"),
        ("--nodes", "1"),
        ("--rounds", "0"),
        ("--master", "nowhere"),
        ("--master", ""),
    ],
    "soak": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--minutes", "0"),
        ("--minutes", "inf"),
        ("--fault-every", "nan"),
        ("--fault-every", "inf"),
        ("--subscriptions", "5"),
        ("--qos1-rate", "-1"),
        ("--qos0-rate", "nan"),
        ("--qos0-rate", "inf"),
        ("--churn", "-3"),
        ("--sample-seconds", "0"),
        ("--sample-seconds", "inf"),
        ("--logs", A_FILE),
        ("--logs", A_FULL_DIRECTORY),
    ],
    "fleet": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--connections", "0"),
        ("--connections", "-1"),
        ("--sessions", "0"),
        ("--sessions", "-5"),
        ("--clean-sessions", "-1"),
        ("--processes", "0"),
        ("--processes", "65"),
        ("--in-flight", "0"),
        ("--in-flight", "-1"),
        ("--rate", "0"),
        ("--rate", "nan"),
        ("--rate", "inf"),
        ("--ttl", "0"),
        ("--ttl", "nan"),
        ("--ttl", "inf"),
        ("--ttl", "601"),
    ],
    "hostile": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--probes", "0"),
        ("--probes", "-1"),
        ("--probes", "1001"),
        ("--seconds", "0"),
        ("--seconds", "nan"),
        ("--seconds", "inf"),
        ("--floods", "nosuch"),
        ("--floods", ","),
        ("--lorises", "-1"),
        ("--lorises", "50001"),
        ("--loris-bytes", "0"),
        ("--loris-hold", "0"),
        ("--loris-hold", "nan"),
        ("--loris-waves", "0"),
        ("--node-max-unfinished-bytes", "-1"),
        ("--node-packet-timeout", "-1"),
        ("--node-packet-timeout", "inf"),
    ],
    "backends": [
        ("--redis", MALFORMED),
        ("--redis", UNREACHABLE),
        ("--workers", "0"),
        ("--workers", "33"),
        ("--senders", "0"),
        ("--groups", "0"),
        ("--groups", "-1"),
        ("--members-per-group", "0"),
        ("--members-per-group", "5"),
        ("--messages", "0"),
        ("--payload-bytes", "-1"),
        ("--rate", "0"),
        ("--rate", "nan"),
        ("--rate", "inf"),
        ("--seconds", "0"),
        ("--seconds", "nan"),
        ("--seconds", "inf"),
    ],
}
ANY_VALUE_IS_GOOD = {"--seed"}  # every int seeds the workload
CASES = [(command, option, value) for command, bad in BAD.items() for option, value in bad]


@pytest.fixture
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a process fails the test: options are checked before anything starts."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.mark.usefixtures("no_process")
@pytest.mark.parametrize(("command", "option", "value"), CASES)
def test_a_bad_option_is_one_error_line(
    command: str, option: str, value: str, tmp_path: Path
) -> None:
    if value == A_FILE:
        (tmp_path / "file").write_text("")
        value = str(tmp_path / "file")
    elif value == A_FULL_DIRECTORY:
        (tmp_path / "redis").mkdir()
        value = str(tmp_path)
    result = CliRunner().invoke(app, ["bench", command, option, value, "--json"])
    assert result.exit_code not in (0, None), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output


def test_every_option_of_every_bench_has_a_bad_value() -> None:
    group = app.commands["bench"]
    assert isinstance(group, click.Group)
    assert set(group.commands) == set(BAD)
    for name, command in group.commands.items():
        options = {
            opt
            for param in command.params
            if isinstance(param, click.Option) and not param.is_flag
            for opt in param.opts
            if opt.startswith("--")
        }
        covered = {option for option, _ in BAD[name]}
        assert options - ANY_VALUE_IS_GOOD == covered, name
