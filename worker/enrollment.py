"""Worker start-up: is the URL a KernelFleet coordinator, and who is this worker?

The first run trades ``--enroll-token`` for the worker's own token and stores it (mode 0600) in the
state directory; later runs reuse it. Every way this can go wrong is an :class:`AgentError` with a
message a person can act on and the CLI's exit code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kernelfleet.worker.client import (
    CoordinatorClient,
    CoordinatorError,
    LeaseConflict,
    NotACoordinator,
    Rejected,
    Unauthorized,
    Unreachable,
)
from kernelfleet.worker.state import Credentials, WorkerState

logger = logging.getLogger(__name__)


class AgentError(Exception):
    """The agent cannot go on; the message says why and what to do. ``exit_code`` for the CLI."""

    exit_code = 1


class CannotConnect(AgentError):
    exit_code = 3


class NotEnrolled(AgentError):
    exit_code = 3


class EnrollmentRefused(AgentError):
    exit_code = 4


class WorkerRevoked(AgentError):
    exit_code = 4


def machine_info(name: str | None) -> dict[str, Any]:
    """What the coordinator records about this machine at enrollment (chip, backend, environment)."""
    import socket

    from kernelfleet.chips import detect_chip

    chip = detect_chip()
    return {"name": name or socket.gethostname(), "chip": chip.name, "backend": chip.backend,
            "gpu_cores": chip.gpu_cores, "memory_bytes": chip.memory_bytes, "os": chip.os,
            "mlx_version": chip.mlx_version, "driver": chip.driver}


def connect(client: CoordinatorClient, url: str, wait_seconds: float, stop: threading.Event) -> None:
    """Check that ``url`` is a KernelFleet coordinator, waiting up to ``wait_seconds`` for one to start."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            client.health()
            return
        except NotACoordinator as e:
            raise CannotConnect(str(e)) from e
        except Unreachable as e:
            if time.monotonic() >= deadline or stop.is_set():
                raise CannotConnect(str(e)) from e
            stop.wait(0.5)


def authenticate(client: CoordinatorClient, state: WorkerState, url: str, enroll_token: str | None,
                 describe: Callable[[], dict[str, Any]]) -> int | str | None:
    """Use the stored worker token, or enroll with ``enroll_token`` and store the new one (0600).

    Sets ``client.token`` and returns the worker id. A stored token the coordinator refuses is
    replaced when an enrollment token is given, else that is :class:`WorkerRevoked`.
    """
    creds = state.load_credentials()
    if creds is not None:
        client.token = creds.token
        try:
            me = client.me()
            worker_id = me.get("id", me.get("worker_id", creds.worker_id))
            logger.info("using the stored worker token (worker %s) from %s", worker_id, state.token_path)
            return worker_id
        except Unauthorized as e:
            if not enroll_token:
                raise WorkerRevoked(
                    f"the coordinator refused this worker's stored token ({e.detail}). The worker was "
                    "revoked or the coordinator's database was replaced; enroll again with --enroll-token "
                    "(from `kernelfleet admin enroll-token`).") from e
            logger.warning("the stored worker token was refused (%s); enrolling again", e.detail)
        except Unreachable as e:
            raise CannotConnect(str(e)) from e
        except CoordinatorError as e:
            raise CannotConnect(f"cannot check this worker's identity: {e}") from e
    if not enroll_token:
        raise NotEnrolled(f"this worker is not enrolled yet (no token in {state.root}): pass --enroll-token "
                          "(an admin mints one with `kernelfleet admin enroll-token`).")
    info = describe()
    try:
        enrollment = client.enroll(enroll_token, info)
    except (Unauthorized, LeaseConflict) as e:
        raise EnrollmentRefused(f"the enrollment token was refused: {e.detail}") from e
    except Rejected as e:
        raise EnrollmentRefused(f"enrollment was refused: {e.detail}") from e
    except Unreachable as e:
        raise CannotConnect(str(e)) from e
    client.token = enrollment.token
    state.save_credentials(Credentials(token=enrollment.token, worker_id=enrollment.worker_id,
                                       coordinator=url))
    logger.info("enrolled as worker %s (%s, %s on %s); token stored in %s", enrollment.worker_id,
                info["name"], info["chip"], info["backend"], state.token_path)
    return enrollment.worker_id
