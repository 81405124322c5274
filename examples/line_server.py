"""A small TCP line server that uses the router as its pub/sub backend.

Each TCP connection is one client. It sends lines::

    SUB <filter>             subscribe (MQTT filter, wildcards allowed)
    UNSUB <filter>           unsubscribe
    PUB <topic> <payload>    publish (payload: the rest of the line)

and receives ``MSG <topic> <payload>`` for every message that matches, from any client
of any server of the cluster, plus ``OK`` / ``ERR <reason>`` answers. Run two of them
against the same Redis and clients of one see what clients of the other publish::

    python examples/line_server.py --port 7001 --node-id east
    python examples/line_server.py --port 7002 --node-id west
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

import router

_connections = itertools.count(1)


async def pump(node: router.RouterNode, client_id: str, writer: asyncio.StreamWriter) -> None:
    """Write every delivery of ``client_id`` to its connection."""
    async for message in node.messages(client_id):
        writer.write(f"MSG {message.topic} {message.payload.decode(errors='replace')}\n".encode())
        await writer.drain()


async def handle(
    node: router.RouterNode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Serve one connection until it closes."""
    client_id = f"{node.node_id}-conn-{next(_connections)}"
    await node.connect(client_id)
    delivering = asyncio.create_task(pump(node, client_id, writer))
    try:
        while line := (await reader.readline()).decode().strip():
            command, _, rest = line.partition(" ")
            try:
                if command == "SUB":
                    await node.subscribe(client_id, rest)
                elif command == "UNSUB":
                    await node.unsubscribe(client_id, rest)
                elif command == "PUB":
                    topic, _, payload = rest.partition(" ")
                    await node.publish(topic, payload.encode(), publisher=client_id)
                else:
                    raise ValueError(f"unknown command {command!r}")
                writer.write(b"OK\n")
            except (router.RouterError, ValueError) as exc:
                writer.write(f"ERR {exc}\n".encode())
            await writer.drain()
    finally:
        await node.disconnect(client_id)
        delivering.cancel()
        writer.close()


async def serve(node: router.RouterNode, host: str, port: int) -> asyncio.Server:
    """Start listening; the caller owns the returned server."""
    return await asyncio.start_server(lambda r, w: handle(node, r, w), host, port)


async def main() -> None:
    parser = argparse.ArgumentParser(description="a TCP line pub/sub server")
    parser.add_argument("--redis", default=None, help="Redis URL (default $ROUTER_REDIS_URL)")
    parser.add_argument("--node-id", default=None)
    parser.add_argument("--port", type=int, default=7001)
    args = parser.parse_args()
    async with router.connect(args.redis, node_id=args.node_id) as node:
        server = await serve(node, "127.0.0.1", args.port)
        async with server:
            await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
