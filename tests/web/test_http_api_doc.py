"""docs/http-api.md: its embedding example runs as written (against the test Redis, on
free ports), and every endpoint its table names is served."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from router.web.listener import build_app
from tests.support.nodes import StartNode

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"


def test_the_embedding_example_runs(redis_standalone_url: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Embedding") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    code = (
        match.group(1)
        .replace("redis://127.0.0.1:6379/0", redis_standalone_url)
        .replace("127.0.0.1:1883", "127.0.0.1:0")
        .replace("127.0.0.1:8080", "127.0.0.1:0")
    )
    namespace: dict[str, object] = {"__name__": "doc"}
    exec(compile(code, str(DOC), "exec"), namespace)
    asyncio.run(namespace["main"]())  # type: ignore[operator]


@pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)
async def test_every_endpoint_in_the_table_is_served(start_node: StartNode) -> None:
    text = DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(GET|POST|PUT|DELETE) (/api/v1/[^`?]*)", text, re.M))
    app = build_app(await start_node("doc"))
    served = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    assert len(documented) > 20
    assert documented <= served, documented - served
