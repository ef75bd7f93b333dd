"""A profile held in memory, as :func:`kernelfleet.patch` consults it: which config to run per
(kernel, shape, dtype), and what the profile says about a family of shapes (one model dimension).

An entry counts as custom only when its config is not the built-in, it is not a fallback, and, if it
is predicted, its confidence is at least ``min_confidence``. Anything else runs the built-in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import profile_file
from .spec import BUILTIN, Config, Shape, format_shape, parse_shape

DEFAULT_MIN_CONFIDENCE = 0.8  # the coordinator's KERNELFLEET_PREDICTION_MIN_CONFIDENCE default


@dataclass
class ProfileView:
    entries: dict[tuple[str, str, str], dict[str, Any]]
    source: str
    min_confidence: float = DEFAULT_MIN_CONFIDENCE
    _by_kernel: dict[tuple[str, str], list[tuple[Shape, dict[str, Any]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for (kernel, shape, dtype), e in self.entries.items():
            try:
                self._by_kernel.setdefault((kernel, dtype), []).append((parse_shape(shape), e))
            except ValueError:
                continue

    def usable(self, entry: dict[str, Any]) -> bool:
        config = entry.get("config") or BUILTIN
        if config == BUILTIN or entry.get("fallback"):
            return False
        return not entry.get("predicted") or float(entry.get("confidence") or 0.0) >= self.min_confidence

    def choice(self, kernel: str, shape: Shape, dtype: str) -> Config | None:
        """The custom config to run at this exact shape, or None (the built-in)."""
        entry = self.entries.get((kernel, format_shape(shape), dtype))
        return dict(entry["config"]) if entry is not None and self.usable(entry) else None

    def family(self, kernel: str, dtype: str, member: Callable[[Shape], bool]) -> tuple[list[str], list[str]]:
        """The tuned shapes of one family (e.g. rmsnorm rows x 4096): (custom ones, built-in ones)."""
        custom: list[str] = []
        builtin: list[str] = []
        for shape, e in self._by_kernel.get((kernel, dtype), []):
            if member(shape):
                (custom if self.usable(e) else builtin).append(format_shape(shape))
        return custom, builtin


def load(profile: str | Path | dict[str, Any] | None, chip: str,
         min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> ProfileView:
    """``None``: this chip's pulled profile (``kernelfleet pull``); a path: a profile file; a dict: a
    profile body. A missing profile is an empty view (everything keeps the built-in)."""
    if isinstance(profile, dict):
        body: dict[str, Any] | None = profile
        source = f"profile for {profile.get('chip', '?')} (given)"
    elif profile is None:
        body = profile_file.read(chip)
        source = f"{profile_file.profile_path(chip)}" if body else f"no pulled profile for {chip}"
    else:
        try:
            body = json.loads(Path(profile).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read the profile {profile}: {e}") from None
        source = str(profile)
    if body is not None and body.get("schema") != profile_file.SCHEMA:
        raise ValueError(f"{source}: not a {profile_file.SCHEMA} profile")
    entries = {(e["kernel"], e["shape"], e["dtype"]): e for e in (body or {}).get("entries", [])
               if isinstance(e, dict) and all(isinstance(e.get(k), str) for k in profile_file.KEY_FIELDS)}
    return ProfileView(entries, source, min_confidence)
