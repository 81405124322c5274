"""Loading an ACL for a node (API and ``router node run --acl``) and the policy's cost flags."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from router.cli import app
from router.cluster.policy import Policy, load_acl
from router.core.acl import Acl, Permission
from router.core.hooks import HookPoint, HookRegistry
from router.errors import AclRuleError
from router.state.keys import Keys
from tests.support.cli import delete_namespace, router_process

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "acl.conf"
UNREACHABLE = "redis://127.0.0.1:1/0"


def test_load_acl_from_a_file_or_an_acl(tmp_path: Path) -> None:
    assert load_acl(None) is None
    example = load_acl(str(EXAMPLE))
    assert example is not None and example.default is Permission.DENY
    assert len(example.rules) == 7
    allowing = load_acl(EXAMPLE, "allow")
    assert allowing is not None and allowing.default is Permission.ALLOW
    given = Acl.parse("allow all all a/#")
    assert load_acl(given) is given
    replaced = load_acl(given, Permission.ALLOW)
    assert replaced is not None and replaced.rules == given.rules
    assert replaced.default is Permission.ALLOW


def test_load_acl_refuses_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "acl.conf"
    bad.write_text("# rules\nallow all publish a/#\nallow all publish a/#/b\n", encoding="utf-8")
    with pytest.raises(AclRuleError) as caught:
        load_acl(str(bad))
    assert (caught.value.path, caught.value.line) == (str(bad), 3)
    with pytest.raises(AclRuleError, match="cannot read"):
        load_acl(tmp_path / "missing.conf")
    with pytest.raises(AclRuleError, match="'allow' or 'deny'"):
        load_acl(Acl(), "maybe")
    with pytest.raises(AclRuleError, match="needs an ACL"):
        load_acl(None, "deny")


def test_the_flags_say_which_paths_have_work() -> None:
    hooks = HookRegistry()
    policy = Policy(hooks)
    assert not (policy.guards_publish or policy.guards_subscribe or policy.reports_drops)
    assert policy.delivery_observer is None

    def note(*args: object) -> None:
        return None

    hooks.register(HookPoint.MESSAGE_DELIVERED, note)
    assert policy.delivery_observer is not None and not policy.reports_drops
    hooks.unregister(HookPoint.MESSAGE_DELIVERED, note)
    assert policy.delivery_observer is None
    Policy(hooks, Acl())  # an ACL registers itself at client.check_acl
    assert policy.guards_publish and policy.guards_subscribe


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--acl", "LINE3"], "acl.conf:3: the action must be"),
        (["--acl", "MISSING"], "cannot read the ACL file"),
        (["--acl-default", "allow"], "needs an ACL"),
    ],
)
def test_node_run_with_a_bad_acl_is_one_line(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    path = tmp_path / "acl.conf"
    path.write_text("allow all all a/#\n\nallow all pub a/#\n", encoding="utf-8")
    paths = {"LINE3": str(path), "MISSING": str(tmp_path / "missing.conf")}
    argv = ["node", "run", *(paths.get(arg, arg) for arg in args), "--redis", UNREACHABLE]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ") and expected in line  # before any connection attempt


def test_node_run_process_with_a_bad_acl_file(tmp_path: Path) -> None:
    path = tmp_path / "acl.conf"
    path.write_text("allow everyone\n", encoding="utf-8")
    with router_process("node", "run", "--acl", str(path), "--redis", UNREACHABLE) as node:
        code, out, err = node.finish()
    assert code == 1
    assert out == []
    [line] = err  # one line, no traceback
    assert line.startswith(f"Error: {path}:1: expected '<allow|deny> <subject>")


def test_node_run_loads_the_example_acl(redis_standalone_url: str, keys: Keys) -> None:
    env = {"ROUTER_PREFIX": keys.prefix, "ROUTER_NODE_ID": "guarded"}
    args = ["node", "run", "--redis", redis_standalone_url, "--acl", str(EXAMPLE)]
    try:
        with router_process(*args, "--acl-default", "allow", env=env) as node:
            line = node.wait_for("ACL ")
            assert line.endswith(f"ACL {EXAMPLE}: 7 rules, default allow")
            node.wait_for("node guarded ready")
            node.signal(signal.SIGTERM)
            code, _, err = node.finish()
        assert code == 0, err
    finally:
        delete_namespace(redis_standalone_url, keys)
