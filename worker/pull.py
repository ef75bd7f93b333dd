"""``kernelfleet pull``: fetch this chip's learned profile from the coordinator and install it as
KernelFleet's own profile file and as a merge into zmlx's autotune cache.

Nothing is written until the coordinator has answered with a valid profile, so an unreachable
coordinator, a chip without measured results or a bad answer leaves every existing file as it was.
A chip with no measured results is refused (the coordinator names the closest chips with data)
unless ``allow_predicted``; then predicted entries are written, marked as such. zmlx's cache
receives only measured entries and predicted ones at or above the profile's confidence threshold.
While the coordinator is still building a chip's first profile (202), pull waits for it. Both files
are replaced atomically. ``If-None-Match`` with the installed profile's ETag makes an unchanged profile a 304.
"""

from __future__ import annotations

import ipaddress
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from kernelfleet.kernels.patch import profile_file
from kernelfleet.local_state import stored_admin_token
from kernelfleet.worker import zmlx_cache
from kernelfleet.worker.coordinator_url import (
    BadCoordinatorUrl,
    answer_detail,
    coordinator_base,
    unreachable_message,
)

DEFAULT_COORDINATOR = "http://127.0.0.1:8600"


class PullError(Exception):
    """A pull that could not be done; the message says what to do."""


@dataclass(frozen=True)
class Target:
    chip: str
    family: str | None  # Apple silicon family ("M3"), None for other chips
    variant: str | None
    mlx_version: str  # the zmlx device key's MLX version


@dataclass
class PullResult:
    target: Target
    profile_path: str
    version: int
    etag: str
    entries: int
    predicted: int
    unchanged: bool
    zmlx: zmlx_cache.MergeResult | None
    zmlx_skipped: str | None
    fallbacks: dict[str, int] = field(default_factory=dict)  # why predicted entries are the built-in
    settings_path: str | None = None  # the chip's runtime-settings file, when the fleet has one
    settings_entries: int = 0

    @property
    def fallback(self) -> int:
        return sum(self.fallbacks.values())


def is_loopback(base: str) -> bool:
    """True when the coordinator URL names this machine (127.0.0.0/8, ::1, localhost)."""
    host = (urlsplit(base).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_mode_token() -> str | None:
    """The admin token a local-mode coordinator on this machine generated and keeps in its data
    directory (``kernelfleet serve`` on SQLite), if there is one; the same file `kernelfleet admin`
    finds."""
    return stored_admin_token()


def resolve_token(explicit: str | None, coordinator: str) -> str | None:
    """``--token``, else KERNELFLEET_TOKEN, else KERNELFLEET_ADMIN_TOKEN, else (for a coordinator on
    this machine only: it is that coordinator's token) local mode's stored admin token; None: pull
    without a token (a public dashboard)."""
    for token in (explicit, os.environ.get("KERNELFLEET_TOKEN"), os.environ.get("KERNELFLEET_ADMIN_TOKEN")):
        if token and token.strip():
            return token.strip()
    try:
        local = is_loopback(coordinator_base(coordinator))
    except BadCoordinatorUrl:
        return None
    return local_mode_token() if local else None


def resolve_target(chip: str = "auto", mlx_version: str | None = None) -> Target:
    """``auto``: this machine's chip (kernelfleet.chips.detect_chip); a name: that chip, its Apple family
    and variant parsed from the name. The MLX version defaults to the installed one."""
    if chip == "auto":
        from kernelfleet.chips import detect_chip

        info = detect_chip()
        return Target(info.name, info.family, info.variant, mlx_version or info.mlx_version)
    from kernelfleet.chips import parse_apple_chip

    name = chip.strip()
    if not name:
        raise PullError("--chip needs a chip name such as 'Apple M3 Max', or 'auto'")
    family: str | None = None
    variant: str | None = None
    if name.lower().startswith("apple"):
        name, family, variant = parse_apple_chip(name)
    if mlx_version is None:
        import mlx.core as mx

        mlx_version = str(getattr(mx, "__version__", "unknown"))
    return Target(name, family, variant, mlx_version)


def fetch_profile(
    coordinator: str,
    chip: str,
    mlx_version: str | None,
    token: str | None,
    etag: str | None,
    timeout: float = 30.0,
    *,
    allow_predicted: bool = False,
    wait: float = 60.0,
) -> dict[str, Any] | None:
    """The profile body, or None when the coordinator answers 304 (``etag`` is current). Waits up to
    ``wait`` seconds while the coordinator builds the chip's first profile (202 + Retry-After)."""
    try:
        base = coordinator_base(coordinator)
    except BadCoordinatorUrl as e:
        raise PullError(str(e)) from None
    url = base + "/api/v1/profiles/" + quote(chip, safe="")
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if etag:
        headers["If-None-Match"] = f'"{etag}"'
    params: dict[str, str] = {"mlx_version": mlx_version} if mlx_version else {}
    if allow_predicted:
        params["allow_predicted"] = "true"
    deadline = time.monotonic() + wait
    while True:
        try:
            r = httpx.get(url, params=params, headers=headers, timeout=timeout)
        except httpx.HTTPError as e:
            raise PullError(unreachable_message(base, e)) from e
        if r.status_code != 202:
            break
        if time.monotonic() >= deadline:
            raise PullError(f"the coordinator is still building the profile for {chip!r} after {wait:.0f} s; "
                            f"try again shortly")
        try:
            pause = float(r.headers.get("retry-after", "2"))
        except ValueError:
            pause = 2.0
        time.sleep(min(max(pause, 0.2), 10.0, max(deadline - time.monotonic(), 0.2)))
    if r.status_code == 304:
        return None
    if r.status_code != 200:
        detail = answer_detail(r)
        hint = (" (pass --token with a read token: `kernelfleet admin tokens create --scope read`; or set "
                "KERNELFLEET_TOKEN)") if r.status_code in (401, 403) else ""
        raise PullError(
            f"the coordinator refused the profile for {chip!r}: HTTP {r.status_code}: {detail}{hint}"
        )
    try:
        body = r.json()
    except ValueError as e:
        raise PullError(
            f"the coordinator at {coordinator} answered with something that is not JSON; "
            f"is that URL a KernelFleet coordinator?"
        ) from e
    if not isinstance(body, dict) or body.get("schema") != profile_file.SCHEMA:
        raise PullError(
            f"the coordinator at {coordinator} sent an unknown profile format "
            f"({body.get('schema') if isinstance(body, dict) else type(body).__name__})"
        )
    return body


def fetch_runtime_settings(coordinator: str, chip: str, mlx_version: str | None, token: str | None,
                           timeout: float = 30.0) -> dict[str, Any] | None:
    """The chip's runtime-settings file from the coordinator (``GET /runtime-settings/{chip}``), or
    None when it has none (404)."""
    from kernelfleet import runtime_settings_file as settings_file

    base = coordinator_base(coordinator)
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        r = httpx.get(base + "/api/v1/runtime-settings/" + quote(chip, safe=""), headers=headers,
                      params={"mlx_version": mlx_version} if mlx_version else {}, timeout=timeout)
    except httpx.HTTPError as e:
        raise PullError(unreachable_message(base, e)) from e
    if r.status_code == 404:
        return None
    try:
        body = r.json() if r.status_code == 200 else None
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("schema") != settings_file.SCHEMA or body.get("chip") != chip:
        raise PullError(f"the coordinator refused or garbled the runtime settings for {chip!r}: HTTP "
                        f"{r.status_code}: {r.text[:300]}")
    return body


def pull(
    coordinator: str = DEFAULT_COORDINATOR,
    chip: str = "auto",
    mlx_version: str | None = None,
    *,
    token: str | None = None,
    zmlx: bool = True,
    allow_predicted: bool = False,
    progress: Callable[[Iterable[dict[str, Any]]], Iterable[dict[str, Any]]] = lambda it: it,
) -> PullResult:
    target = resolve_target(chip, mlx_version)
    installed = profile_file.read(target.chip)
    same = installed is not None and installed.get("mlx_version") == mlx_version
    body = fetch_profile(
        coordinator,
        target.chip,
        mlx_version,
        token,
        str(installed.get("etag")) if same and installed else None,
        allow_predicted=allow_predicted,
    )
    unchanged = body is None
    if body is None:
        assert installed is not None
        body = installed
    if body.get("chip") != target.chip:
        raise PullError(f"the coordinator sent the profile of {body.get('chip')!r}, not {target.chip!r}")
    entries = body.get("entries", [])
    if not allow_predicted and not any(not e.get("predicted") for e in entries):
        raise PullError(f"the profile of {target.chip!r} has no measured entries; pass --allow-predicted "
                        f"to install predicted ones")
    settings = fetch_runtime_settings(coordinator, target.chip, mlx_version, token)
    try:
        path = profile_file.profile_path(target.chip) if unchanged else profile_file.write(body)
    except (OSError, profile_file.ProfileFileError) as e:
        raise PullError(f"cannot write the profile file: {e}") from e
    merged: zmlx_cache.MergeResult | None = None
    skipped: str | None = None
    if not zmlx:
        skipped = "--no-zmlx"
    elif target.family is None:
        skipped = f"zmlx keys devices by Apple-silicon family; {target.chip!r} is not an Apple chip"
    else:
        key = zmlx_cache.device_key(target.chip, target.mlx_version)
        family, variant = zmlx_cache.zmlx_family_variant(target.chip)
        meta = {
            "family": family,
            "variant": variant,
            "source": "kernelfleet",
            "chip": target.chip,
            "profile_version": body.get("version"),
            "profile_etag": body.get("etag"),
        }
        trusted = trusted_entries(body)
        try:
            merged = zmlx_cache.merge({**body, "entries": trusted}, key, meta, progress=progress)
        except (OSError, zmlx_cache.ZmlxCacheError) as e:
            raise PullError(
                f"profile installed at {path}, but the zmlx cache could not be written: {e}"
            ) from e
    settings_path = None
    if settings is not None:
        from kernelfleet import runtime_settings_file as settings_file

        settings_path = settings_file.installed_path(target.chip)
        try:
            settings_file.write(settings, settings_path)
        except OSError as e:
            raise PullError(f"profile installed at {path}, but the runtime settings could not be written: "
                            f"{e}") from e
    return PullResult(
        target=target,
        profile_path=str(path),
        version=int(body.get("version") or 0),
        etag=str(body.get("etag") or ""),
        entries=len(entries),
        predicted=sum(1 for e in entries if e.get("predicted")),
        unchanged=unchanged,
        zmlx=merged,
        zmlx_skipped=skipped,
        fallbacks=fallback_reasons(entries),
        settings_path=str(settings_path) if settings_path else None,
        settings_entries=len(settings["entries"]) if settings else 0,
    )


def fallback_reasons(entries: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many predicted entries fell back to the built-in, by reason (most first); the
    confidences of "confidence 0.50 is below 0.80" counted together as one reason."""
    below = re.compile(r"^confidence [\d.]+ is below ([\d.]+)$")
    counts = Counter(below.sub(r"confidence below \1", str(e["fallback"]))
                     for e in entries if e.get("predicted") and e.get("fallback"))
    return dict(counts.most_common())


def trusted_entries(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries a runtime may act on: measured ones, and predicted ones at or above the profile's
    confidence threshold that did not fall back to the built-in."""
    threshold = float(body.get("confidence_threshold") or 0.0)
    return [e for e in body.get("entries", []) if not e.get("predicted")
            or ("fallback" not in e and float(e.get("confidence") or 0.0) >= threshold)]
