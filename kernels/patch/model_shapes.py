"""From a model's ``config.json`` (mlx-lm / Hugging Face) to the catalog kernel calls it makes.

:func:`derive` maps the config's dimensions onto the calls an mlx-lm model of that architecture makes
during decode and prefill, as ``kernel -> [shape, ...]`` (each kernel's own shape convention, see
``kernelfleet kernels``). Token counts: decode batches (one new token per sequence: ``rows = batch``)
and prefill lengths (one sequence: ``rows = length``). :func:`kernelfleet.kernels.patch.model_patch.patch`
routes the same calls at run time, so a campaign from this plan tunes exactly what the patched model
looks up in the profile. Imports only the standard library and the catalog (mlx, numpy): it runs on a
bare GPU host (``benchmarks/model.py``).

Only architectures whose mlx-lm module was read are mapped (:data:`ARCHITECTURES`); any other
``model_type`` is refused with the fields that could not be mapped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..catalog import get_spec
from ..spec import BadShape, Shape, format_shape
from . import model_linears
from .model_quant import PROJECTIONS

DEFAULT_DECODE = (1, 8, 32)
DEFAULT_PREFILL = (512, 2048)
# quantized matmuls also at the token counts of a speculative draft-verify call (1-3 draft tokens and
# the last accepted token: mlx-lm drafts 2 by default in its API, 3 in its CLI), which cover decode
# batches 2-4: MLX's quantized matmul changes kernel at small M, so each of them gets its own entry
DEFAULT_VERIFY = (2, 3, 4)
INT4_GROUP = 64  # the catalog's int4_dequantize: mx.quantize's layout, bits 4, group size 64


@dataclass(frozen=True)
class Architecture:
    """How one mlx-lm architecture computes: which sub-computations exist and their options."""

    mlx_module: str  # mlx_lm.models.<module>
    activation: str = "swiglu"  # the dense MLP's catalog kernel
    nn_norms: bool = True  # mlx's nn.RMSNorm, and the residual add + post-attention norm of llama's block
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys (Qwen3)
    moe: bool = False
    experts_field: str = "num_experts"
    expert_size_field: str = "intermediate_size"
    moe_block: str = "mlp"  # the sparse block's attribute in a decoder layer
    tied_head: bool | None = True  # tie_word_embeddings when the config does not say (None: always tied)
    joined_qkv: bool = False  # mlx-lm's llama Attention: q, k, v joined by the patch (model_quant)
    sparse_joined_qkv: bool = False  # q, k, v joined in sparse layers (Qwen3-MoE's block: model_moe_layer)


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("llama", joined_qkv=True),
    "mistral": Architecture("llama", joined_qkv=True),  # mlx-lm maps mistral onto llama
    "qwen2": Architecture("qwen2"),
    "qwen3": Architecture("qwen3", qk_norm=True),
    "qwen3_moe": Architecture("qwen3_moe", qk_norm=True, moe=True, experts_field="num_experts",
                              expert_size_field="moe_intermediate_size", sparse_joined_qkv=True),
    "mixtral": Architecture("mixtral", moe=True, experts_field="num_local_experts",
                            expert_size_field="intermediate_size", moe_block="block_sparse_moe",
                            tied_head=False),
    # Gemma 3: GeGLU (tanh GELU); its RMSNorm scales by 1 + weight (its own class), so norms keep their code.
    # Its checkpoints hold no lm_head: mlx-lm ties the head to the embedding whatever the config says
    "gemma3_text": Architecture("gemma3_text", activation="geglu", nn_norms=False, tied_head=None),
}

# fields every mapped architecture needs, and the names other model families use for them (named in
# the refusal of an unknown architecture, so the user sees which of their fields had no meaning here)
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")
FOREIGN_SIZE_FIELDS = ("n_embd", "n_inner", "n_head", "n_layer", "d_model", "ffn_dim", "n_heads",
                       "d_ff", "num_heads", "num_layers", "hidden_dim", "multiple_of", "n_kv_heads",
                       "ffn_hidden_size", "kv_channels", "num_query_groups")


class ModelConfigError(ValueError):
    """A config that cannot be mapped onto catalog kernel calls; the message says why."""


@dataclass
class ModelPlan:
    model_type: str
    dims: dict[str, int]
    kernel_shapes: dict[str, list[str]]
    dtypes: list[str]
    sites: dict[str, list[str]]  # kernel -> where in the model it is called
    notes: list[str] = field(default_factory=list)  # what is left out, and why

    @property
    def job_count(self) -> int:
        return sum(len(s) for s in self.kernel_shapes.values()) * len(self.dtypes)


def load_config(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelConfigError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{p}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{p}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: expected a JSON object (a model's config.json)")
    return data


def _int(config: dict[str, Any], name: str, missing: list[str], default: int | None = None) -> int:
    value = config.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        missing.append(name if name not in config else f"{name} (={value!r}, not a positive integer)")
        return 0
    return value


def _refuse_unknown(config: dict[str, Any], model_type: object) -> ModelConfigError:
    absent = [f for f in REQUIRED if f not in config]
    foreign = [f for f in FOREIGN_SIZE_FIELDS if f in config]
    parts = [f"architecture {model_type!r} is not mapped onto catalog kernels "
             f"(mapped: {', '.join(sorted(ARCHITECTURES))})"]
    if foreign:
        parts.append(f"fields that could not be mapped: {', '.join(foreign)}")
    if absent:
        parts.append(f"fields not in this config: {', '.join(absent)}")
    return ModelConfigError("; ".join(parts))


def model_dtype(config: dict[str, Any]) -> str:
    value = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return value if value in ("float32", "float16", "bfloat16") else "bfloat16"


def derive(config: dict[str, Any], decode: Sequence[int] = DEFAULT_DECODE,
           prefill: Sequence[int] = DEFAULT_PREFILL, dtypes: Sequence[str] | None = None,
           verify: Sequence[int] = DEFAULT_VERIFY) -> ModelPlan:
    """Every catalog kernel call of the model, with its shapes at these token counts (``verify``: the
    tokens of a speculative draft-verify call, planned for the quantized matmuls only)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise _refuse_unknown(config, model_type)
    arch = ARCHITECTURES[model_type]
    if any(t <= 0 for t in (*decode, *prefill, *verify)) or not (decode or prefill):
        raise ModelConfigError("token counts must be positive, and at least one is needed")
    missing: list[str] = []
    hidden = _int(config, "hidden_size", missing)
    heads = _int(config, "num_attention_heads", missing)
    kv_heads = _int(config, "num_key_value_heads", missing, default=config.get("num_attention_heads"))
    head_dim = _int(config, "head_dim", missing, default=(hidden // heads) if heads else None)
    inter = _int(config, "intermediate_size", missing)
    dims = {"hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": head_dim}
    experts = topk = expert_size = 0
    if arch.moe:
        experts = _int(config, arch.experts_field, missing)
        topk = _int(config, "num_experts_per_tok", missing)
        expert_size = _int(config, arch.expert_size_field, missing)
        dims.update(experts=experts, experts_per_token=topk, expert_intermediate_size=expert_size)
    if missing:
        raise ModelConfigError(f"{model_type}: could not map these fields: {', '.join(missing)}")

    notes: list[str] = []
    calls: dict[str, list[Shape]] = {}
    sites: dict[str, list[str]] = {}

    def add(kernel: str, site: str, shapes: list[Shape]) -> None:
        spec = get_spec(kernel)
        for s in shapes:
            try:
                spec.validate_shape(s)
            except BadShape as e:
                notes.append(f"{kernel} {format_shape(s)} ({site}) left out: {e}")
                continue
            if s not in calls.setdefault(kernel, []):
                calls[kernel].append(s)
        if site not in sites.setdefault(kernel, []):
            sites[kernel].append(site)

    rows = [*decode, *prefill]
    if arch.nn_norms:
        add("rmsnorm", "input_layernorm, final norm", [(t, hidden) for t in rows])
        add("add_rmsnorm", "residual add + post_attention_layernorm", [(t, hidden) for t in rows])
    else:
        notes.append(f"{model_type}'s RMSNorm (weight + 1, its own module) is not routed: norms left out")
    if arch.qk_norm:
        add("rmsnorm", "q_norm, k_norm (per head)",
            [(t * h, head_dim) for t in rows for h in (heads, kv_heads)])
    _rope(config, add, notes, decode, prefill, heads, kv_heads, head_dim)
    sparse_step = config.get("decoder_sparse_step", 1)
    dense_mlp = not arch.moe or bool(config.get("mlp_only_layers")) or sparse_step != 1
    if dense_mlp:
        add(arch.activation, "MLP activation", [(t, inter) for t in rows])
    if arch.moe:
        add("swiglu", "expert activation (tokens x experts per token)",
            [(t * topk, expert_size) for t in rows])
        add("topk_gating_softmax", f"router softmax + top-{topk}", [(t, experts) for t in rows])
        add("moe_combine", "weighted sum of the experts' outputs", [(t, topk, hidden) for t in rows])
        if topk != 2 and "topk_gating_softmax" in calls:
            notes.append(f"topk_gating_softmax is tuned at its default k=2; this model routes to k={topk} "
                         "(the config space does not depend on k; its timing may)")
    _int4(config, add, notes, dims, arch, hidden, heads, kv_heads, head_dim, inter, experts, expert_size,
          dense_mlp)
    rows_q = sorted({*decode, *verify, *prefill})
    model_linears.plan_quantized(config, linear_layers(config, arch, dims), add, notes, rows_q)
    chosen = list(dtypes) if dtypes else [model_dtype(config)]
    kernel_shapes = {k: [format_shape(s) for s in v] for k, v in calls.items() if v}
    return ModelPlan(model_type, dims, kernel_shapes, chosen,
                     {k: v for k, v in sites.items() if k in kernel_shapes}, notes)


def linear_layers(config: dict[str, Any], arch: Architecture, dims: dict[str, int]
                  ) -> list[model_linears.Linear]:
    """Every linear layer of the mlx-lm model (path, in features, out features), and the layers
    mlx-lm computes as something else (MoE experts, a tied head) as ``model_linears.Other``."""
    hidden, heads, kv, hd = (dims[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                               "head_dim"))
    layers: list[model_linears.Linear] = []
    sparse_step = config.get("decoder_sparse_step", 1)
    dense_only = config.get("mlp_only_layers") or []
    for i in range(int(config["num_hidden_layers"])):
        at = f"model.layers.{i}"
        sparse = arch.moe and i not in dense_only and isinstance(sparse_step, int) and sparse_step > 0 \
            and (i + 1) % sparse_step == 0
        qkv = f"{at}.qkv" if arch.joined_qkv or (arch.sparse_joined_qkv and sparse) else ""
        block = f"{at}.{arch.moe_block}"
        # the MoE layer block (model_moe_layer) joins q/k/v only where it takes the layer: o_proj, the router
        # and the experts quantized
        needs = (f"{at}.self_attn.o_proj", f"{block}.gate",
                 *(f"{block}.switch_mlp.{name}" for name in PROJECTIONS)) \
            if arch.sparse_joined_qkv and sparse else ()
        layers += [model_linears.Linear(f"{at}.self_attn.{name}", hidden, width, join=qkv, join_needs=needs)
                   for name, width in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd))]
        layers.append(model_linears.Linear(f"{at}.self_attn.o_proj", heads * hd, hidden))
        if sparse:
            layers.append(model_linears.Linear(f"{block}.gate", hidden, dims["experts"]))
            size, e, per = dims["expert_intermediate_size"], dims["experts"], dims["experts_per_token"]
            layers += [model_linears.Linear(f"{block}.switch_mlp.{name}", k, n, model_linears.EXPERTS, e, per)
                       for name, k, n in zip(PROJECTIONS, (hidden, hidden, size), (size, size, hidden),
                                             strict=True)]
        else:
            inter = dims["intermediate_size"]
            gate_up = f"{at}.mlp.gate_up"
            layers += [model_linears.Linear(f"{at}.mlp.gate_proj", hidden, inter, join=gate_up),
                       model_linears.Linear(f"{at}.mlp.up_proj", hidden, inter, join=gate_up),
                       model_linears.Linear(f"{at}.mlp.down_proj", inter, hidden)]
    tied = arch.tied_head is None or bool(config.get("tie_word_embeddings", arch.tied_head))
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and vocab > 0:
        layers.append(model_linears.Linear("lm_head", hidden, vocab, model_linears.TIED if tied else ""))
    return layers


def _rope(config: dict[str, Any], add: Any, notes: list[str], decode: Sequence[int], prefill: Sequence[int],
          heads: int, kv_heads: int, head_dim: int) -> None:
    scaling = config.get("rope_scaling")
    kind = None
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind not in (None, "default"):
        notes.append(f"rope left out: rope_scaling {kind!r} needs a frequency table the catalog rope "
                     "does not take (the built-in stays)")
        return
    if config.get("rope_traditional") or float(config.get("partial_rotary_factor", 1.0)) != 1.0:
        notes.append("rope left out: traditional or partial rotary embedding (the catalog rope rotates "
                     "the whole head dim, half split)")
        return
    shapes = [(b * h, 1, head_dim) for b in decode for h in (heads, kv_heads)]
    shapes += [(h, n, head_dim) for n in prefill for h in (heads, kv_heads)]
    add("rope", "queries and keys (heads x positions x head_dim)", shapes)


def _int4(config: dict[str, Any], add: Any, notes: list[str], dims: dict[str, int], arch: Architecture,
          hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, experts: int, expert_size: int,
          dense_mlp: bool) -> None:
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict):
        return
    bits, group = q.get("bits"), q.get("group_size")
    if bits != 4 or group != INT4_GROUP:
        notes.append(f"int4_dequantize left out: the model is quantized with bits={bits}, "
                     f"group_size={group}; the catalog kernel takes bits=4, group_size={INT4_GROUP}")
        return
    dims["quantization_group_size"] = group
    weights = [(heads * head_dim, hidden), (kv_heads * head_dim, hidden), (hidden, heads * head_dim)]
    if dense_mlp:
        weights += [(inter, hidden), (hidden, inter)]
    if arch.moe:
        weights += [(experts * expert_size, hidden), (experts * hidden, expert_size)]
    add("int4_dequantize", "quantized weights (out x in), where a weight is dequantized before a matmul "
        "(mlx-lm's quantized matmul dequantizes inside the matmul)", weights)
