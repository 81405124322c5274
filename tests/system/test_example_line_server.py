"""The example server of docs/embedding.md: two line servers (two nodes) on one Redis."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

import router
from router.state.keys import Keys
from tests.support.waiting import eventually

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "line_server.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("line_server", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def ask(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, line: str) -> str:
    writer.write(line.encode() + b"\n")
    await writer.drain()
    return (await reader.readline()).decode().strip()


async def test_clients_of_two_servers_talk(redis_standalone_url: str, keys: Keys) -> None:
    example = load_example()
    async with (
        router.connect(redis_standalone_url, node_id="east", prefix=keys.prefix) as east,
        router.connect(redis_standalone_url, node_id="west", prefix=keys.prefix) as west,
    ):
        servers = [
            await example.serve(east, "127.0.0.1", 0),
            await example.serve(west, "127.0.0.1", 0),
        ]
        ports = [s.sockets[0].getsockname()[1] for s in servers]
        try:
            sub_reader, sub_writer = await asyncio.open_connection("127.0.0.1", ports[0])
            pub_reader, pub_writer = await asyncio.open_connection("127.0.0.1", ports[1])
            assert await ask(sub_writer, sub_reader, "SUB chat/+") == "OK"
            await eventually(
                lambda: "east" in west.mirror.match("chat/lobby").nodes, 5, "east routed on west"
            )
            assert await ask(pub_writer, pub_reader, "PUB chat/lobby hello there") == "OK"
            async with asyncio.timeout(5):
                assert (await sub_reader.readline()).decode() == "MSG chat/lobby hello there\n"
            assert (await ask(pub_writer, pub_reader, "PUB bad/+ x")).startswith("ERR ")
            for writer in (sub_writer, pub_writer):
                writer.close()
                await writer.wait_closed()
        finally:
            for server in servers:
                server.close()
                await server.wait_closed()
