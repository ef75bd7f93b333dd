"""The model-shaped step, in the process whose environment holds one setting of MLX's runtime knobs
(MLX reads them once, at their first use: see :mod:`.knobs`). Run as
``python -m kernelfleet.worker.runtime_settings.step`` with a JSON request on stdin; writes one
JSON line on stdout::

    request: {"config": {...config.json...}, "dtype": "bfloat16", "quant": [4, 64] | null,
              "workloads": ["prefill:2048", "decode:1", "decode:8"], "context": 512, "steps": 64,
              "reps": 3}
    answer:  {"seconds": {"decode:1": 0.0041, ...}, "logits": {"decode:1": "<sha256>", ...},
              "device": "NVIDIA H100 80GB HBM3", "backend": "cuda", "arch": "sm_90", "mlx_version": "0.32.4"}

Per workload: one untimed measurement (kernels built, caches warm), then the median of ``reps``
(:func:`kernelfleet.kernels.patch.model_timing.prefill_s` / ``decode_s``). ``logits``: the SHA-256
of the workload's own logits as float32 bytes (bfloat16 and float16 widen exactly): a prefill's at
up to 64 evenly spaced positions, a decode's over 4 greedy steps after the ``context`` prefill.
Equal hashes: bit-identical logits.

Imports only mlx, mlx-lm, numpy and kernelfleet's kernels, and those only in :func:`main` (the parent
imports :func:`parse_workload` from here). :func:`main` imports mlx-lm's model modules without
running ``mlx_lm/__init__.py`` (:func:`models_only`), which imports transformers: 0.5 s to start a
step instead of 3-18 s on this project's 2-core CPU host, paid once per process and setting.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import statistics
import sys
import types
from typing import TYPE_CHECKING, Any

from .knobs import TEST_ONLY_DTYPE

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

CHECKED_POSITIONS = 64
CHECKED_STEPS = 4


def parse_workload(text: str) -> tuple[str, int]:
    """``prefill:N`` (N tokens, batch 1) or ``decode:B`` (batch B): (kind, N or B)."""
    kind, _, n = text.partition(":")
    if kind not in ("prefill", "decode") or not n.isdigit() or int(n) < 1:
        raise ValueError(f"workload {text!r} is not prefill:TOKENS or decode:BATCH (a positive number)")
    return kind, int(n)


def models_only() -> None:
    """Register ``mlx_lm`` as a bare package (its path, not its ``__init__``), so importing
    ``mlx_lm.models.*`` loads only the model code (which imports nothing else of mlx-lm)."""
    if "mlx_lm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed: the import below says so
    package = types.ModuleType("mlx_lm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules["mlx_lm"] = package


def _sha(arrays: list[mx.array]) -> str:
    import mlx.core as mx
    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        h.update(np.asarray(a.astype(mx.float32)).tobytes())
    return h.hexdigest()


def logits_sha(model: nn.Module, workload: str, context: int) -> str:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from kernelfleet.kernels.patch.model_build import TOKEN_IDS
    from kernelfleet.kernels.patch.model_timing import primed

    kind, n = parse_workload(workload)
    if kind == "prefill":
        tokens = mx.random.randint(0, TOKEN_IDS, (1, n), key=mx.random.key(n))
        logits = model(tokens, cache=make_prompt_cache(model))
        at = mx.array(np.unique(np.linspace(0, n - 1, min(n, CHECKED_POSITIONS)).astype(np.int32)))
        return _sha([logits[:, at, :]])
    cache = primed(model, n, context)
    y, out = mx.zeros((n, 1), mx.int32), []
    for _ in range(CHECKED_STEPS):
        logits = model(y, cache=cache)[:, -1, :]
        out.append(logits)
        y = mx.argmax(logits, axis=-1).astype(mx.int32)[:, None]
    return _sha(out)


def seconds(model: nn.Module, workload: str, context: int, steps: int) -> float:
    from kernelfleet.kernels.patch.model_timing import decode_s, prefill_s, without_gc

    kind, n = parse_workload(workload)
    if kind == "prefill":
        return without_gc(lambda: prefill_s(model, n))
    return without_gc(lambda: decode_s(model, n, context, steps))


def measure(request: dict[str, Any]) -> dict[str, Any]:
    from kernelfleet.chips import detect_chip
    from kernelfleet.kernels.patch.model_build import build

    dtype = os.environ.get(TEST_ONLY_DTYPE) or request["dtype"]
    quant = tuple(request["quant"]) if request.get("quant") else None
    model = build(request["config"], dtype, quant)
    out: dict[str, Any] = {"seconds": {}, "logits": {}}
    for w in request["workloads"]:
        out["logits"][w] = logits_sha(model, w, request["context"])
        seconds(model, w, request["context"], request["steps"])  # untimed: kernels built, caches warm
        out["seconds"][w] = statistics.median(seconds(model, w, request["context"], request["steps"])
                                              for _ in range(request["reps"]))
    chip = detect_chip()
    out.update(device=chip.name, backend=chip.backend, arch=chip.arch, mlx_version=chip.mlx_version)
    return out


def main() -> int:
    models_only()
    print(json.dumps(measure(json.loads(sys.stdin.read()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
