"""Expected failures of the operator CLI: one line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result
from redis import Redis

from router.cli import app
from tests.support.servers import RedisServer

UNREACHABLE = "redis://127.0.0.1:1/0"

# Every command that talks to Redis, with arguments that are fine in themselves.
COMMANDS = [
    ["nodes"],
    ["routes"],
    ["routes", "--node", "a"],
    ["match", "a/b"],
    ["subs", "c"],
    ["aliases", "c"],
    ["trie", "dump"],
    ["channels", "list"],
    ["channels", "show", "inbox:a"],
    ["reconcile"],
    ["reconcile", "--repair"],
    ["publish", "a/b", "x"],
    ["subscribe", "a/#", "--count", "1"],
    ["node", "run"],
]


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def assert_clean_failure(result: Result, expected: str) -> None:
    """Exit 1 through click (no other exception escaped) with one line naming the problem."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: ") and expected in lines[0], lines


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_unreachable_redis(command: list[str]) -> None:
    assert_clean_failure(run(*command, "--redis", UNREACHABLE), "cannot reach Redis")


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    "url", ["not-a-url", "redis://127.0.0.1:notaport", "http://127.0.0.1:6379"]
)
def test_bad_url(command: list[str], url: str) -> None:
    assert_clean_failure(run(*command, "--redis", url), "bad Redis URL")


def test_the_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_REDIS_URL", UNREACHABLE)
    assert_clean_failure(run("nodes"), "127.0.0.1:1")


@pytest.mark.parametrize(
    "args",
    [
        ["match", "a/+"],
        ["match", "a/#"],
        ["match", ""],
        ["publish", "a/+/b", "x"],
        ["subscribe", "a/#/b"],
        ["subscribe", "$share/g"],
        ["routes", "--filter", "a/b#"],
    ],
    ids=" ".join,
)
def test_invalid_topic_or_filter_fails_before_connecting(args: list[str]) -> None:
    # The URL is unreachable: the input error must come first.
    assert_clean_failure(run(*args, "--redis", UNREACHABLE), "invalid topic")


def test_bad_prefix() -> None:
    assert_clean_failure(run("nodes", "--prefix", "a{b", "--redis", UNREACHABLE), "prefix")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["routes", "--node", "ghost"], "unknown node 'ghost'"),
        (["trie", "dump", "--node", "ghost"], "unknown node 'ghost'"),
        (["channels", "show", "no-such-channel"], "does not exist"),
        (["subs", ""], "client id"),
        (["subs", "ghost"], "client 'ghost' has no session under prefix 't-unknown'"),
        (["aliases", "ghost"], "client 'ghost' has no session under prefix 't-unknown'"),
        (["clients", "show", "ghost"], "client 'ghost' has no session"),
        (["clients", "kick", "ghost"], "client 'ghost' has no session"),
        (["clients", "clear", "ghost"], "client 'ghost' has no session"),
        (["retained", "get", "no/such/topic"], "no retained message"),
    ],
    ids=[
        *("routes", "trie", "channel", "empty-client", "subs", "aliases"),
        *("show", "kick", "clear", "retained"),
    ],
)
def test_unknown_things_on_a_real_redis(
    args: list[str], expected: str, redis_standalone_url: str
) -> None:
    result = run(*args, "--redis", redis_standalone_url, "--prefix", "t-unknown")
    assert_clean_failure(result, expected)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["users", "remove", "nobody"], "no user nobody"),
        (["users", "passwd", "nobody"], "no user nobody"),
        (["acl", "remove", "allow all publish x"], "no rule allow all publish x"),
        (["bans", "remove", "client", "nobody"], "no ban of client nobody"),
    ],
    ids=["users-remove", "users-passwd", "acl-remove", "bans-remove"],
)
def test_nothing_to_change_is_a_failure_told_on_stderr(
    args: list[str], expected: str, redis_standalone_url: str
) -> None:
    result = CliRunner().invoke(
        app, [*args, "--redis", redis_standalone_url, "--prefix", "t-unknown"], input="pw\n"
    )
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.output
    assert result.stderr.splitlines() == [expected]


# The read-only views, each with what it prints for an empty namespace under --json.
VIEWS = [
    (["nodes"], []),
    (["routes"], []),
    (["match", "a/b"], {"topic": "a/b", "nodes": [], "filters": {}, "shared": {}}),
    (["clients"], []),
    (["channels", "list"], []),
]


@pytest.mark.parametrize(("args", "empty"), VIEWS, ids=[" ".join(a) for a, _ in VIEWS])
def test_a_prefix_without_nodes_is_a_warning_and_json_may_come_first(
    args: list[str], empty: object, redis_standalone_url: str
) -> None:
    target = ["--redis", redis_standalone_url, "--prefix", "t-typo"]
    warning = "warning: no node is registered under prefix 't-typo' (a mistyped --prefix"
    table = run(*args, *target)
    assert table.exit_code == 0, table.output
    [line] = table.stderr.splitlines()
    assert line.startswith(warning), line
    for order in ([*args, *target, "--json"], ["--json", *args, *target]):
        result = run(*order)
        assert result.exit_code == 0, (order, result.output)
        assert json.loads(result.stdout) == empty, order
        assert result.stderr.startswith(warning), order


def test_json_before_the_command_reaches_a_subcommand_of_a_group(redis_standalone_url: str) -> None:
    result = run("--json", "retained", "count", "--redis", redis_standalone_url, "--prefix", "t-x")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"count": 0}


def test_help_lists_the_operator_commands() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for name in (
        "nodes",
        "routes",
        "match",
        "subs",
        "aliases",
        "publish",
        "subscribe",
        "channels",
        "trie",
        "reconcile",
        "node",
    ):
        assert f"  {name}" in result.output, name


@pytest.fixture
def guarded_redis(redis_server_factory: Callable[[], RedisServer]) -> Iterator[str]:
    """A server with a password on its default user and a user "narrow" that may not run
    scripts; yields its address as ``HOST:PORT``."""
    server = redis_server_factory()
    admin = Redis.from_url(server.url)
    try:
        admin.acl_setuser(
            "narrow",
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-evalsha", "-eval"],
        )
        admin.config_set("requirepass", "s3cret")
    finally:
        admin.close()
    yield f"127.0.0.1:{server.port}"


@pytest.mark.parametrize(
    "command", [["nodes"], ["publish", "a/b", "x"], ["node", "run"]], ids=" ".join
)
def test_wrong_credentials_and_missing_permissions_say_so(
    guarded_redis: str, command: list[str]
) -> None:
    for url in (f"redis://:wrong@{guarded_redis}/0", f"redis://{guarded_redis}/0"):
        assert_clean_failure(run(*command, "--redis", url), "Redis refused the credentials")
    narrow = f"redis://narrow:pw@{guarded_redis}/0"
    assert_clean_failure(run(*command, "--redis", narrow), "Redis denies a command the router")
