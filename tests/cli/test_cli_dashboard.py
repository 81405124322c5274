"""``router dashboard users|keys`` and ``router node run --http`` (plain and TLS), as an
operator runs them, against real Redis (standalone and a 3-master cluster)."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from router.cli import app
from tests.support.cli import invoke, invoke_json, router_process
from tests.support.pki import make_pki


def add_user(url: str, prefix: str, *args: str, password: str = "pw-secret-long") -> Any:
    result = CliRunner().invoke(
        app,
        [
            "dashboard",
            "users",
            "add",
            *args,
            "--password-stdin",
            "--json",
            "--redis",
            url,
            "--prefix",
            prefix,
        ],
        input=password + "\n",
    )
    return result


def test_users_and_keys(redis_url: str, prefix: str) -> None:
    added = add_user(redis_url, prefix, "root", "--role", "admin")
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout) == {"changed": True}
    again = add_user(redis_url, prefix, "root")
    assert again.exit_code == 1 and json.loads(again.stdout) == {"changed": False}
    assert add_user(redis_url, prefix, "ops").exit_code == 0  # (viewer by default)
    assert invoke_json(redis_url, prefix, "dashboard", "users", "list") == [
        {"name": "ops", "role": "viewer"},
        {"name": "root", "role": "admin"},
    ]
    bad = add_user(redis_url, prefix, "no spaces")
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert bad.output.startswith("Error:") and len(bad.output.strip().splitlines()) == 1
    # (before: a password of 5 characters made an admin)
    short = add_user(redis_url, prefix, "boss", "--role", "admin", password="admin")
    assert short.exit_code == 1 and "Traceback" not in short.output
    assert short.output.strip().splitlines() == [
        "Error: a dashboard password has at least 12 characters"
    ]

    made = invoke_json(redis_url, prefix, "dashboard", "keys", "add", "ci", "--role", "admin")
    assert re.fullmatch(r"rk_[0-9a-f]{16}_[\w-]{43}", made["key"])
    listed = invoke_json(redis_url, prefix, "dashboard", "keys", "list")
    assert listed == [{"id": made["id"], "name": "ci", "role": "admin"}]
    assert made["key"] not in invoke(redis_url, prefix, "dashboard", "keys", "list").output
    removed = invoke_json(redis_url, prefix, "dashboard", "keys", "remove", made["id"])
    assert removed == {"changed": True}
    assert invoke_json(redis_url, prefix, "dashboard", "users", "remove", "ops") == {
        "changed": True
    }


def http_address(process: Any) -> str:
    line = process.wait_for("HTTP on ")
    found = re.search(r"HTTP on (https?://[\d.]+:\d+)", line)
    assert found is not None, line
    return found.group(1)


def get(url: str, context: ssl.SSLContext | None = None, **headers: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize("redis_url", ["standalone"], indirect=True)
def test_node_run_serves_the_api_over_tls(redis_url: str, prefix: str, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    assert add_user(redis_url, prefix, "root", "--role", "admin").exit_code == 0
    key = invoke_json(redis_url, prefix, "dashboard", "keys", "add", "ci")["key"]
    with router_process(
        "node",
        "run",
        "--redis",
        redis_url,
        "--prefix",
        prefix,
        "--node-id",
        "web-1",
        "--mqtt",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--http-tls-cert",
        str(pki.server_cert),
        "--http-tls-key",
        str(pki.server_key),
    ) as process:
        base = http_address(process)
        assert base.startswith("https://")
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.check_hostname = False
        assert get(base + "/healthz", context) == (200, b"ok\n")
        status, body = get(base + "/api/v1/nodes", context)
        assert status == 401 and json.loads(body)["error"] == "LoginRequiredError"
        status, body = get(base + "/api/v1/nodes", context, Authorization=f"Bearer {key}")
        assert status == 200 and json.loads(body)["items"][0]["node_id"] == "web-1"
        status, page = get(base + "/", context)
        assert status == 200 and b"<html" in page.lower()


def test_node_run_refuses_http_tls_without_a_key(redis_url: str, prefix: str) -> None:
    result = invoke(
        redis_url, prefix, "node", "run", "--http", "127.0.0.1:0", "--http-tls-cert", __file__
    )
    assert result.exit_code != 0 and "--http-tls-key" in result.output
    assert "Traceback" not in result.output
