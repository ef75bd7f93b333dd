"""Tokens/s of real mlx-lm architectures, stock vs ``kernelfleet.patch``, side by side in one process.

    python benchmarks/model.py tune --out benchmarks/results/h100_model_profile.json   # once per chip
    python benchmarks/model.py run --profile benchmarks/results/h100_model_profile.json \\
        --out benchmarks/results/h100_model.txt
    python benchmarks/model.py run --tiny          # CPU, tiny configs: the whole path end to end
    # quantized models, tune and run in one command line (repeat it until the tune is done):
    python benchmarks/model.py run --dtypes 4bit,8bit --kernels quantized_matmul,gather_quantized_matmul \
        --control --tune benchmarks/results/h100_quant_profile.json \
        --out benchmarks/results/h100_model_quant.txt

Models: mlx-lm's ``llama`` (Llama-3-8B's config) and ``qwen3_moe`` (Qwen3-30B-A3B's), from the
committed configs in ``tests/data/models/``, with random weights (no weights can be downloaded) and
``--layers`` decoder layers (default 8 of 32 and 48: the per-layer work is the model's; the embedding
and LM head weigh more with fewer layers; ``--layers 0``: all), in bfloat16 and quantized
(``--dtypes bf16,4bit,8bit``, ``--group``, default 64) as ``mlx_lm.convert`` quantizes: every linear
layer, the embedding and the MoE experts, Qwen3-MoE's router in 8 bits. A quantized model's profile
entries are the ``quantized_matmul`` calls its ``QuantizedLinear`` layers make, planned from the
config.json mlx-lm would write for it (``quantization``, with its per-layer overrides).

``run`` measures, per model and dtype, one model stock and patched by turns, in interleaved rounds:
each round times it unpatched and patched (``kernelfleet.patch`` before that side's measurement,
``kernelfleet.unpatch`` after; the order rotates), so both sides run the same weights in the same
memory (with a patched twin built from the same seed, ``results/h100_model.txt``'s Llama decode
batch 1 read 0.953x, slower beyond the noise, where no custom kernel runs at that shape). Each side's
measurement starts with an untimed call, so the patch's per-shape decisions (made on a patched
module's first call at a shape) and MLX's graph caches are warm; the garbage collector is off while
a side is timed. ``--control`` adds a third side per round, the stock model again: its paired ratio
against the first stock side is this pairing's own noise, printed beside each row. ``--against PROFILE``
adds one more, the model patched with a second profile: an A/B of two profiles (e.g. with and without
some entries) in the same rounds, each row giving patched against it, paired.

- prefill tokens/s at each ``--prefill`` length (batch 1, fresh KV cache; each forward's graph is
  built before the GPU starts; a round is the mean of 4 prefills after an untimed one);
- decode tokens/s at each ``--decode`` batch: ``--steps`` one-token steps after a ``--context``-token
  prefill, with a KV cache, in mlx-lm's own decode loop (``generate_step``: the next step is built
  and queued while the GPU runs this one); tokens/s counts every sequence of the batch;
- per row: tokens/s from each side's median round, and the patched/stock speed ratio paired by round
  (each round times both, back to back) with its 95 % bootstrap interval: *faster* or *slower* when
  the interval lies above or below 1, else *within the noise*;
- logits: the patched prefill's logits against the stock ones at the longest ``--prefill`` (max
  |diff| / max |logit|, and the share of positions whose argmax agrees);
- decode logits: ``--decode-logits`` teacher-forced one-token steps after a ``--context``-token
  prompt, stock's greedy tokens fed to both sides, each step's logits compared the same way (the
  decode step's own paths: a layer block's attention over the KV cache);
- greedy: ``--greedy`` steps of greedy decoding after a 16-token prompt, stock and patched: the
  tokens must agree at every step before the first where stock's top-2 margin is within the logits'
  largest difference, prefill's or decode's (``ok``, else ``MISMATCH``);
- per decode row, the memory bound: the bytes a step must read (the weights, less the embedding
  table's unread rows; of MoE experts the expected share the batch routes to; the KV cache) at the
  copy bandwidth measured at start (``benchmarks/bandwidth.py``), as tokens/s, and each side's share
  of it;
- the share of the stock forward's time spent in the ops the patch replaces (Amdahl): each op the
  patch routes, at the shapes and counts one forward calls it (counted through the patch), timed in
  isolation as the built-in and as the profile's choice, against the measured forward. Isolated op
  times leave out overlap and fusion with neighbours, so the share is an estimate.

``tune`` derives every kernel call of the models (``kernelfleet.kernels.patch.model_shapes``, the plan of
``kernelfleet admin campaign create --from-model``) and tunes each on this GPU with the worker's
tuner (successive halving, ``--budget`` seconds a shape, over ``--candidates`` configs besides the
built-in: a stable sample shared by shapes of one row length, since each config is an NVRTC
compile of ~1.5 s on CUDA), writing a KernelFleet profile file after each shape. It stops starting
shapes after ``--max-seconds`` (default 540: one 10-minute command); run it again to resume (shapes
already in ``--out`` are skipped) until it reports 0 to tune. ``run --tune PROFILE`` does the same
into PROFILE, then runs with it once nothing is left to tune. ``--kernels quantized_matmul`` keeps
only that kernel's calls (the tune, the profile's picks and the Amdahl estimate), e.g. to measure
what the quantized matmuls alone give (``quantized_matmul,gather_quantized_matmul``: the linear
layers and the MoE experts). A profile pulled from a coordinator (``kernelfleet pull``)
works as well.

Imports only mlx, mlx-lm, numpy and kernelfleet's ``kernels`` (``tune`` also its ``worker`` tuner): runs
on a bare GPU host (copy ``kernels`` and ``worker`` into a ``kernelfleet`` folder on PYTHONPATH, as
``benchmarks/multi_gpu.sh`` does, or install the wheel).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.kernels.patch import model_patch, profile_file, profile_view, runtime
from kernelfleet.kernels.patch.model_build import (
    TINY,
    TOKEN_IDS,
    Quant,
    build,
    label,
    load_config,
    parse_dtype,
    quantized_config,
)
from kernelfleet.kernels.patch.model_quant import KERNEL as QUANTIZED
from kernelfleet.kernels.patch.model_shapes import derive
from kernelfleet.kernels.patch.model_timing import decode_s, prefill_s, primed, without_gc
from kernelfleet.kernels.patch.paired import paired_speedup, verdict
from kernelfleet.kernels.spec import BUILTIN, config_key, parse_shape

_spec = importlib.util.spec_from_file_location("kf_bench_bandwidth", Path(__file__).with_name("bandwidth.py"))
assert _spec and _spec.loader
bandwidth: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bandwidth)  # the copy bandwidth a decode step's memory bound is taken at

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [ROOT / "tests/data/models/llama-3-8b.json", ROOT / "tests/data/models/qwen3-30b-a3b.json"]


def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.tiny:
        return [dict(c) for c in TINY.values()]
    return [load_config(path, args.layers) for path in args.config or CONFIGS]


def variants(args: argparse.Namespace) -> list[Quant]:
    """``--dtypes``: bf16 (the model's dtype), 4bit, 8bit (at ``--group``)."""
    try:
        return [parse_dtype(name, args.group) for name in args.dtypes.split(",")]
    except ValueError as e:
        raise SystemExit(f"--dtypes: {e}") from e


def plan_keys(config: dict[str, Any], args: argparse.Namespace, quant: Quant = None
              ) -> list[tuple[str, str, str]]:
    """The (kernel, shape, dtype) calls a forward makes at the measured token counts (``--kernels``:
    only these kernels)."""
    plan = derive(quantized_config(config, args.dtype, quant) if quant else config, decode=args.decode,
                  prefill=args.prefill, dtypes=[args.dtype], verify=())
    wanted = set(args.kernels.split(",")) if getattr(args, "kernels", None) else None
    return [(k, s, args.dtype) for k, shapes in plan.kernel_shapes.items() for s in shapes
            if wanted is None or k in wanted]


# ---- tune ----

def sample(kernel: str, shape: str, dtype: str, n: int) -> list[dict[str, Any]] | None:
    """The built-in, the kernel's default and ``n - 1`` more of this backend's candidates, picked by a
    stable hash of (kernel, row length, config), so shapes of one row length share their configs and
    each config compiles once per process (NVRTC: ~1.5 s a kernel). ``n`` 0: every candidate."""
    if n <= 0:
        return None
    from kernelfleet.worker.backends import detect_backend

    spec, dims = get_spec(kernel), parse_shape(shape)
    cands = [c for c in detect_backend().candidates(spec, dims, dtype) if c != BUILTIN]
    default = spec.default_config(dims, dtype)
    rank = sorted(cands, key=lambda c: hashlib.sha1(f"{kernel}|{dims[-1]}|{config_key(c)}".encode()).digest())
    picked = [default] + [c for c in rank if c != default][: n - 1]
    return [dict(BUILTIN)] + picked


def tune(args: argparse.Namespace, out: Path) -> int:
    """Tune the planned calls not yet in the profile file ``out``; how many are left untuned."""
    from kernelfleet.worker.tuner import tune_spec

    body = json.loads(out.read_text()) if out.exists() else {
        "schema": profile_file.SCHEMA, "chip": runtime.target().chip, "mlx_version": mx.__version__,
        "version": 1, "entries": []}
    have = {(e["kernel"], e["shape"], e["dtype"]) for e in body["entries"]}
    keys = list(dict.fromkeys(k for c in configs(args) for q in variants(args)
                              for k in plan_keys(c, args, q)))
    todo = sorted((k for k in keys if k not in have), key=lambda k: (k[0], parse_shape(k[1])[-1]))
    print(f"{len(keys)} kernel calls planned, {len(todo)} to tune (budget {args.budget} s each)", flush=True)
    stop = time.monotonic() + args.max_seconds
    for i, (kernel, shape, dtype) in enumerate(todo, 1):
        if time.monotonic() > stop:
            print(f"stopped after {args.max_seconds:.0f} s with {len(todo) - i + 1} left: run again to go on")
            return len(todo) - i + 1
        t0 = time.perf_counter()
        try:
            report = tune_spec(get_spec(kernel), shape, dtype, budget=args.budget,
                               configs=sample(kernel, shape, dtype, args.candidates)).report
        except Exception as e:  # one shape's failure (all candidates failed, ...) is reported, not fatal
            print(f"[{i}/{len(todo)}] {kernel} {shape} {dtype}: not tuned: {e}", flush=True)
            continue
        best = report["best_config_key"]
        trial = next(t for t in report["trials"] if t["config_key"] == best)
        builtin = next((t for t in report["trials"] if t["config_key"] == "builtin"), None)
        entry = {"kernel": kernel, "shape": shape, "dtype": dtype, "config": trial["config"],
                 "config_key": best, "median_us": trial["median_us"], "predicted": False}
        if builtin and builtin.get("median_us") and trial.get("median_us"):
            entry["speedup"] = builtin["median_us"] / trial["median_us"]
        runner_up = None if best != "builtin" else min(
            (t for t in report["trials"] if t["config_key"] != "builtin" and t.get("median_us")
             and t.get("status", "ok") == "ok"), key=lambda t: t["median_us"], default=None)
        if runner_up is not None and builtin and builtin.get("median_us"):
            # the fastest custom config, which a layer block's fused launch may run (ProfileView.fused_choice)
            entry["custom"] = {"config": runner_up["config"], "config_key": runner_up["config_key"],
                               "median_us": runner_up["median_us"],
                               "speedup": builtin["median_us"] / runner_up["median_us"]}
        body["entries"].append(entry)
        profile_file.write(body, out)
        print(f"[{i}/{len(todo)}] {kernel} {shape} {dtype}: {best} "
              f"({entry.get('speedup', float('nan')):.2f}x the built-in; {time.perf_counter() - t0:.0f} s)",
              flush=True)
    return 0


# ---- run ----

def probe_profile(keys: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Every planned call custom (the kernel's default config): patches every site, to count calls."""
    entries = [{"kernel": k, "shape": s, "dtype": d,
                "config": get_spec(k).default_config(parse_shape(s), d)} for k, s, d in keys]
    return {"schema": profile_file.SCHEMA, "chip": "probe", "entries": entries}


def restrict(path: str, kernels: str | None) -> Any:
    """The profile file at ``path``, or only its entries of ``kernels`` (comma-separated) as a body."""
    if not kernels:
        return path
    body = json.loads(Path(path).read_text())
    wanted = set(kernels.split(","))
    return {**body, "entries": [e for e in body.get("entries", []) if e.get("kernel") in wanted]}


STOCK, PATCHED, CONTROL, AGAINST = "stock", "patched", "stock again", "against"
MIN_GAIN_US: float | None = None  # --min-gain: patch()'s gain gate (None: each kernel's default)


def patch(model: nn.Module, profile: Any) -> Any:
    """``kernelfleet.patch`` as the patched side runs it (with ``--min-gain`` where given)."""
    return model_patch.patch(model, profile, min_gain_us=MIN_GAIN_US)

Sides = dict[str, Callable[[nn.Module], Any] | None]  # side -> how to patch the model for it (None: stock)


def sides(profile: Any, control: bool, against: Any = None) -> Sides:
    """stock and patched; stock again (``--control``); patched with a second profile (``--against``)."""
    out: Sides = {STOCK: None, PATCHED: lambda m: patch(m, profile)}
    if control:
        out[CONTROL] = None
    if against is not None:
        out[AGAINST] = lambda m: patch(m, against)
    return out


def side_by_side(model: nn.Module, plan: Sides, measure: Callable[[nn.Module], float],
                 rounds: int) -> dict[str, list[float]]:
    """Interleaved rounds on one model, each side patched as ``plan`` says just before it is timed and
    unpatched after. The order rotates round by round, so each side takes each place in a round equally
    often over a multiple of the number of sides: no side is always timed first, last or between."""
    names = list(plan)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds + 1):  # round 0 warms up: MLX builds its kernels, the patch its decisions
        for name in names[r % len(names):] + names[:r % len(names)]:
            patch = plan[name]
            if patch is not None:
                patch(model)
            try:
                t = without_gc(lambda: measure(model))
            finally:
                model_patch.unpatch(model)
            if r:
                times[name].append(t)
    return times


def op_seconds(kernel: str, shape: str, dtype: str, config: dict[str, Any], params: dict[str, Any],
               launches: int, lead: tuple[int, ...] | None = None) -> float:
    """Seconds per launch; ``lead``: the activations' leading dimensions, where not ``(M,)``."""
    spec = get_spec(kernel)
    dims = parse_shape(shape)
    inputs = spec.make_inputs(dims, dtype, 0)
    if lead is not None:
        inputs[0] = inputs[0].reshape(*lead, -1)
    mx.eval(inputs)
    mx.eval(runtime.run(kernel, inputs, dims, config, **params))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        mx.eval([runtime.run(kernel, inputs, dims, config, **params) for _ in range(launches)])
        best = min(best, (time.perf_counter() - t0) / launches)
    return best


def counts(model: nn.Module, keys: list, work: Callable[[], Any]) -> tuple[dict, dict]:
    """Calls per (kernel, shape, dtype) that ``work`` makes through the patched sites, and their params."""
    report = model_patch.patch(model, probe_profile(keys), custom_kernels=False)
    mx.eval(work())
    seen: dict[tuple[str, str, str], int] = {}
    params: dict[tuple[str, str, str], dict[str, Any]] = {}
    for m in report.patched:
        assert m.router is not None
        for k, n in m.router.seen.items():
            seen[k] = seen.get(k, 0) + n
            params.setdefault(k, m.router.params[k])
    model_patch.unpatch(model)
    return seen, params


def amdahl(model: nn.Module, keys: list, view: Any, work: Callable[[], Any], forward_s: float,
           launches: int, lead: tuple[int, ...] | None = None) -> str:
    """``work``: one forward (a prefill, or one decode step on a primed cache), as timed in ``forward_s``.
    ``lead``: a decode step's ``(batch, 1)``, the leading dimensions stock's quantized layers hand MLX's op
    (the patch hands it ``(M, K)``, faster on MLX 0.32's CUDA backend: ``kernels/patch/model_quant.py``)."""
    seen, params = counts(model, keys, work)
    builtin_s = tuned_s = 0.0
    for key, n in seen.items():
        stock_lead = lead if key[0] == QUANTIZED and lead is not None and lead[0] > 1 else None
        b = op_seconds(*key, dict(BUILTIN), params[key], launches, stock_lead)
        choice = view.choice(key[0], parse_shape(key[1]), key[2])
        if choice:
            t = op_seconds(*key, choice, params[key], launches)
        else:
            t = op_seconds(*key, dict(BUILTIN), params[key], launches) if stock_lead else b
        builtin_s += n * b
        tuned_s += n * t
    share = builtin_s / forward_s
    ceiling = forward_s / max(forward_s - builtin_s + tuned_s, 1e-12)
    return (f"replaced ops {share:6.1%} of the stock forward; with the profile's choices "
            f"at most {ceiling:.3f}x")


EXPERT_LAYERS = ("SwitchLinear", "QuantizedSwitchLinear")  # mlx-lm's MoE experts: weight (E, N, K)


def step_bytes(model: nn.Module, cache: list[Any], batch: int) -> tuple[float, float]:
    """(weights, KV cache) bytes a decode step at ``batch`` must read at least: every parameter but the
    embedding table (a step reads ``batch`` of its rows; all of it where the LM head is the tied
    embedding); of each MoE expert layer, the expected share of experts ``batch`` tokens route to
    (``E (1 - (1 - k/E)^batch)`` of E, for top-k routing spread evenly); and the cache's keys and
    values up to its offset."""
    margs = getattr(model, "args", None)
    tied = bool(getattr(margs, "tie_word_embeddings", False))
    topk = int(getattr(margs, "num_experts_per_tok", 0) or 0)
    weights = 0.0
    for _, module in model.named_modules():
        own = sum(v.nbytes for v in module.values() if isinstance(v, mx.array))
        if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)) and not tied:
            own = own * batch / max(module.weight.shape[0], 1)
        elif type(module).__name__ in EXPERT_LAYERS and topk:
            experts = module.weight.shape[0]
            own = own * (1 - (1 - min(topk, experts) / experts) ** batch)
        weights += own
    kv = 0.0
    for c in cache:
        keys, values = getattr(c, "keys", None), getattr(c, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array) and keys.ndim == 4:
            kv += (keys.nbytes + values.nbytes) * min(c.offset / max(keys.shape[2], 1), 1.0)
    return weights, kv


def memory_bound(weights: float, kv: float, gbs: float, batch: int, times: dict[str, list[float]]) -> str:
    """The decode row's memory limit: the step's bytes at the measured copy bandwidth, and each side's
    median step against it."""
    floor = (weights + kv) / (gbs * 1e9)
    share = {side: floor / statistics.median(times[side]) for side in (STOCK, PATCHED)}
    return (f"memory bound: {(weights + kv) / 1e6:.1f} MB a step (weights {weights / 1e6:.1f}, KV cache "
            f"{kv / 1e6:.1f}) at {gbs:.0f} GB/s copy: at most {batch / floor:.1f} tok/s; stock at "
            f"{share[STOCK]:.1%} of it, patched {share[PATCHED]:.1%}")


def logits_check(model: nn.Module, profile: Any, n: int) -> tuple[str, float]:
    """The line, and the largest |patched - stock| logit (the tolerance :func:`greedy_check` uses)."""
    tokens = mx.random.randint(0, TOKEN_IDS, (1, n), key=mx.random.key(7))
    stock = model(tokens).astype(mx.float32)
    patch(model, profile)
    patched = model(tokens).astype(mx.float32)
    model_patch.unpatch(model)
    diff = mx.abs(stock - patched).max().item()
    rel = diff / mx.abs(stock).max().item()
    agree = mx.mean(mx.argmax(stock, axis=-1) == mx.argmax(patched, axis=-1)).item()
    return (f"logits: max |diff| / max |logit| {rel:.2e} (max |diff| {diff:.3g}); argmax agrees at "
            f"{agree:.1%} of {n} positions"), diff


def decode_steps(model: nn.Module, prompt: mx.array, steps: int, fed: list[int] | None = None
                 ) -> tuple[list[int], list[mx.array]]:
    """``steps`` one-token steps with a KV cache after ``prompt``: each step's token (the previous
    step's argmax, or ``fed``'s) and the logits it gives."""
    cache = make_prompt_cache(model)
    y = model(prompt, cache=cache)[0, -1].astype(mx.float32)
    tokens, logits = [], []
    for i in range(steps):
        tokens.append(int(mx.argmax(y).item()) if fed is None else fed[i])
        y = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1].astype(mx.float32)
        mx.eval(y)
        logits.append(y)
    return tokens, logits


def decode_logits_check(model: nn.Module, profile: Any, context: int, steps: int) -> tuple[str, float]:
    """Teacher-forced decode steps: after a ``context``-token prompt, stock's greedy tokens fed to both
    sides (so both attend over the same cache contents), each step's logits compared. The line, and the
    largest |patched - stock| logit. The prefill logits check leaves the decode step's own paths out
    (a layer block's attention over the KV cache, ``model_decode``)."""
    prompt = mx.random.randint(0, TOKEN_IDS, (1, context), key=mx.random.key(13))
    tokens, stock = decode_steps(model, prompt, steps)
    patch(model, profile)
    try:
        _, patched = decode_steps(model, prompt, steps, tokens)
    finally:
        model_patch.unpatch(model)
    pairs = list(zip(stock, patched, strict=True))
    diffs = [mx.abs(a - b).max().item() for a, b in pairs]
    rel = [d / mx.abs(a).max().item() for d, (a, _) in zip(diffs, pairs, strict=True)]
    agree = sum(int(mx.argmax(a).item()) == int(mx.argmax(b).item()) for a, b in pairs)
    return (f"decode logits, teacher-forced {steps} steps after {context} tokens: max |diff| / max |logit| "
            f"per step max {max(rel):.2e}, median {statistics.median(rel):.2e} (max |diff| "
            f"{max(diffs):.3g}); argmax agrees at {agree} of {steps} steps"), max(diffs)


GREEDY_PROMPT = 16


def greedy(model: nn.Module, steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens after a fixed prompt (KV cache, one token a step), and the top-2 logit margin of
    each step."""
    cache = make_prompt_cache(model)
    prompt = mx.random.randint(0, TOKEN_IDS, (1, GREEDY_PROMPT), key=mx.random.key(11))
    y = model(prompt, cache=cache)[0, -1].astype(mx.float32)
    tokens, margins = [], []
    for _ in range(steps):
        top2 = mx.sort(y)[-2:]
        tokens.append(int(mx.argmax(y).item()))
        margins.append(float((top2[1] - top2[0]).item()))
        y = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1].astype(mx.float32)
    return tokens, margins


def greedy_check(model: nn.Module, profile: Any, steps: int, tol: float) -> str:
    """Greedy decoding stock and patched: the tokens must agree at every step before the first one
    where stock's top-2 margin is within ``tol`` (the logits check's largest difference); from there
    on the two may part."""
    stock, margins = greedy(model, steps)
    patch(model, profile)
    try:
        patched, _ = greedy(model, steps)
    finally:
        model_patch.unpatch(model)
    close = next((i for i, m in enumerate(margins) if m <= tol), steps)
    differ = next((i for i, (a, b) in enumerate(zip(stock, patched, strict=True)) if a != b), None)
    ok = differ is None or differ >= close
    tokens = "same tokens" if differ is None else f"first differs at step {differ}"
    return (f"greedy {steps} steps: {tokens}; "
            f"stock's top-2 margin first within {tol:.3g} at step "
            f"{close if close < steps else 'none'} -> {'ok' if ok else 'MISMATCH'}")


def row(label: str, tokens: int, times: dict[str, list[float]]) -> str:
    stock, patched = times[STOCK], times[PATCHED]
    s, p = statistics.median(stock), statistics.median(patched)
    spread = max(max(stock) / min(stock), max(patched) / min(patched)) - 1
    mid, lo, hi = paired_speedup(stock, patched)
    out = (f"  {label:16} stock {tokens / s:10.1f} tok/s   patched {tokens / p:10.1f} tok/s   "
           f"patched/stock {s / p:6.3f}x   (round spread up to {spread:5.1%}, {len(stock)} rounds each)\n"
           f"    paired by round: {mid:.3f}x [{lo:.3f}, {hi:.3f}] 95 % -> {verdict(lo, hi)}")
    if CONTROL in times:
        mid, lo, hi = paired_speedup(stock, times[CONTROL])
        out += (f"\n    control, stock against stock: {mid:.3f}x [{lo:.3f}, {hi:.3f}] 95 % -> "
                f"{verdict(lo, hi)}")
    if AGAINST in times:
        a = statistics.median(times[AGAINST])
        mid, lo, hi = paired_speedup(times[AGAINST], patched)
        out += (f"\n    --against's profile {tokens / a:10.1f} tok/s ({s / a:.3f}x stock); patched against "
                f"it, paired: {mid:.3f}x [{lo:.3f}, {hi:.3f}] 95 % -> {verdict(lo, hi)}")
    return out


def run(args: argparse.Namespace, emit: Callable[[str], None]) -> None:
    target = runtime.target()
    import mlx_lm

    emit(f"device: {target.chip} ({target.backend}); mlx {mx.__version__}, mlx-lm {mlx_lm.__version__}")
    bw = bandwidth.copy_bandwidth(target.backend, 1 << 24 if args.tiny else 1 << 30)
    args.copy_gbs = bw["limit"]
    emit(f"copy bandwidth (read + write): {', '.join(f'{k} {v:.0f} GB/s' for k, v in bw.items())}")
    emit(f"prefill {args.prefill}, decode batches {args.decode} ({args.steps} steps after "
         f"{args.context} tokens), {args.rounds} interleaved rounds")
    for config in configs(args):
        for quant in variants(args):
            keys = plan_keys(config, args, quant)
            profile: Any = restrict(args.profile, args.kernels) if args.profile else probe_profile(keys)
            args.against_profile = restrict(args.against, args.kernels) if args.against else None
            view = profile_view.load(profile, target.chip)
            emit(f"\n{config['model_type']} ({config['num_hidden_layers']} layers, hidden "
                 f"{config['hidden_size']}, {label(quant, args.dtype)})")
            model = build(config, args.dtype, quant)
            measure_model(model, keys, profile, view, args, emit)
            del model
            gc.collect()



def measure_model(model: nn.Module, keys: list, profile: Any, view: Any, args: argparse.Namespace,
                  emit: Callable[[str], None]) -> None:
    report = patch(model, profile)
    model_patch.unpatch(model)
    emit("\n".join("  " + line for line in str(report).splitlines()))
    if args.against_profile is not None:
        report = patch(model, args.against_profile)
        model_patch.unpatch(model)
        emit("  --against's profile:\n" + "\n".join("  " + line for line in str(report).splitlines()))
    text, diff = logits_check(model, profile, max(args.prefill))
    emit("  " + text)
    if args.decode_logits:
        text, decode_diff = decode_logits_check(model, profile, args.context, args.decode_logits)
        emit("  " + text)
        diff = max(diff, decode_diff)
    emit("  " + greedy_check(model, profile, args.greedy, diff))
    for n in args.prefill:
        times = side_by_side(model, sides(profile, args.control, args.against_profile),
                             lambda m, n=n: prefill_s(m, n), args.rounds)
        emit(row(f"prefill {n}", n, times))
        tokens = mx.random.randint(0, TOKEN_IDS, (1, n), key=mx.random.key(n))
        emit("    " + amdahl(model, keys, view, lambda t=tokens: model(t, cache=make_prompt_cache(model)),
                             statistics.median(times[STOCK]), args.launches))
    for b in args.decode:
        times = side_by_side(model, sides(profile, args.control, args.against_profile),
                             lambda m, b=b: decode_s(m, b, args.context, args.steps), args.rounds)
        emit(row(f"decode batch {b}", b, times))
        cache = primed(model, b, args.context)
        step = mx.zeros((b, 1), mx.int32)
        emit("    " + amdahl(model, keys, view, lambda c=cache, t=step: model(t, cache=c),
                             statistics.median(times[STOCK]), args.launches, (b, 1)))
        emit("    " + memory_bound(*step_bytes(model, cache, b), args.copy_gbs, b, times))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("run", "tune"), nargs="?", default="run")
    p.add_argument("--tiny", action="store_true", help="tiny configs (CPU check); default sizes shrink too")
    p.add_argument("--config", action="append", help="a model's config.json (repeat; default: Llama-3-8B, "
                   "Qwen3-30B-A3B from tests/data/models)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers built (0: the config's)")
    p.add_argument("--dtypes", default="bf16,4bit", help="bf16, 4bit, 8bit (comma-separated): the model "
                   "in bfloat16, and quantized as mlx_lm.convert does at --group")
    p.add_argument("--group", type=int, default=64, choices=(32, 64, 128), help="quantization group size")
    p.add_argument("--kernels", help="only these kernels' calls (comma-separated), e.g. quantized_matmul: "
                   "the profile's picks, tune's work and the Amdahl estimate")
    p.add_argument("--greedy", type=int, help="greedy decoding steps compared, stock and patched "
                   "(default 64)")
    p.add_argument("--decode-logits", type=int, help="teacher-forced decode steps whose logits are compared, "
                   "stock and patched, after --context tokens (default 48; 0: none)")
    p.add_argument("--prefill", type=int, nargs="+", help="prefill lengths (default 512 2048)")
    p.add_argument("--decode", type=int, nargs="+", help="decode batch sizes (default 1 8)")
    p.add_argument("--context", type=int, help="tokens in the cache before decode steps (default 512)")
    p.add_argument("--steps", type=int, help="decode steps timed per round (default 128)")
    p.add_argument("--rounds", type=int, help="interleaved rounds per mode (default 7)")
    p.add_argument("--control", action="store_true",
                   help="time the stock model a second time each round: the pairing's own noise per row")
    p.add_argument("--launches", type=int, help="op launches per timing in the Amdahl estimate (default 50)")
    p.add_argument("--profile", help="a KernelFleet profile file (kernelfleet pull, or `tune`); "
                   "--tiny without one: every planned call at its kernel's default config")
    p.add_argument("--against", metavar="PROFILE",
                   help="run: also time the model patched with this second profile, by turns with the "
                        "others, and print patched against it (paired): an A/B of two profiles")
    p.add_argument("--tune", metavar="PROFILE", help="run: first tune the planned calls not yet in PROFILE "
                   "(as `tune --out PROFILE`, within --max-seconds), then run with it once none is left")
    p.add_argument("--budget", type=float, default=6.0, help="tune: seconds of search per shape")
    p.add_argument("--candidates", type=int, default=12,
                   help="tune: configs tried per shape besides the built-in (0: every candidate)")
    p.add_argument("--max-seconds", type=float, default=540.0,
                   help="tune: stop starting new shapes after this long (run again to resume)")
    p.add_argument("--min-gain", type=float, metavar="US",
                   help="run: the patch's gain gate, µs a call a custom pick must save (default: each "
                   "kernel's own, kernelfleet.patch's min_gain_us=None)")
    p.add_argument("--out", help="run: also write the report here; tune: the profile file (required)")
    args = p.parse_args(argv)
    global MIN_GAIN_US
    MIN_GAIN_US = args.min_gain
    small = args.tiny
    args.prefill = args.prefill or ([32, 64] if small else [512, 2048])
    args.decode = args.decode or [1, 8]
    args.context = args.context or (16 if small else 512)
    args.steps = args.steps or (4 if small else 128)
    args.rounds = args.rounds or (2 if small else 7)
    args.launches = args.launches or (5 if small else 50)
    args.greedy = args.greedy if args.greedy is not None else (8 if small else 64)
    args.decode_logits = args.decode_logits if args.decode_logits is not None else (4 if small else 48)
    # activations and norm weights of the bf16 and the 4-bit model; --tiny: float32 (MLX's CPU gather_mm,
    # the MoE experts' matmul, takes float32 only)
    args.dtype = "float32" if small else "bfloat16"
    if args.command == "tune":
        if not args.out:
            p.error("tune needs --out PROFILE.json")
        tune(args, Path(args.out))
        return 0
    if args.tune:
        if args.profile:
            p.error("--tune PROFILE tunes into PROFILE and runs with it: drop --profile")
        if tune(args, Path(args.tune)):
            print("not run: tuning is not finished (run the same command again)")
            return 0
        args.profile = args.tune
    if not args.profile and not args.tiny:
        p.error("give --profile (from `kernelfleet pull` or `python benchmarks/model.py tune --out ...`)")
    lines: list[str] = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    run(args, emit)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
