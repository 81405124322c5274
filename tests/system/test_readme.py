"""The README's embedding example runs as written (against the test Redis)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def embedding_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Embedding a node") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_embedding_example_runs(redis_standalone_url: str) -> None:
    code = embedding_example().replace("redis://127.0.0.1:6379/0", redis_standalone_url)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert output.getvalue().startswith("sensors/kitchen/temperature b'21.5' 1 False ")
