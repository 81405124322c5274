"""Every fenced code block of README.md and docs/*.md runs, so the docs follow the code.

The fence says what a block is, and a block runs unless its fence says why not:

* ```` ```python ````: run in a fresh interpreter; a block that defines ``async def main()``
  without running it is run with ``asyncio.run(main())``;
* ```` ```sh ````: run by ``bash -euo pipefail``, with ``router`` on the PATH; a ``router``
  command whose standard input is not a pipe reads one line of its own, so a password
  it asks for is answered;
* ```` ```text ````: not code (output, diagrams, file contents): never run;
* ```` ```python no-run ````, ```` ```sh no-run ````: code that cannot run in a test (a
  server that runs until stopped, docker, installs, benchmarks of minutes): never run.

Any other fence fails the test, so a new block runs by default.

The blocks of a document run in its order (a block may build on the one before, as a
reader would), each within ``BLOCK_TIMEOUT`` seconds, in a temporary directory, against
the cluster of the README: the session's standalone redis-server under a prefix of the
module's own (``ROUTER_REDIS_URL``, ``ROUTER_PREFIX``), node-1 (MQTT and HTTP) and
node-2 (MQTT), two ``router node run`` processes on free ports. The docs' addresses are
replaced: the URL ``redis://127.0.0.1:6379/0`` by the test Redis, ports 1883, 1884 and
8080 by node-1's MQTT, node-2's MQTT and node-1's HTTP port, except that a quoted
``"HOST:PORT"`` in a Python block is an address the block listens on itself: port 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest
from click.testing import CliRunner

from router.cli import app
from router.state.keys import Keys
from tests.support.cli import delete_namespace, router_process
from tests.support.servers import free_port
from tests.system.test_layering import LOWER, THIRD_PARTY

REPOSITORY = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]
DOC_URL = "redis://127.0.0.1:6379/0"
MQTT_1, MQTT_2, HTTP_1 = 1883, 1884, 8080  # node-1's MQTT, node-2's MQTT, node-1's HTTP
RUN = {"python", "sh"}
MARKED = {"text", "python no-run", "sh no-run"}
BLOCK_TIMEOUT = 30.0
PASSWORD = "correct horse battery staple"
# Each `router` call gets a password line of its own (one reader could not share a stream
# with the next: a buffered read takes more than its line).
ANSWER_PASSWORDS = (
    'router() { if [ -p /dev/stdin ]; then command router "$@";'
    ' else command router "$@" <<<"$DOC_PASSWORD"; fi; }\n'
)
# A text block is not a place for a command to hide in.
COMMANDS = re.compile(r"^(\$ |router |mosquitto_|curl |docker |pip |import |from \w+ import )")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence
    info: str  # what follows the fence: "python", "sh no-run", ...
    code: str

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(REPOSITORY)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split(" ", 1)[0]


def blocks_of(document: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (fences at the start of a line)."""
    found = []
    lines = document.read_text(encoding="utf-8").splitlines()
    opening: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        if opening is None and line.startswith("```"):
            opening, body = (number, line[3:].strip()), []
        elif opening is not None and line == "```":
            found.append(Block(document, opening[0], opening[1], "\n".join(body) + "\n"))
            opening = None
        elif opening is not None:
            body.append(line)
    assert opening is None, f"{document}:{opening[0]}: a fence that never closes"
    return found


BLOCKS = [block for document in DOCUMENTS for block in blocks_of(document)]


def runs(block: Block) -> bool:
    """Whether the test runs the block: its language is code, and no marker says no."""
    return block.language in RUN and "no-run" not in block.info.split()


# -- the cluster the blocks run against --------------------------------------------------


@dataclass(frozen=True)
class DocCluster:
    url: str
    prefix: str
    ports: dict[int, int]  # the docs' port -> the test's

    def env(self) -> dict[str, str]:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return {
            **os.environ,
            "PATH": path,
            "ROUTER_REDIS_URL": self.url,
            "ROUTER_PREFIX": self.prefix,
        }

    def adapt(self, block: Block) -> str:
        """The block's code with the docs' addresses replaced by the test's."""
        code = block.code.replace(DOC_URL, self.url)
        if block.language == "python":  # addresses it listens on itself
            code = re.sub(r"([\"'])(127\.0\.0\.1|0\.0\.0\.0|localhost):\d+\1", r"\1\2:0\1", code)
        for doc_port, port in self.ports.items():
            code = re.sub(rf"\b{doc_port}\b", str(port), code)
        if (
            block.language == "python"
            and re.search(r"^async def main\(", code, re.M)
            and "asyncio.run(main())" not in code
        ):
            code += "\nimport asyncio\n\nasyncio.run(main())\n"
        return code


@pytest.fixture(scope="module")
def cluster(redis_standalone_url: str) -> Iterator[DocCluster]:
    keys = Keys(prefix=f"doc{uuid4().hex[:12]}")
    doc = DocCluster(
        redis_standalone_url, keys.prefix, {port: free_port() for port in (MQTT_1, MQTT_2, HTTP_1)}
    )
    env = {"ROUTER_REDIS_URL": doc.url, "ROUTER_PREFIX": doc.prefix}
    mqtt_1, mqtt_2, http_1 = (f"127.0.0.1:{doc.ports[port]}" for port in (MQTT_1, MQTT_2, HTTP_1))
    try:
        with (
            router_process(
                *("node", "run", "--node-id", "node-1", "--mqtt", mqtt_1, "--http", http_1),
                env=env,
            ) as node_1,
            router_process(
                "node", "run", "--node-id", "node-2", "--mqtt", mqtt_2, env=env
            ) as node_2,
        ):
            node_1.wait_for("ready")
            node_2.wait_for("ready")
            yield doc
    finally:
        delete_namespace(redis_standalone_url, keys)


def run_block(block: Block, doc: DocCluster, workdir: Path) -> None:
    """Run one block; fails with its output unless it exits 0 within BLOCK_TIMEOUT."""
    code = doc.adapt(block)
    if block.language == "python":
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", ANSWER_PASSWORDS + code]
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env={**doc.env(), "DOC_PASSWORD": PASSWORD},
        text=True,
        start_new_session=True,  # its own process group: background jobs end with it
    )
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{block.name} did not end within {BLOCK_TIMEOUT} s:\n{output}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, f"{block.name} exited {process.returncode}:\n{output}"


# -- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "document",
    [document for document in DOCUMENTS if any(runs(b) for b in blocks_of(document))],
    ids=lambda document: str(document.relative_to(REPOSITORY)),
)
def test_the_blocks_of_a_document_run(document: Path, cluster: DocCluster, tmp_path: Path) -> None:
    for block in blocks_of(document):
        if runs(block):
            run_block(block, cluster, tmp_path)


def test_every_fence_says_what_its_block_is() -> None:
    unknown = [f"{b.name}: ```{b.info}" for b in BLOCKS if b.info not in RUN | MARKED]
    assert unknown == [], "a fence must be one of " + ", ".join(sorted(RUN | MARKED))


def test_the_blocks_not_run_are_exactly_those_marked() -> None:
    not_run = {block.name for block in BLOCKS if not runs(block)}
    marked = {block.name for block in BLOCKS if block.info in MARKED}
    assert not_run == marked
    assert len(BLOCKS) - len(not_run) >= 15  # the runner finds the blocks at all


def test_no_command_hides_in_a_text_block() -> None:
    hidden = [
        f"{block.name}: {line}"
        for block in BLOCKS
        if block.info == "text"
        for line in block.code.splitlines()
        if COMMANDS.match(line)
    ]
    assert hidden == []


def test_the_redis_acl_line_is_what_the_command_prints() -> None:
    [shown] = [
        block.code.strip()
        for block in BLOCKS
        if block.info == "text" and block.code.startswith("ACL SETUSER")
    ]
    result = CliRunner().invoke(app, ["redis-acl", "--prefix", "rt"])
    assert result.exit_code == 0, result.output
    assert shown == result.output.strip()


def test_the_acl_rules_shown_are_those_of_the_example_file() -> None:
    example = (REPOSITORY / "examples" / "acl.conf").read_text(encoding="utf-8").splitlines()
    [shown] = [
        block.code.splitlines()
        for block in BLOCKS
        if block.info == "text" and block.code.startswith(("allow ", "deny "))
    ]
    assert set(shown) <= set(example)


def test_the_import_tables_of_architecture_md_are_the_layering_tests() -> None:
    text = (REPOSITORY / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index("| room | may import from the package |") :].split("\n\n")[0]
    shown: dict[str, tuple[set[str], set[str]]] = {}
    for row in table.splitlines()[2:]:
        room, package, third = (cell.strip() for cell in row.strip("|").split("|"))
        names = {name.strip() for name in third.split(";")[0].split(",")} - {"none"}
        shown[room.split()[0].strip("`")] = ({n.strip() for n in package.split(",")}, names)
    enforced = {room: (LOWER[room] - {room}, THIRD_PARTY[room]) for room in LOWER}
    assert shown == enforced
