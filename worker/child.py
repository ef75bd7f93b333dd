"""Starting kernelfleet's own modules as child processes: the command line (``python -P -m``) and a
worker agent's environment, shared by ``kernelfleet worker --gpus`` (:mod:`.gpus`), ``kernelfleet serve
--local-worker`` (:mod:`kernelfleet.service.local_worker`) and the runtime-settings search's fresh
processes (:mod:`.runtime_settings.sides`)."""

from __future__ import annotations

import os
import sys

ENROLL_TOKEN_ENV = "KERNELFLEET_ENROLL_TOKEN"  # what the agent's --enroll-token reads (agent_cli)


def module_command(module: str, *args: str) -> list[str]:
    """``python -P -m module args``: -P keeps the working directory off ``sys.path``, so a clone's
    ``kernelfleet/`` folder does not shadow the installed package."""
    return [sys.executable, "-P", "-m", module, *args]


def worker_command(*args: str) -> list[str]:
    """The worker agent with ``args``. It holds no secret: the enrollment token goes in the environment
    (:func:`worker_env`)."""
    return module_command("kernelfleet.worker.cli", "worker", *args)


def worker_env(enroll_token: str | None) -> dict[str, str]:
    """This process's environment for a worker agent: ``enroll_token`` where one is given, else none
    (not this process's own). In the environment, never on a command line, where ``ps`` shows it to
    other users."""
    env = {k: v for k, v in os.environ.items() if k != ENROLL_TOKEN_ENV}
    if enroll_token:
        env[ENROLL_TOKEN_ENV] = enroll_token
    return env
