"""Add a worker: the exact commands that install KernelFleet on a new machine and enroll it, for macOS
(Metal) and Linux (CUDA), with this coordinator's public URL and a fresh enrollment token.

The install source is the coordinator's own wheel (:mod:`kernelfleet.service.wheel`, served at
``/downloads/<wheel>``), so no package-index release is needed: ``uv tool install`` or ``pipx
install`` of that URL, or a virtualenv and ``pip install``. The same instructions serve the dashboard's
Add a worker page, ``POST /api/v1/workers/add`` and ``kernelfleet admin add-worker``.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.enrollment import mint_enrollment_token
from kernelfleet.service.settings import Settings
from kernelfleet.service.wheel import WheelUnavailable, wheel_filename

__all__ = ["Instructions", "WheelUnavailable", "instructions", "mint", "notes"]

PYTHON = "3.12"  # what uv installs for the tool (the package needs 3.11+; macOS ships 3.9)
VENV = "~/.kernelfleet"


@dataclass(frozen=True)
class Step:
    what: str
    command: str


@dataclass(frozen=True)
class Platform:
    key: str
    title: str
    steps: list[Step]
    alternatives: list[Step] = field(default_factory=list)


@dataclass(frozen=True)
class Instructions:
    public_url: str
    wheel_url: str
    token: str | None  # None: commands show TOKEN (the page before sign-in)
    expires_at: datetime | None
    uses: int
    platforms: list[Platform]
    notes: list[str]


def wheel_url(settings: Settings) -> str:
    return f"{settings.resolved_public_url}/downloads/{wheel_filename()}"


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def notes(settings: Settings) -> list[str]:
    """What would stop another machine from following the commands."""
    url = settings.resolved_public_url
    out = []
    if _is_loopback(url):
        out.append(
            f"This coordinator's public URL is {url}: other machines cannot reach it. Serve on the "
            f"network and say where: `make run HOST=0.0.0.0 PUBLIC_URL=http://<this machine's "
            f"address>:{settings.port}` (or `kernelfleet serve --host 0.0.0.0 --public-url ...`, or "
            f"KERNELFLEET_PUBLIC_URL), then open this page again.")
    elif url.startswith("http://"):
        out.append("Tokens cross the network in clear over http://: put the coordinator behind a TLS "
                   "proxy (README: Run a fleet) and set KERNELFLEET_PUBLIC_URL to its https:// address.")
    return out


def instructions(settings: Settings, token: str | None, expires_at: datetime | None = None,
                 uses: int = 1) -> Instructions:
    public = settings.resolved_public_url
    wheel = wheel_url(settings)
    enroll = shlex.quote(token) if token else "TOKEN"
    run = f"kernelfleet worker --coordinator {shlex.quote(public)} --enroll-token {enroll}"
    cuda = shlex.quote(f"kernelfleet[cuda] @ {wheel}")
    plain = shlex.quote(wheel)
    mac = Platform(
        "macos", "macOS (Apple silicon, Metal)",
        [Step("install (uv: https://docs.astral.sh/uv/)", f"uv tool install --python {PYTHON} {plain}"),
         Step("enroll and start tuning (the token is used once; the worker keeps its own)", run)],
        [Step("or with pipx (Python 3.11+)", f"pipx install {plain}"),
         Step("or in a virtualenv", f"python3 -m venv {VENV} && {VENV}/bin/pip install {plain} && "
                                    f"{VENV}/bin/{run}")])
    gpus = "--gpus all" if uses > 1 else ""
    linux = Platform(
        "linux-cuda", "Linux (NVIDIA GPU, CUDA)",
        [Step("install (uv: https://docs.astral.sh/uv/)", f"uv tool install --python {PYTHON} {cuda}"),
         Step(f"enroll and start one agent per GPU ({uses} GPUs)" if uses > 1 else
              "enroll and start tuning (several GPUs: one agent each, see below)",
              f"{run} {gpus}".strip())],
        [Step("or with pipx (Python 3.11+)", f"pipx install {cuda}"),
         Step("or in a virtualenv", f"python3 -m venv {VENV} && {VENV}/bin/pip install {cuda} && "
                                    f"{VENV}/bin/{run} {gpus}".strip())])
    more = [] if uses > 1 else [
        "A host with several GPUs runs one agent per GPU: `kernelfleet admin add-worker --gpus N` (or this "
        "page with ?gpus=N) mints a token for N workers, then `kernelfleet worker ... --gpus all` starts "
        "them (each with CUDA_VISIBLE_DEVICES set to its GPU, state in <state dir>/gpu<i>)."]
    return Instructions(public, wheel, token, expires_at, uses, [mac, linux], [*notes(settings), *more])


def mint(factory: sessionmaker[Session], settings: Settings, gpus: int = 1,
         ttl_seconds: float | None = None) -> Instructions:
    """Instructions with a fresh enrollment token for ``gpus`` workers."""
    wheel_filename()  # WheelUnavailable before a token is minted for nothing
    with factory() as session:
        token, expires_at = mint_enrollment_token(
            session, ttl_seconds or settings.enrollment_token_ttl_seconds, gpus)
    return instructions(settings, token, expires_at, gpus)
