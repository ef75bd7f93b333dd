"""MLX's own runtime settings, chosen per chip by KernelFleet's search, against MLX's defaults: the
Llama-3-8B shape (bf16 and 4-bit) and the Qwen3-30B-A3B shape, at prefill 2048 and decode batch 1
and 8, in one run, paired, logits compared bit for bit.

    # GPU host (PYTHONPATH as benchmarks/model.py says); resumable: run it again until it says done
    python benchmarks/runtime_settings.py --settings benchmarks/results/h100_runtime_settings.json \\
        --out benchmarks/results/h100_runtime_settings.txt
    python benchmarks/runtime_settings.py --tiny      # CPU: tiny configs, the whole path end to end

1. *tune*: for each model not yet in ``--settings``, the search of ``kernelfleet settings tune``
   (:mod:`kernelfleet.worker.runtime_settings.search`: the knobs this MLX reads on this backend, each
   setting in a fresh process, coarse grid, refine, confirm, ``--budget`` seconds a model), written to
   ``--settings`` after each model. No model's search reaches past ``--max-seconds`` (one 10-minute
   command; a model with less than half its budget left waits for the next command); run again to go
   on. A model whose search the budget cut short is searched again. ``--models`` picks some.
2. *run*, once every model has its entries: per model, rounds of fresh processes (each measures all
   workloads): MLX's defaults, each distinct chosen setting, and the defaults again (the control),
   the order rotating. Per row: tokens/s at the defaults and at the row's chosen setting (each
   side's median), the paired ratio with its 95 % bootstrap interval and verdict (the search's:
   faster or slower only over 3+ rounds and beyond the control's interval too), the control's, and
   whether the row's logits were bit-identical to the defaults' in every process. A row whose
   chosen setting is MLX's defaults reads "defaults kept" (the search found nothing faster beyond
   the noise).

Models: the committed configs in ``tests/data/models/`` with ``--layers`` decoder layers (default 8),
random weights, quantized as ``mlx_lm.convert`` does. Imports only mlx, mlx-lm, numpy and
kernelfleet's ``kernels`` and ``worker``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from kernelfleet import runtime_settings_file as settings_file
from kernelfleet.chips import gpu_backend_available
from kernelfleet.kernels.patch.model_build import TINY, load_config, parse_dtype
from kernelfleet.worker.runtime_settings.knobs import knobs
from kernelfleet.worker.runtime_settings.search import Objective, against_control, search
from kernelfleet.worker.runtime_settings.sides import CONTROL, STOCK, compare, key, measure_rounds
from kernelfleet.worker.runtime_settings.step import parse_workload

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"llama-bf16": ("llama-3-8b", "bf16"), "llama-4bit": ("llama-3-8b", "4bit"),
          "qwen3-bf16": ("qwen3-30b-a3b", "bf16")}


def models(args: argparse.Namespace) -> list[tuple[dict[str, Any], str]]:
    """``--models``, in that order; ``--tiny``: tiny configs of the same architectures (MLX's CPU
    gather_mm, the MoE experts', takes float32 only: the tiny MoE runs in float32)."""
    out = []
    for name in args.models:
        config, dtype = MODELS[name]
        if args.tiny:
            out.append((dict(TINY["llama" if config.startswith("llama") else "qwen3_moe"]), dtype))
        else:
            out.append((load_config(ROOT / f"tests/data/models/{config}.json", args.layers), dtype))
    return out


def objective(config: dict[str, Any], dtype: str, args: argparse.Namespace) -> Objective:
    compute = "float32" if args.tiny and config["model_type"] == "qwen3_moe" else "bfloat16"
    return Objective(config, compute, parse_dtype(dtype), tuple(args.workload), args.context, args.steps,
                     args.reps)


def searched(body: dict[str, Any], config: dict[str, Any], label: str, workloads: list[str]) -> bool:
    """Every workload has an entry that the budget did not cut short."""
    have = {e["workload"]: e for e in settings_file.select(body, settings_file.shape_key(config), label)}
    return all(w in have and not have[w].get("note", "").startswith("budget spent") for w in workloads)


def tune(args: argparse.Namespace, path: Path) -> int:
    """Search the models not yet (fully) in ``path``; how many are left. Each model's budget is
    ``--budget`` or what is left of ``--max-seconds``, whichever is less."""
    body = settings_file.read(path) if path.exists() else {"schema": settings_file.SCHEMA, "entries": []}
    todo = [(c, d) for c, d in models(args)
            if not searched(body, c, objective(c, d, args).label, args.workload)]
    table = knobs(gpu_backend_available() or "cpu", str(getattr(mx, "__version__", "unknown")))
    stop = time.monotonic() + args.max_seconds
    for i, (config, dtype) in enumerate(todo):
        budget = min(args.budget, stop - time.monotonic())
        if i and budget < args.budget / 2:
            print(f"stopped after {args.max_seconds:.0f} s with {len(todo) - i} models left: run again")
            return len(todo) - i
        shape, goal = settings_file.shape_key(config), objective(config, dtype, args)
        print(f"tuning {shape} {goal.label} ({', '.join(k.name for k in table)}), budget {budget:.0f} s",
              flush=True)
        choices, device = search(goal, table, budget_s=budget, rounds=args.rounds,
                                 log=lambda line: print(line, flush=True))
        body.update(chip=device["device"], backend=device["backend"], arch=device["arch"],
                    mlx_version=device["mlx_version"])
        body = settings_file.merge(body, [c.entry(shape, goal.label) for c in choices.values()])
        settings_file.write(body, path)
    return 0


def run(args: argparse.Namespace, path: Path, emit: Any) -> None:
    body = settings_file.read(path)
    for config, dtype in models(args):
        shape, label = settings_file.shape_key(config), objective(config, dtype, args).label
        chosen = {e["workload"]: e["settings"] for e in settings_file.select(body, shape, label)}
        candidates = list({key(s): s for s in chosen.values() if s}.values())
        rounds = measure_rounds(objective(config, dtype, args).request(), candidates, args.run_rounds,
                                deadline=float("inf"))
        if not emit.started:
            d = rounds.device
            emit(f"device: {d['device']} ({d['backend']}, {d['arch']}); mlx {d['mlx_version']}; "
                 f"settings chosen on {body.get('chip')} (mlx {body.get('mlx_version')}); "
                 f"{args.run_rounds} rounds, one fresh process per side and round")
        emit(f"\n{shape} {label} ({rounds.count} rounds, sides: defaults, "
             f"{', '.join(key(c) for c in candidates) or 'no other'}, defaults again)")
        for w in args.workload:
            tokens = parse_workload(w)[1]
            base = tokens / statistics.median(rounds.seconds[STOCK][w])
            ctl = compare(rounds, CONTROL, w)
            noise = f"control {ctl.ratio:.3f}x [{ctl.low:.3f}, {ctl.high:.3f}]"
            if not chosen.get(w):
                emit(f"  {w:13} defaults {base:10.1f} tok/s   defaults kept (nothing faster beyond the noise)"
                     f"   {noise}")
                continue
            c = compare(rounds, key(chosen[w]), w)
            speed = tokens / statistics.median(rounds.seconds[key(chosen[w])][w])
            same = "logits bit-identical" if c.bit_identical else "LOGITS DIFFER"
            emit(f"  {w:13} defaults {base:10.1f} tok/s   {key(chosen[w])}: {speed:10.1f} tok/s   "
                 f"{c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] {against_control(c, ctl)}   {noise}   {same}")


class Emit:
    def __init__(self) -> None:
        self.lines: list[str] = []

    @property
    def started(self) -> bool:
        return bool(self.lines)

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny configs and sizes (CPU check)")
    p.add_argument("--settings", help="the runtime-settings file searched into and run from "
                   "(default: runtime_settings.json in --out's folder, or a temporary one with --tiny)")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers built (0: the config's)")
    p.add_argument("--workload", nargs="+", help="default prefill:2048 decode:1 decode:8")
    p.add_argument("--context", type=int, help="tokens in the cache before decode (default 512)")
    p.add_argument("--steps", type=int, help="decode steps per measurement (default 64)")
    p.add_argument("--reps", type=int, help="measurements per process (default 3)")
    p.add_argument("--rounds", type=int, help="search: rounds per stage (default and least: 3)")
    p.add_argument("--run-rounds", type=int, help="run: rounds (default 5)")
    p.add_argument("--budget", type=float, help="search: seconds per model (default 480)")
    p.add_argument("--max-seconds", type=float, default=540.0,
                   help="search: no model's budget reaches past this long (one 10-minute command)")
    p.add_argument("--out", help="also write the run's report here")
    args = p.parse_args(argv)
    args.models = args.models.split(",")
    unknown = set(args.models) - set(MODELS)
    if unknown:
        p.error(f"--models: {', '.join(sorted(unknown))} not among {', '.join(MODELS)}")
    small = args.tiny
    args.workload = args.workload or (["prefill:32", "decode:1", "decode:2"] if small else
                                      ["prefill:2048", "decode:1", "decode:8"])
    args.context = args.context or (16 if small else 512)
    args.steps = args.steps or (4 if small else 64)
    args.reps = args.reps or (1 if small else 3)
    args.rounds = args.rounds or 3
    if args.rounds < 3:
        p.error("--rounds: at least 3 (fewer give no interval)")
    args.run_rounds = args.run_rounds or (2 if small else 5)
    args.budget = args.budget or (20.0 if small else 480.0)
    for w in args.workload:
        try:
            parse_workload(w)
        except ValueError as e:
            p.error(str(e))
    if args.settings:
        path = Path(args.settings)
    elif args.out:
        path = Path(args.out).parent / "runtime_settings.json"
    elif small:
        import tempfile

        path = Path(tempfile.mkdtemp()) / "runtime_settings.json"
    else:
        p.error("give --settings FILE (searched into, then run from) or --out")
    if tune(args, path):
        print("not run: the search is not finished (run the same command again)")
        return 0
    emit = Emit()
    run(args, path, emit)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(emit.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
