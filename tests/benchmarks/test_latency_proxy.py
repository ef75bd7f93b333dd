"""benchmarks/latency_proxy.py (``coordinator_load.py --db-latency``): bytes pass through intact and in
order, and each round trip takes at least the added milliseconds (a lower bound the proxy guarantees,
not a timing target)."""

from __future__ import annotations

import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from . import BENCHMARKS

MS = 40.0


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)


@pytest.fixture
def proxied() -> Iterator[int]:
    """The port of a latency proxy in front of an echo server."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proxy = subprocess.Popen([sys.executable, str(BENCHMARKS / "latency_proxy.py"), "--port", str(port),
                              "--to", f"127.0.0.1:{server.server_address[1]}", "--ms", str(MS)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None and proxy.stdout.readline() == f"listening on {port}\n"
        yield port
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        server.shutdown()


def receive(conn: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        assert chunk, "the proxy closed the connection"
        got += chunk
    return got


def test_bytes_pass_intact_and_each_round_trip_waits(proxied: int) -> None:
    with socket.create_connection(("127.0.0.1", proxied)) as conn:
        for _ in range(3):
            t0 = time.monotonic()
            conn.sendall(b"ping")
            assert receive(conn, 4) == b"ping"
            assert time.monotonic() - t0 >= MS / 1e3
        payload = bytes(range(256)) * 4096  # 1 MiB, many chunks, in order
        sender = threading.Thread(target=conn.sendall, args=(payload,))
        sender.start()
        assert receive(conn, len(payload)) == payload
        sender.join()
