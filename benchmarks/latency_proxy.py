"""A TCP proxy that adds latency, so that a database on this host behaves as one a few milliseconds
away (``coordinator_load.py --db-latency``): each chunk read from either side is written to the other
half the added round trip later, in order. No bandwidth limit; each connection gets its own pair of
pumps.

    python benchmarks/latency_proxy.py --port 6543 --to 127.0.0.1:5432 --ms 5

prints ``listening on PORT`` once it accepts connections, and runs until it is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()

    sender = asyncio.create_task(forward())
    try:
        while chunk := await reader.read(1 << 16):
            queue.put_nowait((loop.time() + delay, chunk))
    except ConnectionError:
        pass
    finally:
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError):
            await sender
        writer.close()


async def serve(port: int, host: str, upstream_port: int, delay: float) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer, delay), pump(up_reader, writer, delay))

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    print(f"listening on {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    p.add_argument("--to", required=True, metavar="HOST:PORT", help="where to forward")
    p.add_argument("--ms", type=float, required=True, help="milliseconds added to each round trip")
    args = p.parse_args()
    host, _, port = args.to.rpartition(":")
    asyncio.run(serve(args.port, host, int(port), args.ms / 2e3))


if __name__ == "__main__":
    main()
