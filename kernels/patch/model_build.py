"""mlx-lm models built from a ``config.json`` with random weights, at a dtype and quantized as
``mlx_lm.convert`` quantizes: the models ``benchmarks/model.py`` and the runtime-settings search
(``kernelfleet.worker.runtime_settings``) measure.

Imports only mlx, mlx-lm (lazily, the architecture's module) and this package: runs on a bare GPU host.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .model_shapes import ARCHITECTURES

TINY = {  # CPU end-to-end checks: the same architectures, small
    "llama": {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
              "rope_theta": 500000.0, "tie_word_embeddings": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 128, "num_hidden_layers": 2,
                  "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 32, "num_experts": 32, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], "moe_intermediate_size": 64, "rms_norm_eps": 1e-6,
                  "vocab_size": 256, "rope_theta": 1e6, "tie_word_embeddings": False,
                  "max_position_embeddings": 4096, "norm_topk_prob": True},
}
TOKEN_IDS = 200  # random prompts draw token ids below this (every vocabulary here is larger)

Quant = tuple[int, int] | None  # (bits, group size) of a quantized model; None: not quantized


def load_config(path: str | Path, layers: int = 0) -> dict[str, Any]:
    """A model's ``config.json``, with at most ``layers`` decoder layers (0: the config's)."""
    config: dict[str, Any] = json.loads(Path(path).read_text())
    if layers:
        config["num_hidden_layers"] = min(layers, int(config["num_hidden_layers"]))
    return config


def parse_dtype(name: str, group: int = 64) -> Quant:
    """``bf16`` (the model's dtype: None), ``4bit`` or ``8bit`` (at ``group``)."""
    if name == "bf16":
        return None
    if name in ("4bit", "8bit"):
        return (int(name[0]), group)
    raise ValueError(f"{name!r} is not bf16, 4bit or 8bit")


def label(quant: Quant, dtype: str) -> str:
    return dtype if quant is None else f"{quant[0]}-bit group {quant[1]}"


def model_and_config(config: dict[str, Any], dtype: str, quant: Quant) -> tuple[nn.Module, dict[str, Any]]:
    """The mlx-lm model of ``config`` (random weights, unevaluated) and the config.json mlx-lm would
    write for it, quantized as ``mlx_lm.convert`` does (``mlx_lm.utils.quantize_model``, not imported
    for its transformers import): layers whose input features are not a multiple of the group size
    stay in full precision, and the architecture's own per-layer choices (``quant_predicate``, e.g.
    Qwen3-MoE's router in 8 bits) become per-layer overrides in ``quantization``."""
    module = importlib.import_module(f"mlx_lm.models.{ARCHITECTURES[config['model_type']].mlx_module}")
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    if quant is None:
        return model, config
    bits, group = quant
    quantization: dict[str, Any] = {"group_size": group, "bits": bits, "mode": "affine"}
    own = getattr(model, "quant_predicate", None)

    def predicate(path: str, m: nn.Module) -> bool | dict[str, Any]:
        if not hasattr(m, "to_quantized") or m.weight.shape[-1] % group:
            return False
        choice = own(path, m) if own is not None else True
        if isinstance(choice, dict):
            quantization[path] = choice
        return choice

    nn.quantize(model, group, bits, class_predicate=predicate)
    return model, {**config, "quantization": quantization}


def quantized_config(config: dict[str, Any], dtype: str, quant: Quant) -> dict[str, Any]:
    """``config`` with the ``quantization`` mlx-lm writes for it (nothing is evaluated)."""
    return model_and_config(config, dtype, quant)[1]


def build(config: dict[str, Any], dtype: str, quant: Quant = None) -> nn.Module:
    """The model, its weights evaluated (seeded: the same weights in every process)."""
    model = model_and_config(config, dtype, quant)[0]
    mx.eval(model.parameters())
    return model
