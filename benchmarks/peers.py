"""PyTorch peers of the catalog kernels, for benchmarks/kernels.py: torch eager and torch.compile.

``peers(name, inputs)`` gives, for a catalog kernel and its MLX inputs, the same op written in
PyTorch (the torch function where one exists, else the composition a PyTorch user would write),
as ``{"torch eager": fn, "torch.compile": compiled fn}`` over inputs copied once to the GPU. Each
``fn()`` enqueues one evaluation and returns its output(s) without synchronizing, so it is timed
like an MLX launch (``time_launches``). torch is optional: :func:`available` says whether it is here
(with a CUDA device), and every caller keeps working without it.

Rope's peer takes its cos/sin tables precomputed (float32, positions x head_dim/2) as inputs, which
the MLX kernels compute themselves; int4 dequantize's peer works on the packed words as int32.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the benchmark runs without torch and says so
    torch = None
    F = None

TorchFn = Callable[[], Any]


def available() -> tuple[bool, str]:
    """(usable, why not): torch importable and a CUDA device present."""
    if torch is None:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"torch {torch.__version__}"


def _to_torch(a: Any) -> Any:
    """An MLX array on the torch GPU, same values and dtype (bf16 goes through float32: exact)."""
    import mlx.core as mx

    name = str(a.dtype).split(".")[-1]
    if name in ("bfloat16", "float16"):
        t = torch.from_numpy(np.asarray(a.astype(mx.float32))).cuda()
        return t.to(torch.bfloat16 if name == "bfloat16" else torch.float16)
    if name == "uint32":
        return torch.from_numpy(np.asarray(a).view(np.int32)).cuda()
    return torch.from_numpy(np.array(a)).cuda()


def _ops(name: str) -> Callable[..., Any] | None:
    """The torch op for catalog kernel ``name`` (None: no peer)."""
    if name == "rmsnorm":
        return lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-5)
    if name == "add_rmsnorm":
        def add_rmsnorm(x: Any, r: Any, w: Any) -> Any:
            h = x + r
            return F.rms_norm(h, (h.shape[-1],), w, 1e-5), h
        return add_rmsnorm
    if name == "layernorm":
        return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    if name == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    if name == "logsumexp":
        return lambda x: torch.logsumexp(x.float(), dim=-1).to(x.dtype)
    if name == "swiglu":
        return lambda g, u: F.silu(g) * u
    if name == "geglu":
        return lambda g, u: F.gelu(g, approximate="tanh") * u
    if name == "bias_gelu":
        return lambda x, b: F.gelu(x + b)
    if name == "moe_combine":
        return lambda y, w: (y * w[..., None]).sum(dim=-2)
    if name == "topk_gating_softmax":
        def gating(x: Any) -> Any:
            p = torch.softmax(x.float(), dim=-1)
            v, i = torch.topk(p, 2, dim=-1)
            return v.to(x.dtype), i
        return gating
    if name == "rope":
        def rope(x: Any, c: Any, s: Any) -> Any:
            h = x.shape[-1] // 2
            x1, x2 = x[..., :h].float(), x[..., h:].float()
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
        return rope
    if name == "int4_dequantize":
        def dequantize(wq: Any, sc: Any, bi: Any) -> Any:
            shifts = torch.arange(0, 32, 4, device=wq.device, dtype=torch.int32)
            codes = ((wq[..., None] >> shifts) & 15).reshape(wq.shape[0], -1, 64).to(sc.dtype)
            return (codes * sc[..., None] + bi[..., None]).reshape(wq.shape[0], -1)
        return dequantize
    return None


def _inputs(name: str, inputs: Sequence[Any]) -> list[Any]:
    if name == "rope":
        x, off = inputs
        L, dh = int(x.shape[-2]), int(x.shape[-1])
        pos = np.arange(L, dtype=np.float64) + float(np.asarray(off).reshape(-1)[0])
        theta = pos[:, None] * 10000.0 ** (-np.arange(dh // 2, dtype=np.float64) * 2.0 / dh)[None, :]
        tables = [torch.from_numpy(f(theta).astype(np.float32)).cuda() for f in (np.cos, np.sin)]
        return [_to_torch(x), *tables]
    return [_to_torch(a) for a in inputs]


def peers(name: str, inputs: Sequence[Any]) -> dict[str, TorchFn]:
    """``{"torch eager": fn, "torch.compile": fn}`` for kernel ``name`` (empty when torch has no peer).
    torch.compile is the default mode (Inductor), shapes static; its compile happens on the first call."""
    ok, _ = available()
    if not ok:
        return {}
    op = _ops(name)
    if op is None:
        return {}
    t = _inputs(name, inputs)
    compiled = torch.compile(op, dynamic=False)
    return {"torch eager": lambda: op(*t), "torch.compile": lambda: compiled(*t)}


def first_output(out: Any) -> np.ndarray:
    """The first output of a peer call as float32 numpy (for checking it against the reference)."""
    first = out[0] if isinstance(out, (tuple, list)) else out
    return first.float().cpu().numpy()


def time_launches(fn: TorchFn, launches: int, rounds: int) -> float:
    """Median seconds per launch, timed like ``kernels.time_fn``: rounds of ``launches`` queued calls
    between ``torch.cuda.synchronize()`` calls, after one warm-up round."""
    for _ in range(launches):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / launches)
    return float(sorted(samples)[len(samples) // 2])


def copy_gbs(nbytes: int = 1 << 30) -> float | None:
    """torch's device-to-device copy (``Tensor.copy_``), GB/s counting read + write; None without torch."""
    if not available()[0]:
        return None
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    sec = time_launches(functools.partial(b.copy_, a), 20, 15)
    return 2 * nbytes / sec / 1e9


def release() -> None:
    if available()[0]:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def launches_for(seconds_per_launch: float, round_s: float = 0.004) -> int:
    """K launches per round so a round lasts at least ``round_s`` (as the tuner's calibration)."""
    return max(1, min(2000, math.ceil(round_s / max(seconds_per_launch, 1e-7))))


def main(argv: Sequence[str] | None = None) -> int:
    """``--inductor NAME:SHAPE ...``: compile each op with torch.compile once (run under
    ``TORCH_LOGS=output_code`` to print Inductor's generated code). ``--profile NAME:SHAPE:CONFIG``:
    run our kernel (config key) and the torch.compile peer three times each, for ``ncu``."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--inductor", nargs="*", default=[])
    ap.add_argument("--profile", nargs="*", default=[])
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    import mlx.core as mx

    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.spec import parse_config_key, parse_shape
    from kernelfleet.worker.backends import detect_backend

    for item in args.inductor:
        name, shape = item.split(":")
        spec = get_spec(name)
        inputs = spec.make_inputs(parse_shape(shape), args.dtype, 0)
        mx.eval(inputs)
        print(f"==== {name} {shape} {args.dtype}: torch.compile (Inductor) ====", flush=True)
        peers(name, inputs)["torch.compile"]()
        torch.cuda.synchronize()
    be = detect_backend()
    for item in args.profile:
        name, shape_text, key = item.split(":")
        spec, shape = get_spec(name), parse_shape(shape_text)
        inputs = spec.make_inputs(shape, args.dtype, 0)
        mx.eval(inputs)
        ours = be.build(spec, parse_config_key(key), shape, args.dtype)
        compiled = peers(name, inputs)["torch.compile"]
        for _ in range(3):
            mx.eval(ours(inputs))
            mx.synchronize()
            compiled()
            torch.cuda.synchronize()
        print(f"profiled {name} {shape_text} ours={key} and torch.compile", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
