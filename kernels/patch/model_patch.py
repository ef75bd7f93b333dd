"""``kernelfleet.patch(model, profile=None)``: route an mlx-lm model's norms, RoPE, SwiGLU, MoE
routing and quantized linear layers through the catalog kernels this chip's profile picked, and
``kernelfleet.unpatch(model)``.

Walks the model as ``zmlx.patch`` does and matches the patterns of
:mod:`kernelfleet.kernels.patch.model_patterns`, :mod:`kernelfleet.kernels.patch.model_quant`,
:mod:`kernelfleet.kernels.patch.model_layer` and :mod:`kernelfleet.kernels.patch.model_moe_layer`. For each
match the profile decides, per kernel and model dimension (e.g. rmsnorm ``rows x 4096`` in bfloat16,
any token count):

- some tuned shape runs a custom config (measured, or predicted at or above ``min_confidence``; and,
  where the entry says by how much, faster than the built-in beyond the noise and by at least the
  host time a patched call adds, per kernel unless ``min_gain_us`` says:
  :mod:`kernelfleet.kernels.patch.profile_view`):
  the module is patched. A call whose exact shape has a custom config for one of its kernels runs
  the kernels (the profile's configs, the catalog's built-in for a kernel without one); any other
  call runs the module's own code (:func:`kernelfleet.kernels.patch.model_patterns.wrap`);
- every tuned shape is the built-in ("the built-in wins"), or none is tuned and no prediction is
  confident: the module is kept as it was.

A patched module keeps its parameters; only its class (or, for mlx-lm's shared ``SwiGLU`` activation,
one attribute of its ``SwitchGLU``) changes, and :func:`unpatch` restores it. On a backend without
custom kernels (CPU) the kernel path runs the catalog's built-ins.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..common import dtype_name
from . import runtime
from .model_layer import quantized_decoder_layer
from .model_moe_layer import quantized_moe_decoder_layer
from .model_patterns import PATTERNS, KernelSwiGLU, Router, Site, wrap
from .model_quant import BLOCKS
from .model_quant import PATTERNS as QUANTIZED_PATTERNS
from .profile_view import DEFAULT_MIN_CONFIDENCE, ProfileView, load

# blocks first: a block takes over the modules it holds (a module takes the first pattern that matches it)
QUANTIZED_BLOCKS = (quantized_decoder_layer, quantized_moe_decoder_layer, *BLOCKS)

ATTR = "_kernelfleet_patch"


@dataclass
class ModuleReport:
    path: str
    kind: str
    label: str
    patched: bool
    reason: str
    router: Router | None = None

    @property
    def calls(self) -> dict[str, int]:
        """Since patching: kernel runs with a profile config (``custom``; on CPU these execute as the
        built-in) or as the catalog's built-in (``builtin``), and calls that ran the module's own code
        (``module``: the profile picks nothing custom at that call's shapes)."""
        r = self.router
        return {"custom": r.custom, "builtin": r.builtin, "module": r.module} if r else {}


@dataclass
class PatchReport:
    modules: list[ModuleReport]
    profile: str
    backend: str
    dtype: str
    runtime_settings: str | None = None  # the chip's pulled MLX runtime settings for this model, if any
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def patched(self) -> list[ModuleReport]:
        return [m for m in self.modules if m.patched]

    @property
    def kept(self) -> list[ModuleReport]:
        return [m for m in self.modules if not m.patched]

    def summary(self) -> list[str]:
        """One line per (decision, kind, shape family, reason), with how many modules share it."""
        groups: dict[tuple[bool, str, str, str], list[str]] = {}
        for m in self.modules:
            groups.setdefault((m.patched, m.kind, m.label, m.reason), []).append(m.path)
        lines = []
        for (patched, kind, label, reason), paths in groups.items():
            where = paths[0] if len(paths) == 1 else f"{len(paths)} modules, e.g. {paths[0]}"
            verdict = "patched" if patched else "kept"
            lines.append(f"{verdict:7}  {kind} ({label}, {self.dtype}) x{len(paths)}: {reason} [{where}]")
        return lines

    def __str__(self) -> str:
        head = (f"kernelfleet.patch: {len(self.patched)} modules patched, {len(self.kept)} kept "
                f"(profile: {self.profile}; backend: {self.backend})")
        if self.backend == "cpu":
            head += "\n  (no custom kernels on CPU: where the profile picks one, the catalog's built-in runs)"
        tail = [f"  {self.runtime_settings}"] if self.runtime_settings else []
        return "\n".join([head, *("  " + line for line in self.summary()), *tail])


def _decide(site: Site, view: ProfileView, dtype: str) -> tuple[bool, str]:
    if site.refusal is not None:
        return False, site.refusal
    parts, any_custom, any_tuned = [], False, False
    for kernel, member in site.families.items():
        custom, builtin = view.family(kernel, dtype, member, site.describe, site.fused)
        any_custom |= bool(custom)
        any_tuned |= bool(custom or builtin)
        if custom:
            parts.append(f"{kernel}: custom at {', '.join(custom)}"
                         + (f"; built-in at {', '.join(builtin)}" if builtin else ""))
        elif builtin:
            parts.append(f"{kernel}: the built-in at every tuned shape ({', '.join(builtin)})")
        else:
            parts.append(f"{kernel}: untuned and no confident prediction")
    if any_custom:
        return True, "profile: " + "; ".join(parts)
    return False, ("profile: " if any_tuned else "") + "; ".join(parts)


def _model_dtype(model: nn.Module) -> str:
    for _, m in model.named_modules():
        if isinstance(m, (nn.RMSNorm, nn.LayerNorm)) and "weight" in m \
                and m.weight.dtype in (mx.float32, mx.float16, mx.bfloat16):
            return dtype_name(m.weight.dtype)
    return "float32"


def _swap_class(module: nn.Module, site: Site, router: Router) -> Callable[[], None]:
    original = type(module)
    call = wrap(site, router, original.__call__)
    module.__class__ = type(original.__name__, (original,), {"__call__": call, "_kf_original": original})

    def undo() -> None:
        module.__class__ = original
    return undo


def _replace_child(parent: nn.Module, name: str, site: Site, router: Router) -> Callable[[], None]:
    original = getattr(parent, name)
    setattr(parent, name, KernelSwiGLU(wrap(site, router, type(original).__call__), original))

    def undo() -> None:
        setattr(parent, name, original)
    return undo


def patch(model: nn.Module, profile: str | Path | dict[str, Any] | None = None, *,
          min_confidence: float = DEFAULT_MIN_CONFIDENCE, min_gain_us: float | None = None,
          custom_kernels: bool = True) -> PatchReport:
    """Patch ``model`` in place with this chip's profile (``profile=None``: the one ``kernelfleet pull``
    stored; or a profile file's path, or a profile body). Returns what was patched and kept, and why
    (also kept on the model for :func:`unpatch`). A custom config is used only where the profile says
    it saves at least ``min_gain_us`` a call over the built-in (None: each kernel's measured host cost
    of a patched call, :meth:`~kernelfleet.kernels.patch.profile_view.ProfileView.min_gain`; 0: wherever it
    is faster beyond the noise). ``custom_kernels=False`` routes the same calls through the catalog's
    built-ins only (to count calls or check numerics)."""
    if getattr(model, ATTR, None) is not None:
        raise ValueError("this model is already patched by kernelfleet; "
                         "call kernelfleet.unpatch(model) first")
    target = runtime.target()
    view = load(profile, target.chip, min_confidence, min_gain_us)
    gpu = custom_kernels and runtime.gpu_backend() is not None
    dtype = _model_dtype(model)
    report = PatchReport([], view.source, target.backend, dtype)
    consumed: set[int] = set()
    shared: dict[Any, Any] = {}  # compiled graphs shared by the patched modules
    sites: list[tuple[str, nn.Module, Site]] = []
    for path, module in model.named_modules():
        for pattern in (*QUANTIZED_BLOCKS, *PATTERNS, *QUANTIZED_PATTERNS):
            site = pattern(module)
            if site is not None:
                sites.append((path, module, site))
                break
    # blocks before their children: named_modules lists children first, so order by path depth
    sites.sort(key=lambda t: t[0].count("."))
    for path, module, site in sites:
        if id(module) in consumed:
            continue
        patched, reason = _decide(site, view, dtype)
        router = Router(view, gpu, shared=shared) if patched else None
        report.modules.append(ModuleReport(path or "<model>", site.kind, site.label, patched, reason, router))
        if router is None:
            continue
        if site.prepare is not None:
            site.prepare()
        if site.replace_child:
            report._undo.append(_replace_child(module, site.replace_child, site, router))
        else:
            report._undo.append(_swap_class(module, site, router))
        for child in site.consumes:  # a name, or a dotted path below the module
            owner = module
            for name in child.split("."):
                owner = getattr(owner, name)
            consumed.add(id(owner))
    report.modules.sort(key=lambda m: m.path)
    report.runtime_settings = runtime_settings_line(model, target.chip)
    setattr(model, ATTR, report)
    return report


def runtime_settings_line(model: nn.Module, chip: str) -> str | None:
    """What the chip's pulled runtime-settings file (``kernelfleet pull``) chose for this model's
    shape, and whether this process runs with it. MLX is imported by now and reads its settings once,
    so the patch sets nothing: it names what to export before Python starts."""
    from kernelfleet import runtime_settings_file as settings_file

    path = settings_file.installed_path(chip)
    args = getattr(model, "args", None)
    if not path.exists() or args is None:
        return None
    try:
        body = settings_file.read(path)
        key = settings_file.shape_key(vars(args))
    except (settings_file.SettingsFileError, KeyError, TypeError):
        return None
    entries = settings_file.select(body, key)
    if not entries:
        return None
    deciding = [e for e in entries if e.get("settings")]
    if not deciding:
        return f"runtime settings ({path.name}): MLX's defaults, for {key} at every measured workload"
    chosen = list(dict.fromkeys((k, v) for e in deciding for k, v in e["settings"].items()))
    missing = [(k, v) for k, v in chosen if os.environ.get(k) != v]
    why = ", ".join(f"{e['workload']} {e.get('gain', 1.0):.2f}x" for e in deciding)
    if not missing:
        return f"runtime settings ({path.name}): {_env_line(chosen)} in effect ({why})"
    return (f"runtime settings ({path.name}) chose {_env_line(chosen)} for {key} ({why}); this process "
            f"runs without {_env_line(missing)}: MLX reads them once, at start-up, so export them before "
            f"Python starts, or call kernelfleet.apply_settings before importing mlx")


def _env_line(pairs: list[tuple[str, str]]) -> str:
    return " ".join(f"{k}={v}" for k, v in pairs)


def unpatch(model: nn.Module) -> nn.Module:
    """Restore every module :func:`patch` changed; a model that is not patched is returned as it is."""
    report: PatchReport | None = getattr(model, ATTR, None)
    if report is None:
        return model
    for undo in reversed(report._undo):
        undo()
    report._undo.clear()
    object.__delattr__(model, ATTR)
    return model
