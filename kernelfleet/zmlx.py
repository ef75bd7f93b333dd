"""``kernelfleet.zmlx.patch``: zmlx's model patching, pinned to a KernelFleet profile.

``zmlx.patch.patch(model)`` replaces mlx-lm modules with zmlx-backed ones that take one threadgroup
each (256 unless ``threadgroup="auto"``, which times 6 candidates in-process on the first call and
keeps nothing). :func:`patch` runs zmlx's patch at a fixed threadgroup, then sets every patched
module to what the profile measured (or predicted with confidence) on this chip for that module's
kernel, dimension and dtype at the token counts you name, so zmlx never times anything in-process:

- ``ZMLXRMSNorm`` / ``ZMLXLayerNorm`` (zmlx_rmsnorm / zmlx_layernorm at ``tokens x dims``): their
  ``_resolved_tg`` is set; where the profile says the MLX built-in is faster, the module is put back
  to ``nn.RMSNorm`` / ``nn.LayerNorm`` with the same weights;
- ``residual_norm`` blocks (zmlx_add_rmsnorm at ``tokens x hidden``): zmlx's own pattern is applied
  again with the profile's threadgroup (the pattern reads it from its config), or the block's own
  ``__call__`` is restored where the built-in is faster;
- ``swiglu_mlp`` / ``geglu_mlp`` (zmlx_swiglu / zmlx_geglu at ``tokens x intermediate``): zmlx's
  ``swiglu2``/``geglu2`` take no threadgroup, so only the choice between zmlx's kernel and MLX's
  ops is made (the block's own ``__call__`` is restored where the built-in is faster);
- ``softmax`` (zmlx_softmax; its width is the attention length, known only per call): the
  patched ``softmax`` looks the threadgroup up per call in a table built from the profile now.

Where the profile has no confident entry (measured, or predicted at or above its confidence
threshold) the module keeps zmlx's default, and the returned :class:`PatchReport` says so.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

DECODE: tuple[int, ...] = (1,)
ZMLX_DEFAULT_TG = 256


class PatchError(Exception):
    """The profile or the model could not be used; the message says what to do."""


@dataclass(frozen=True)
class Choice:
    config: dict[str, Any] | None  # {"tg": 128}, {"variant": "builtin"}, or None (no confident entry)
    basis: str  # "measured (3 runs, 2 workers) at 1x4096", "predicted (confidence 0.8) ...", or why none


@dataclass
class ModulePin:
    path: str
    pattern: str  # zmlx's pattern name
    kernel: str  # the catalog kernel the profile was asked about
    dim: int
    dtype: str
    applied: str  # "tg=128", "MLX built-in", "zmlx default (tg=256)", ...
    basis: str


@dataclass
class PatchReport:
    chip: str
    tokens: tuple[int, ...]
    pinned: list[ModulePin] = field(default_factory=list)
    kept_default: list[ModulePin] = field(default_factory=list)  # no confident entry: zmlx's default
    zmlx_patched: int = 0  # modules zmlx's patch replaced or wrapped

    def summary(self) -> str:
        lines = [f"kernelfleet.zmlx.patch for {self.chip} at tokens {list(self.tokens)}: "
                 f"{self.zmlx_patched} modules patched by zmlx, {len(self.pinned)} set from the profile, "
                 f"{len(self.kept_default)} kept zmlx's default"]
        groups: Counter[tuple[str, str, int, str, str, str, bool]] = Counter(
            (p.pattern, p.kernel, p.dim, p.dtype, p.applied, p.basis, default)
            for default, pins in ((False, self.pinned), (True, self.kept_default)) for p in pins)
        for (pattern, kernel, dim, dtype, applied, basis, default), n in groups.items():
            tag = "kept default" if default else "set"
            lines.append(f"  {n} x {pattern} ({kernel}, D={dim}, {dtype}): {tag} {applied}; {basis}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- profile


def load_profile(profile: dict[str, Any] | str | None) -> dict[str, Any]:
    """A profile body: given, the installed profile of a chip name, or this machine's chip (None)."""
    from kernelfleet.kernels.patch import profile_file

    if isinstance(profile, dict):
        body = profile
    else:
        chip = profile
        if chip is None:
            from kernelfleet.chips import detect_chip

            chip = detect_chip().name
        found = profile_file.read(chip)
        if found is None:
            raise PatchError(f"no KernelFleet profile is installed for {chip!r} "
                             f"(looked in {profile_file.profile_path(chip)}); run `kernelfleet pull` first")
        body = found
    if body.get("schema") != profile_file.SCHEMA or not isinstance(body.get("entries"), list):
        raise PatchError(f"not a KernelFleet profile (schema {body.get('schema')!r}, expected "
                         f"{profile_file.SCHEMA!r})")
    return body


def _basis(e: dict[str, Any]) -> str:
    if e.get("predicted"):
        return f"predicted (confidence {float(e.get('confidence') or 0):.2f}) at {e['shape']}"
    return f"measured ({e.get('runs', '?')} runs, {e.get('workers', '?')} workers) at {e['shape']}"


class Chooser:
    """Picks a config for (kernel, dim, dtype) at the user's token counts from the trusted entries."""

    def __init__(self, body: dict[str, Any], tokens: Sequence[int]) -> None:
        from kernelfleet.worker.pull import trusted_entries

        self.tokens = tuple(int(t) for t in tokens)
        self.entries = {(e["kernel"], e["shape"], e["dtype"]): e for e in trusted_entries(body)}

    def choose(self, kernel: str, dim: int, dtype: str, rows: Sequence[int] | None = None) -> Choice:
        found = [e for t in (rows or self.tokens) if (e := self.entries.get((kernel, f"{t}x{dim}", dtype)))]
        if not found:
            shapes = ", ".join(f"{t}x{dim}" for t in (rows or self.tokens))
            return Choice(None, f"no confident profile entry for {kernel} {shapes} {dtype}")
        votes = Counter(e["config_key"] for e in found)
        key = max(votes, key=lambda k: (votes[k], -[e["config_key"] for e in found].index(k)))
        picked = [e for e in found if e["config_key"] == key]
        basis = "; ".join(_basis(e) for e in picked)
        if len(votes) > 1:
            basis += f" (token counts disagree: {dict(votes)}; the most common is kept)"
        return Choice(dict(picked[0]["config"]), basis)

    def table(self, kernel: str, dtype: str) -> dict[tuple[int, int], int]:
        """(rows, D) -> tg for every confident custom entry of ``kernel`` at ``dtype``."""
        out: dict[tuple[int, int], int] = {}
        for (k, shape, d), e in self.entries.items():
            if k == kernel and d == dtype and "tg" in (e.get("config") or {}):
                rows, dim = (int(v) for v in shape.split("x"))
                out[(rows, dim)] = int(e["config"]["tg"])
        return out


# ----------------------------------------------------------------------------- model walk


def _children(module: Any) -> Iterator[tuple[str, Any, Any, str | int]]:
    """(path, child, container, key) for every module below ``module`` (lists included)."""
    import mlx.nn as nn

    def walk(m: Any, path: str) -> Iterator[tuple[str, Any, Any, str | int]]:
        for name, child in dict(m.children()).items():
            p = f"{path}.{name}" if path else name
            if isinstance(child, list):
                for i, item in enumerate(child):
                    if isinstance(item, nn.Module):
                        yield f"{p}[{i}]", item, child, i
                        yield from walk(item, f"{p}[{i}]")
            elif isinstance(child, nn.Module):
                yield p, child, m, name
                yield from walk(child, p)

    yield from walk(module, "")


def _put(container: Any, key: str | int, value: Any) -> None:
    if isinstance(key, int):
        container[key] = value
    else:
        setattr(container, key, value)


def _dtype(a: Any) -> str:
    from kernelfleet.kernels.common import dtype_name

    return dtype_name(a.dtype)


def _pattern_of(module: Any) -> str | None:
    """Which zmlx pattern wrapped this module's ``__call__`` (zmlx 0.10 defines one ``patched_call``
    per pattern class), or None."""
    if not hasattr(module, "_zmlx_original_call"):
        return None
    qual = getattr(type(module).__call__, "__qualname__", "")
    for cls, pattern in (("_ResidualNormPattern", "residual_norm"), ("_SwiGLUMLPPattern", "swiglu_mlp"),
                         ("_GeGLUMLPPattern", "geglu_mlp")):
        if qual.startswith(cls + "."):
            return pattern
    return None


def _unwrap_call(module: Any) -> None:
    """Undo a zmlx ``__call__`` wrap (zmlx subclasses the module's class once per wrap)."""
    module.__class__ = type(module).__bases__[0]
    del module._zmlx_original_call


def patch(model: Any, profile: dict[str, Any] | str | None = None, tokens: Sequence[int] = DECODE, *,
          patterns: list[str] | None = None, compute_dtype: str = "float32",
          verbose: bool = False) -> PatchReport:
    """Run ``zmlx.patch.patch(model, patterns=...)`` and set every patched module from ``profile``.

    ``profile``: a profile body, a chip name whose pulled profile is installed, or None for this
    machine's chip. ``tokens``: the token counts (rows) to choose for; decode (1) by default.
    ``patterns``: zmlx's pattern names (None: zmlx's default set). Returns what was set and what
    kept zmlx's default; the model is patched in place.
    """
    from kernelfleet.kernels.zmlx.family import default_elementwise_tg

    try:
        import mlx.nn as nn
        from zmlx.patch import get_pattern
        from zmlx.patch import patch as zmlx_patch
        from zmlx.patch._modules import ZMLXLayerNorm, ZMLXRMSNorm
        from zmlx.patch._types import PatchConfig
    except ImportError as e:
        raise PatchError("zmlx is not installed; install it with: pip install 'kernelfleet[zmlx]'") from e
    if not tokens or any(int(t) < 1 for t in tokens):
        raise PatchError(f"tokens must be positive token counts, got {list(tokens)}")
    body = load_profile(profile)
    chooser = Chooser(body, tokens)
    report = PatchReport(chip=str(body.get("chip")), tokens=chooser.tokens)
    zmlx_patch(model, patterns=patterns, threadgroup=ZMLX_DEFAULT_TG, compute_dtype=compute_dtype,
               verbose=verbose)
    result = getattr(model, "_zmlx_patch_result", None)
    report.zmlx_patched = int(getattr(result, "patched_count", 0))
    config = PatchConfig(compute_dtype=compute_dtype, threadgroup=ZMLX_DEFAULT_TG)

    def record(path: str, pattern: str, kernel: str, dim: int, dtype: str, choice: Choice, applied: str,
               held: bool | None = None) -> None:
        pin = ModulePin(path, pattern, kernel, dim, dtype, applied, choice.basis)
        if held is None:
            held = choice.config is not None
        (report.pinned if held else report.kept_default).append(pin)

    for path, module, container, key in list(_children(model)):
        if isinstance(module, ZMLXRMSNorm | ZMLXLayerNorm):
            is_rms = isinstance(module, ZMLXRMSNorm)
            kernel = "zmlx_rmsnorm" if is_rms else "zmlx_layernorm"
            norm = "rmsnorm" if is_rms else "layernorm"
            if not is_rms and not module.affine:
                record(path, norm, kernel, module.dims, "-",
                       Choice(None, "zmlx's layer_norm_no_weight is not in the catalog"),
                       f"zmlx default (tg={module.threadgroup})")
                continue
            dtype = _dtype(module.weight)
            choice = chooser.choose(kernel, int(module.dims), dtype)
            if choice.config is None:
                applied = f"zmlx default (tg={module.threadgroup})"
            elif "tg" in choice.config:
                module._auto, module._resolved_tg = False, int(choice.config["tg"])
                applied = f"tg={module._resolved_tg}"
            else:
                original = nn.RMSNorm(module.dims, eps=module.eps) if is_rms else nn.LayerNorm(module.dims,
                                                                                                eps=module.eps)
                original.weight = module.weight
                if not is_rms:
                    original.bias = module.bias
                _put(container, key, original)
                applied = "MLX built-in"
            record(path, norm, kernel, int(module.dims), dtype, choice, applied)
        elif (pattern := _pattern_of(module)) == "residual_norm":
            from zmlx.patch.patterns.residual_norm import _POST_NORM_NAMES, _first_match

            post: Any = _first_match(module, _POST_NORM_NAMES)[1]
            dim, dtype = int(post.weight.shape[0]), _dtype(post.weight)
            choice = chooser.choose("zmlx_add_rmsnorm", dim, dtype)
            applied = f"zmlx default (tg={ZMLX_DEFAULT_TG})"
            if choice.config is not None:
                _unwrap_call(module)
                if "tg" in choice.config:
                    tg = int(choice.config["tg"])
                    get_pattern("residual_norm").apply(module, dataclasses.replace(config, threadgroup=tg))
                    applied = f"tg={tg}"
                else:
                    applied = "MLX built-in (the block's own __call__)"
            record(path, pattern, "zmlx_add_rmsnorm", dim, dtype, choice, applied)
        elif pattern in ("swiglu_mlp", "geglu_mlp"):
            kernel = "zmlx_swiglu" if pattern == "swiglu_mlp" else "zmlx_geglu"
            gate: Any = getattr(module, "gate_proj", None) or getattr(module, "w1", None)
            dim = int(gate.weight.shape[0])
            weights = gate.scales if isinstance(gate, nn.QuantizedLinear) else gate.weight
            dtype = _dtype(weights)
            choice = chooser.choose(kernel, dim, dtype)
            default = {t: default_elementwise_tg(t * dim) for t in chooser.tokens}
            held = choice.config is not None
            if choice.config is None:
                applied = f"zmlx's kernel at MetalKernel's default tg {sorted(set(default.values()))}"
            elif "tg" in choice.config:
                # zmlx's swiglu2/geglu2 take no threadgroup: the profile holds only where its pick is
                # the default zmlx launches with anyway
                held = all(tg == int(choice.config["tg"]) for tg in default.values())
                applied = (f"tg={choice.config['tg']}" if held else
                           f"zmlx's kernel at MetalKernel's default tg {sorted(set(default.values()))}; the "
                           f"profile's tg={choice.config['tg']} cannot be passed "
                           f"({kernel[5:]}2 takes no threadgroup)")
            else:
                _unwrap_call(module)
                applied = "MLX built-in (the block's own __call__)"
            record(path, pattern, kernel, dim, dtype, choice, applied, held)
        elif hasattr(module, "_zmlx_original_softmax"):
            _pin_softmax(module, chooser, path, report)
    return report


def _pin_softmax(module: Any, chooser: Chooser, path: str, report: PatchReport) -> None:
    """Replace zmlx's patched ``softmax`` with one that takes the threadgroup from the profile per call
    (the width is the attention length); zmlx's default where the profile has no entry."""
    import mlx.core as mx
    from zmlx.kernels import softmax as zmlx_softmax

    from kernelfleet.kernels.common import dtype_name

    tables = {d: chooser.table("zmlx_softmax", d) for d in ("float32", "float16", "bfloat16")}

    def pick(rows: int, dim: int, dtype: str) -> int:
        table = tables.get(dtype) or {}
        if (rows, dim) in table:
            return table[(rows, dim)]
        near = [(abs(r - rows), tg) for (r, d), tg in table.items() if d == dim]
        return min(near)[1] if near else ZMLX_DEFAULT_TG

    def softmax(x: Any, axis: int = -1, precise: bool = False) -> Any:
        if axis not in (-1, x.ndim - 1) or precise:
            return mx.softmax(x, axis=axis, precise=precise)
        dim = int(x.shape[-1])
        return zmlx_softmax.softmax_lastdim(x, threadgroup=pick(x.size // dim, dim, dtype_name(x.dtype)))

    module.softmax = softmax
    n = sum(len(t) for t in tables.values())
    choice = Choice({"table": n} if n else None,
                    f"{n} confident zmlx_softmax entries, looked up per call by (rows, width, dtype)" if n
                    else "no confident zmlx_softmax entry: tg=256 for every call")
    pin = ModulePin(path, "softmax", "zmlx_softmax", 0, "per call", f"per-call table ({n} entries)",
                    choice.basis)
    (report.pinned if n else report.kept_default).append(pin)
