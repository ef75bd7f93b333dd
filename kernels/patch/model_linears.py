"""A quantized model's linear layers -> the ``quantized_matmul`` and ``gather_quantized_matmul`` calls it
makes (:func:`kernelfleet.kernels.patch.model_shapes.derive`).

mlx-lm writes a quantized model's format into ``config.json`` as ``quantization`` (older exports also
as ``quantization_config``): the default ``bits``, ``group_size`` and ``mode``, and per-layer
overrides keyed by the module's path, e.g. ``"model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}``
(Qwen3-MoE's router) or ``false`` (left in full precision). mlx-lm's loader quantizes a layer by its
override, else by the default, and leaves a layer whose input features are not a multiple of the
group size in full precision. Each quantized linear layer then calls ``quantized_matmul`` at
``M x K x N x bits x group_size`` for every token count M the model meets, and each quantized MoE
expert projection (mlx-lm's ``SwitchLinear``) ``gather_quantized_matmul`` at ``T x K x N x E x bits x
group_size``, T = tokens x experts per token: sorted by expert where ``SwitchGLU`` sorts the pairs
(T >= 64), in the router's order below (decode), where the kernel's qmv paths take them as they come
(its decode form, which the Qwen3-MoE decoder layer block and a ``SwitchLinear`` patched alone run).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..spec import Shape
from .model_quant import GATHER, KERNEL, MODE, format_refusal

EXPERTS = "experts"  # mlx-lm's SwitchLinear: mx.gather_qmm once quantized
TIED = "tied"  # the LM head computed as embed_tokens.as_linear


class Linear(NamedTuple):
    path: str  # the module's path in the mlx-lm model, as config.json's overrides name it
    k: int  # input features
    n: int  # output features
    other: str = ""  # EXPERTS or TIED: a layer mlx-lm computes without a QuantizedLinear
    experts: int = 0  # EXPERTS: how many
    per_token: int = 1  # EXPERTS: experts each token is routed to
    join: str = ""  # layers with the same label run as one quantized matmul where they share a format
    # and where these layers are quantized in a format the kernels take (the layer block that joins them
    # takes the layer only then: e.g. Qwen3-MoE's o_proj, router and experts)
    join_needs: tuple[str, ...] = ()


def _where(paths: Sequence[str]) -> str:
    """``model.layers.*.mlp.gate_proj x32``: paths with their layer index folded."""
    folded: dict[str, list[str]] = {}
    for p in paths:
        folded.setdefault(re.sub(r"\.\d+\.", ".*.", p), []).append(p)
    return ", ".join(f"{k} x{len(ps)}" if len(ps) > 1 else ps[0] for k, ps in folded.items())


def plan_quantized(config: dict[str, Any], layers: Sequence[Linear],
                   add: Callable[[str, str, list[Shape]], None], notes: list[str], rows: Sequence[int]
                   ) -> None:
    """``add`` the ``quantized_matmul`` shapes of every quantized linear layer at the token counts
    ``rows``; what is not planned, and why, goes to ``notes``."""
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict) or "bits" not in q:
        return
    formats: dict[tuple[int, ...], list[str]] = {}  # (K, N, bits, group) or (K, N, E, per token, ...)
    refused: dict[str, list[str]] = {}
    tied, full = [], []
    joins: dict[str, list[tuple[Linear, tuple[int, ...]]]] = {}  # label -> (layer, its format)
    for layer in layers:
        own = q.get(layer.path, True)
        if own is False:
            full.append(layer.path)
            continue
        params = {**q, **own} if isinstance(own, dict) else q
        bits, group, mode = params.get("bits"), params.get("group_size", 64), params.get("mode", MODE)
        if layer.other == TIED:
            tied.append(layer.path)
            continue
        if isinstance(group, int) and group > 0 and layer.k % group:
            full.append(layer.path)  # mlx-lm leaves it in full precision
            continue
        why = format_refusal(mode, bits, group)
        if why is not None:
            refused.setdefault(why, []).append(layer.path)
            continue
        assert isinstance(bits, int) and isinstance(group, int)
        experts = (layer.experts, layer.per_token) if layer.other == EXPERTS else ()
        if layer.join:
            joins.setdefault(layer.join, []).append((layer, (layer.k, layer.n, bits, group)))
            continue
        formats.setdefault((layer.k, layer.n, *experts, bits, group), []).append(layer.path)
    join_sizes = Counter(layer.join for layer in layers if layer.join)
    planned = {p for paths in formats.values() for p in paths} \
        | {layer.path for members in joins.values() for layer, _ in members}
    for label, members in joins.items():
        # the patch joins them where all are quantized in one format (model_quant.Joined) and the layers
        # the join needs are quantized too, else each runs alone
        one = {(f[0], f[2], f[3]) for _, f in members}
        needs = {p for layer, _ in members for p in layer.join_needs}
        if len(one) == 1 and len(members) == join_sizes[label] and needs <= planned:
            k, bits, group = one.pop()
            head = members[0][0].path
            path = "+".join([head, *(layer.path.rsplit(".", 1)[-1] for layer, _ in members[1:])])
            formats.setdefault((k, sum(f[1] for _, f in members), bits, group), []).append(path)
            continue
        for layer, f in members:
            formats.setdefault(f, []).append(layer.path)
    position = {layer.path: i for i, layer in enumerate(layers)}  # plan in the model's order
    # a joined entry's path starts with its first layer's: "<q_proj's path>+k_proj+v_proj"
    first = {fmt: min(position[p.split("+")[0]] for p in paths) for fmt, paths in formats.items()}
    for fmt, paths in sorted(formats.items(), key=lambda item: first[item[0]]):
        k, n, bits, group = fmt[0], fmt[1], fmt[-2], fmt[-1]
        if len(fmt) == 4:
            add(KERNEL, f"{k} -> {n}, {bits}-bit group {group}: {_where(paths)}",
                [(m, k, n, bits, group) for m in rows])
            continue
        e, per_token = fmt[2], fmt[3]
        pairs = [m * per_token for m in rows]
        where = f"{e} experts, {k} -> {n}, {bits}-bit group {group}, {per_token} a token: {_where(paths)}"
        add(GATHER, where, [(t, k, n, e, bits, group) for t in pairs])
    for why, paths in refused.items():
        notes.append(f"{KERNEL} left out for {_where(paths)}: {why}; these layers keep MLX's op")
    if tied:
        notes.append("the LM head is the tied embedding (embed_tokens.as_linear, a quantized matmul outside "
                     "any QuantizedLinear): not planned")
    if full:
        notes.append(f"not quantized: {_where(full)}")
