"""A profile held in memory, as :func:`kernelfleet.patch` consults it: which config to run per
(kernel, shape, dtype), and what the profile says about a family of shapes (one model dimension).

An entry counts as custom only when its config is not the built-in, it is not a fallback, and, if it
is predicted, its confidence is at least ``min_confidence``; and, where the entry carries the evidence,
when it is faster than the built-in beyond the noise and by more than what a patched call adds:

- its speedup interval lies above 1 (a coordinator's profile), else its speedup is at least
  :data:`MIN_SPEEDUP` (the noise floor of side-by-side timings);
- the time it saves a call, ``median_us * (speedup - 1)`` (the built-in's median less ours), is at
  least the gain gate (:meth:`ProfileView.min_gain`): the host time a custom call adds to the model's
  forward (routing through the kernels runtime and a custom-kernel launch instead of MLX's own op).
  A forward is host-bound where its ops are small (decode), and a prefill's graph is built before
  the GPU starts, so that time is not hidden. ``kernelfleet.patch(min_gain_us=...)`` sets one gate
  for every kernel; by default each kernel has the gate of the call path the patch routes it by:

  - :data:`DEFAULT_MIN_GAIN_US`, the lean path (:data:`LEAN_KERNELS`: the quantized matmuls), where
    each (input shape, dtype) resolves once to one compiled graph and a call is a dictionary lookup
    and its replay (:mod:`kernelfleet.kernels.patch.model_quant`). Measured on this repository's CPU host
    (2 cores shared under a load of 12-20, so medians of interleaved rounds, minimums beside them;
    ``benchmarks/patch_cost.py --quantized 4 --emulate-gpu --dtype float32 --config`` a 4-layer
    Llama of hidden 1024: the GPU's call structure, a compiled graph, with MLX's op in place of the
    kernel). One ``QuantizedLinear`` call with evaluated inputs: the patched call took 2.0-2.3 µs
    more host time than the raw kernel call (the issue's target: 3 µs) and -0.6 to +0.8 µs more than
    MLX's own layer (the compiled graph absorbs the reshape MLX's op makes of a 3-D ``x``). Inside
    the decode loop, where every input is the unevaluated output of the op before it, a decode step
    (batch 1, 29 patched calls) took 8.7 µs more per patched call (11 rounds; 9.5 µs over 9 more
    rounds, 5.9 µs between the minimums): a compiled graph's replay costs more than a plain op there
    (a chain of 8 calls: 5.4 µs a call compiled, 2.1 µs plain), and the raw kernel call is such a
    graph too. On the H100 a 5 µs gate lost: with it, the Llama-3-8B shape (8 layers, 4-bit, group
    64) decoded at batch 1 at 0.850x stock (paired 95 % interval 0.810-0.996;
    ``results/h100_model_quant.txt``): 57 patched calls a step, 7 µs more host time each, and
    isolated savings of 18-19 µs (gate/up/down at M=1) do not show in a step that the host bounds.
    So the lean path keeps the routed gate (36 µs) until the patched call is cheaper; at 36 µs that
    row was still 0.917x [0.904, 0.976] (``results/h100_model_quant_gate36.txt``, only the LM head
    custom at M=1), so part of the cost is in every patched layer, custom or not.
  - :data:`ROUTED_MIN_GAIN_US` for the kernels a call looks up through
    :meth:`~kernelfleet.kernels.patch.model_patterns.Router.run` (norms, RoPE, GLUs, MoE routing).
    Measured where it is paid, inside a model (``benchmarks/patch_cost.py``: the host time to build
    one decode step of the Llama-3-8B shape at batch 8, stock and patched, on an H100,
    ``results/h100_patch_cost*.txt``): each custom rope call added 22-56 µs in four runs (median
    36 µs; a custom add_rmsnorm call timed alone, ``benchmarks/host_cost.py``: 8.5-11.3 µs). With
    the earlier 8 µs, that model's patched decode at batch 8 ran 0.82-0.91x of stock and its prefill
    of 2048 tokens 0.97-0.99x: the profile had add_rmsnorm at 2048x4096 2.08x the built-in (34 µs a
    call), but re-timed it saved 9-14 µs a call over mlx-lm's own ``x + r`` and ``mx.fast.rms_norm``
    and was 0.94x the compiled built-in (``h100_patch_cost_run5.txt``). Not lowered with the lean
    path: those calls were not re-measured.

Anything else runs the built-in.

A launch that also does the work of the ops around it (a layer block's quantized matmul at decode, whose
qmv launch normalises its input, writes attention's layout or adds the residual:
:mod:`kernelfleet.kernels.patch.model_layer`) saves more than the matmul's own time, and the op-level
tune, the matmul alone against MLX's, does not see that: at small shapes the built-in can win alone
where the fused launch would pay. For such a launch
(:meth:`ProfileView.fused_choice`) an entry whose pick is the built-in offers its ``custom``: the
fastest custom config the same measurements saw, with its speedup over the built-in; that config, or an
entry's own pick that only the noise or the gain gate kept out, is taken when its speedup is at least
:data:`FUSED_MIN_SPEEDUP`. The Qwen3-30B-A3B shape's decode step at batch 1 (H200,
``results/h200_model_qwen3_moe_layer.txt``) is host time on both sides: with the tuned profile (the
built-in at M=1 for q/k/v and o) the block did not run and decode stayed within the noise; with custom
configs there, 1.22-1.30x (4-bit) and 1.42x (8-bit) stock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..spec import BUILTIN, Config, Shape, format_shape, parse_shape
from . import profile_file

DEFAULT_MIN_CONFIDENCE = 0.8  # the coordinator's KERNELFLEET_PREDICTION_MIN_CONFIDENCE default
MIN_SPEEDUP = 1.03  # side-by-side repeat pairs differed by up to 1.9 % (h100_session_run6.txt)
# A fused launch's config may be this much slower than the built-in alone: it absorbs at least one MLX
# primitive (an RMSNorm or an add: 3.6 µs of host time, a view 1.4 µs; h200_model_32layers_epilogue.txt)
# in a decode step the host bounds, and 10 % of a 10-40 µs matmul is GPU time that step hides.
FUSED_MIN_SPEEDUP = 0.9
DEFAULT_MIN_GAIN_US = 36.0  # the lean path's gate: the routed one until a patched call costs less (docstring)
ROUTED_MIN_GAIN_US = 36.0  # host µs a custom call routed through Router.run adds (H100, module docstring)
LEAN_KERNELS = frozenset({"quantized_matmul", "gather_quantized_matmul"})  # called by the lean path


@dataclass
class ProfileView:
    entries: dict[tuple[str, str, str], dict[str, Any]]
    source: str
    min_confidence: float = DEFAULT_MIN_CONFIDENCE
    min_gain_us: float | None = 0.0  # None: each kernel's default gate (:meth:`min_gain`)
    _by_kernel: dict[tuple[str, str], list[tuple[Shape, dict[str, Any]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for (kernel, shape, dtype), e in self.entries.items():
            try:
                self._by_kernel.setdefault((kernel, dtype), []).append((parse_shape(shape), e))
            except ValueError:
                continue

    def usable(self, entry: dict[str, Any]) -> bool:
        return self.why_builtin(entry) is None

    def why_builtin(self, entry: dict[str, Any]) -> str | None:
        """Why ``entry`` runs the built-in (None: it runs its custom config); the reasons other than
        "the profile's pick is the built-in" are worded for :func:`kernelfleet.patch`'s report."""
        config = entry.get("config") or BUILTIN
        if config == BUILTIN or entry.get("fallback"):
            return "built-in"
        if entry.get("predicted") and _num(entry.get("confidence")) < self.min_confidence:
            return "not confident"
        speedup, median = _num(entry.get("speedup"), None), _num(entry.get("median_us"), None)
        interval = entry.get("speedup_interval")
        if isinstance(interval, list) and len(interval) == 2 and _num(interval[0], None) is not None:
            if _num(interval[0]) <= 1.0:
                return "not faster beyond the noise"
        elif speedup is not None and speedup < MIN_SPEEDUP:
            return "not faster beyond the noise"
        gate = self.min_gain(str(entry.get("kernel", "")))
        if speedup is not None and median is not None and median * (speedup - 1.0) < gate:
            return f"gains under {gate:g} µs a call"
        return None

    def min_gain(self, kernel: str) -> float:
        """The gain a call ``kernel``'s custom pick must save (module docstring)."""
        if self.min_gain_us is not None:
            return self.min_gain_us
        return DEFAULT_MIN_GAIN_US if kernel in LEAN_KERNELS else ROUTED_MIN_GAIN_US

    def choice(self, kernel: str, shape: Shape, dtype: str) -> Config | None:
        """The custom config to run at this exact shape, or None (the built-in)."""
        entry = self.entries.get((kernel, format_shape(shape), dtype))
        return dict(entry["config"]) if entry is not None and self.usable(entry) else None

    def fused_choice(self, kernel: str, shape: Shape, dtype: str) -> Config | None:
        """The config a fused launch runs at this exact shape (module docstring): :meth:`choice`'s, else
        :meth:`runner_up`'s; None: the built-in."""
        entry = self.entries.get((kernel, format_shape(shape), dtype))
        if entry is None:
            return None
        if self.usable(entry):
            return dict(entry["config"])
        alt = self.runner_up(entry)
        return dict(alt["config"]) if alt is not None else None

    def runner_up(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """The custom config a fused launch may run where ``entry`` runs the built-in (:meth:`fused_choice`):
        the entry's own pick where only the noise or the gain gate kept it, or where the built-in won, its
        ``custom`` (its fastest custom config); as a dict with ``config`` and ``speedup``, that speedup over
        the built-in at least :data:`FUSED_MIN_SPEEDUP`. None otherwise."""
        if entry.get("fallback") or (entry.get("predicted")
                                     and _num(entry.get("confidence")) < self.min_confidence):
            return None
        alt = entry if (entry.get("config") or BUILTIN) != BUILTIN else entry.get("custom")
        if not isinstance(alt, dict) or not isinstance(alt.get("config"), dict) or alt["config"] == BUILTIN:
            return None
        speedup = _num(alt.get("speedup"), None)
        return alt if speedup is not None and speedup >= FUSED_MIN_SPEEDUP else None

    def family(self, kernel: str, dtype: str, member: Callable[[Shape], bool],
               describe: Callable[[Shape], str] = format_shape,
               fused: Callable[[Shape, Config], bool] | None = None) -> tuple[list[str], list[str]]:
        """The tuned shapes of one family (e.g. rmsnorm rows x 4096), each named by ``describe``:
        (custom ones, built-in ones). A custom one names its config's ``path`` where it has one (e.g.
        ``M=1 (qmv)``); a built-in shape whose profile pick is custom says why it runs the built-in,
        e.g. ``8x4096 (gains under 36 µs a call)``. ``fused``: the shapes a fused launch runs
        (:meth:`fused_choice`), whose runner-up counts as custom, e.g. ``M=1 o (qmv_split, fused; 0.97x
        alone)``."""
        custom: list[str] = []
        builtin: list[str] = []
        for shape, e in self._by_kernel.get((kernel, dtype), []):
            if member(shape):
                why = self.why_builtin(e)
                alt = self.runner_up(e) if why is not None and fused is not None else None
                if alt is not None and not (fused is not None and fused(shape, alt["config"])):
                    alt = None
                if why is None:
                    path = (e.get("config") or {}).get("path")
                    custom.append(describe(shape) + (f" ({path})" if isinstance(path, str) else ""))
                elif alt is not None:
                    path = alt["config"].get("path")
                    custom.append(f"{describe(shape)} ({f'{path}, ' if isinstance(path, str) else ''}fused; "
                                  f"{_num(alt.get('speedup')):.2f}x alone)")
                else:
                    builtin.append(describe(shape) + ("" if why == "built-in" else f" ({why})"))
        return custom, builtin


def _num(value: Any, default: float | None = 0.0) -> Any:
    """``value`` as a float when it is a number (not a bool), else ``default``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return default


def load(profile: str | Path | dict[str, Any] | None, chip: str,
         min_confidence: float = DEFAULT_MIN_CONFIDENCE, min_gain_us: float | None = 0.0) -> ProfileView:
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
    return ProfileView(entries, source, min_confidence, min_gain_us)
