"""The host floor of a decode step: the same model graph with tiny dimensions, whose kernels are too
small to matter, so its step time is what MLX's host work costs per step; beside it the model itself.
A model whose step is near its floor is host-bound: faster kernels cannot speed it up, fewer or cheaper
calls can.

    python benchmarks/decode_floor.py --config tests/data/models/llama-3-8b.json --dtypes 4bit,bf16
    python benchmarks/decode_floor.py --tiny      # CPU: the path end to end, small

Per model and dtype: mlx-lm's decode loop (``model_timing.decode_s``: the next step queued while the
GPU runs this one) at batch 1 after ``--context`` tokens, median of ``--rounds`` rounds, for the model
(``--layers`` decoder layers) and for the same config with hidden 256, intermediate 512, 2 heads,
1 KV head and a vocabulary of 1,024 (the same modules, the same ops, the same count of each).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import mlx.core as mx

from kernelfleet.kernels.patch.model_build import TINY, build, load_config, parse_dtype
from kernelfleet.kernels.patch.model_timing import decode_s, without_gc

SMALL = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
         "vocab_size": 1024}


def floor_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with tiny dimensions (MoE experts' own sizes too, where it has them)."""
    small = {**config, **SMALL}
    if "moe_intermediate_size" in config:
        small["moe_intermediate_size"] = 256
    return small


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="tests/data/models/llama-3-8b.json")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dtypes", default="4bit,bf16")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tiny", action="store_true", help="a tiny model on CPU: the path end to end")
    args = p.parse_args(argv)
    config = load_config(args.config, args.layers)
    if args.tiny:
        config = dict(TINY[config["model_type"]])
        args.context, args.steps, args.rounds = 8, 4, 2
    dtype = "float32" if args.tiny else "bfloat16"
    print(f"device: {mx.default_device()}; mlx {mx.__version__}; decode batch 1 after {args.context} tokens, "
          f"{args.steps} steps a round, median of {args.rounds} rounds", flush=True)
    for name, c in (("model", config), ("host floor (hidden 256)", floor_config(config))):
        for dt in args.dtypes.split(","):
            model = build(c, dtype, parse_dtype(dt))
            ms = [1e3 * without_gc(lambda m=model: decode_s(m, 1, args.context, args.steps))
                  for _ in range(args.rounds)]
            print(f"{config['model_type']} {config['num_hidden_layers']} layers {name:24} {dt:5} "
                  f"{statistics.median(ms):7.3f} ms a step (rounds {min(ms):.3f}-{max(ms):.3f})", flush=True)
            del model
            mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
