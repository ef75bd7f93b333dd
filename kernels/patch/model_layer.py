"""mlx-lm's llama decoder layer (``TransformerBlock``: Llama, Mistral) with quantized projections as one
block for :func:`kernelfleet.patch`.

A decode step at batch 1 is host time on a GPU (``benchmarks/decode_floor.py``): what it costs is the
calls from Python and the primitives MLX builds, not the kernels' GPU time. The projection blocks of
:mod:`kernelfleet.kernels.patch.model_quant` join q/k/v and gate/up; this block goes on to run the whole
layer in two ``mx.compile``d graphs per input shape, around the KV cache and attention:

- ``pre``: the input RMSNorm, q/k/v as one ``quantized_matmul`` over their joined weights, the split
  into heads and RoPE on q and k (its offset passed as an array, so one graph serves every position);
- mlx-lm's own ``cache.update_and_fetch`` and ``scaled_dot_product_attention``, as its layer calls them;
- ``post``: ``o_proj``, the residual add, the post-attention RMSNorm, gate/up joined, the activation,
  ``down_proj`` and the second residual add.

Where the profile picks qmv or qmv_split, the quantized matmuls take ``quantized_matmul``'s RMSNorm
prologue and epilogues (:func:`_epilogues`): q/k/v's launch normalises x and, at one position per
sequence, writes attention's layout; o's adds the residual; gate/up's normalises that and computes the
activation where its config holds row pairs; down's adds the residual. Each is a primitive MLX does not
build, host time a decode step does not pay.

Each kernel (the input ``rmsnorm``, the quantized matmuls, ``add_rmsnorm`` for the residual add and the
post-attention norm, the activation) runs the profile's config at the call's M, the catalog's built-in
where it has none (MLX's ``mx.fast.rms_norm`` for the norms, as the layer's own ``nn.RMSNorm``); RoPE
runs MLX's ``mx.fast.rope``, as the layer's own. A layer whose
projections' views were replaced (``load_weights``), a cache whose offset is not one number (batched
caches with an offset per sequence), or one sequence where the profile picks nothing at that M runs the
layer's own code: mlx-lm's modules, MLX's ops, as in the stock model.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..catalog import quantized_matmul_kernel
from ..common import prod
from ..render.launch import interceptor
from ..spec import Config, Shape
from .model_patterns import Call, Router, Site, source_has
from .model_quant import (
    ARRAYS,
    KERNEL,
    PROJECTIONS,
    QKV,
    Joined,
    attention_format,
    attention_function,
    describe,
    gated_mlp_format,
    joined_format,
    split_heads,
)

# mlx-lm's llama TransformerBlock.__call__ (mlx-lm 0.32), the computation this block replaces
LAYER_LINES = (
    "r = self.self_attn(self.input_layernorm(x), mask, cache)",
    "h = x + r",
    "r = self.mlp(self.post_attention_layernorm(h))",
    "out = h + r",
    "return out",
)
# the RoPE modules whose call is mx.fast.rope on (x, offset) with the module's own settings
ROPE_LINES = {
    "RoPE": ("return mx.fast.rope( x, self.dims, traditional=self.traditional, base=self.base, "
             "scale=self.scale, offset=offset, )",),
    "Llama3RoPE": ("return mx.fast.rope( x, self.dims, traditional=self.traditional, base=None, "
                   "scale=1.0, offset=offset, freqs=self._freqs, )",),
}
# the modules the block takes over: their own patterns do not apply to them
CONSUMES = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp",
            *(f"self_attn.{name}" for name in (*QKV, "o_proj", "rope")),
            *(f"mlp.{name}" for name in PROJECTIONS))
NAMES = ("q/k/v", "o", "gate/up", "down")  # the quantized matmuls of a layer, in the order they run
NORMS = ("rmsnorm", "add_rmsnorm")  # the input norm; the residual add and the post-attention norm


def rope_settings(rope: Any) -> tuple[tuple[Any, ...], mx.array | None] | None:
    """(mx.fast.rope's settings as a key, its ``freqs`` or None) for a RoPE module this block can run
    inside its graph (``nn.RoPE``, mlx-lm's ``Llama3RoPE``); None for any other."""
    cls: type = type(rope)
    if cls is nn.RoPE and source_has(cls, *ROPE_LINES["RoPE"]):
        return (int(rope.dims), bool(rope.traditional), float(rope.base), float(rope.scale)), None
    if cls.__name__ == "Llama3RoPE" and cls.__module__.startswith("mlx_lm.models.") \
            and source_has(cls, *ROPE_LINES["Llama3RoPE"]) \
            and isinstance(getattr(rope, "_freqs", None), mx.array):
        return (int(rope.dims), bool(rope.traditional), None, 1.0), rope._freqs
    return None


def quantized_decoder_layer(m: nn.Module) -> Site | None:
    """mlx-lm's llama ``TransformerBlock`` (source checked) whose attention and MLP the projection blocks
    of :mod:`~kernelfleet.kernels.patch.model_quant` take, whose ``o_proj`` is a bias-free
    ``QuantizedLinear`` the catalog's kernel takes and whose norms are ``nn.RMSNorm``: the layer as two
    compiled graphs around the KV cache and attention (the module docstring)."""
    cls = type(m)
    if not (cls.__module__.startswith("mlx_lm.models.") and cls.__name__ == "TransformerBlock") \
            or not source_has(cls, *LAYER_LINES):
        return None
    attn, mlp = getattr(m, "self_attn", None), getattr(m, "mlp", None)
    norms = (getattr(m, "input_layernorm", None), getattr(m, "post_attention_layernorm", None))
    if not isinstance(attn, nn.Module) or not isinstance(mlp, nn.Module) \
            or not all(type(n) is nn.RMSNorm for n in norms):
        return None
    qkv_fmt, mlp_fmt = attention_format(attn), gated_mlp_format(mlp)
    o_fmt = joined_format([getattr(attn, "o_proj", None)])
    rope = rope_settings(getattr(attn, "rope", None))
    if qkv_fmt is None or mlp_fmt is None or o_fmt is None or rope is None:
        return None  # the projection blocks and layers, each on its own, say what runs
    k, ns, bits, group, heads, kv_heads, hd = qkv_fmt
    act, k_mlp, inter, (gate_up, down) = mlp_fmt
    o_in, (o_out,), o_bits, o_group = o_fmt
    if k_mlp != k or (o_in, o_out) != (heads * hd, k):
        return None
    tails = [(k, sum(ns), bits, group), (o_in, k, o_bits, o_group), gate_up, down]
    (rope_dims, rope_traditional, rope_base, rope_scale), freqs = rope
    eps = tuple(float(n.eps) for n in norms)  # type: ignore[union-attr]
    sdpa = attention_function(attn)
    joined: list[Joined] = []  # q/k/v and gate/up joined, made when the patch is applied

    def plan(shape: tuple[int, ...]) -> list[tuple[str, Shape]]:
        """The layer's kernel calls in the order they run (the norms as :data:`NORMS` says)."""
        if len(shape) != 3 or shape[-1] != k:
            return []
        rows = prod(shape[:-1])
        qkv, o, gate_up, down = ((KERNEL, (rows, *tail)) for tail in tails)
        norm, add_norm = ((kernel, (rows, k)) for kernel in NORMS)
        return [norm, qkv, o, add_norm, gate_up, (act, (rows, inter)), down]

    def bind(router: Router, shape: tuple[int, ...], dt: Any, own: Call) -> Call | None:
        calls = plan(shape)
        if not calls or (not router.picks(*((kernel, s, dt) for kernel, s in calls)) and shape[0] <= 1):
            return None  # one sequence and no custom config: mlx-lm's own code, MLX's ops
        params = {kernel: {"eps": e} for kernel, e in zip(NORMS, eps, strict=True)}
        epilogues = _epilogues(router, calls, shape, dt, (heads, kv_heads, hd), act, eps)
        resolved = [None if epilogue is None else
                    router.resolved(kernel, s, dt, params.get(kernel, {}), epilogue)
                    for (kernel, s), epilogue in zip(calls, epilogues, strict=True)]
        counters = [got[0] for got in resolved if got is not None]
        runners = tuple(None if got is None else got[1] for got in resolved)
        dims, rope_key = (heads, kv_heads, hd, inter), (rope_dims, rope_traditional, rope_base, rope_scale)
        pre, post = _graphs(runners, shape, dims, rope_key)
        key = (runners, shape, dims, eps, rope_key)
        pre_graph = router.graph(("layer pre", *key), lambda: mx.compile(pre))
        post_graph = router.graph(("layer post", *key), lambda: mx.compile(post))
        qkv, gu = joined
        rope_freqs = () if freqs is None else (freqs,)

        def call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
            offset = 0 if cache is None else cache.offset
            if not (qkv.current() and gu.current()) or type(offset) is not int:
                return own(self, x, mask, cache)
            for counter in counters:
                counter[0] += 1
            a, plain = self.self_attn, interceptor() is not None  # launches recorded: no trace
            queries, keys, values = (pre if plain else pre_graph)(
                x, mx.array(offset, mx.int32), self.input_layernorm.weight, qkv.weight, qkv.scales,
                qkv.biases, *rope_freqs)
            if cache is not None:
                keys, values = cache.update_and_fetch(keys, values)
            out = sdpa(queries, keys, values, cache=cache, scale=a.scale, mask=mask)
            o, d = a.o_proj, self.mlp.down_proj
            return (post if plain else post_graph)(
                x, out, *(o[name] for name in ARRAYS), self.post_attention_layernorm.weight, gu.weight,
                gu.scales, gu.biases, *(d[name] for name in ARRAYS))
        return call

    def member(s: Shape) -> bool:
        return len(s) == 5 and tuple(s[1:]) in tails

    def named(s: Shape) -> str:  # a tuned shape in the report: which projections it is
        return f"{describe(s)} {NAMES[tails.index(tuple(s[1:]))]}" if member(s) else describe(s)

    def prepare() -> None:
        joined.extend([Joined([getattr(attn, name) for name in QKV]),
                       Joined([getattr(mlp, name) for name in PROJECTIONS[:2]])])

    label = f"{k} -> {' + '.join(map(str, ns))} | {k} -> {inter} -> {k}, {bits}-bit, group {group}"
    if len({(t[2], t[3]) for t in tails}) > 1:
        formats = (f"{n} {t[2]}-bit group {t[3]}" for n, t in zip(NAMES, tails, strict=True))
        label += f" ({', '.join(formats)})"

    def rows_of(d: int) -> Any:
        return lambda s: len(s) == 2 and s[1] == d
    families = {KERNEL: member, act: rows_of(inter), **{kernel: rows_of(k) for kernel in NORMS}}
    return Site("quantized decoder layer", families,
                label, plan, None, bind=bind, describe=named, consumes=CONSUMES, prepare=prepare)


def _epilogues(router: Router, calls: list[tuple[str, Shape]], shape: tuple[int, ...], dt: Any,
               heads: tuple[int, int, int], act: str, eps: tuple[float, ...]) -> list[dict[str, Any] | None]:
    """Per call of the plan, the parameters its launch takes beyond the kernel's own (``quantized_matmul``'s
    epilogues and RMSNorm prologue: MLX's ops around the matmul where its config does not do them), None
    for a norm or the activation that a quantized matmul's launch does instead. Where q/k/v's config is
    qmv or qmv_split its launch normalises x; at one position per sequence it writes q, k and v as attention
    holds them (batch, heads, 1, head dim). Where gate/up's is, o adds the residual and gate/up's launch
    normalises the sum, and at 2 or more rows a warp (a gate row and its up row in one warp) computes the
    activation. down adds the residual. Every MLX primitive a decode step leaves out is host time it does
    not pay (``benchmarks/host_cost.py``)."""
    qkv_call, gate_up_call = calls[1], calls[4]

    def own_path(call: tuple[str, Shape]) -> Config | None:  # a config whose launch does the extra work
        config = router.choice(call[0], call[1], dt)
        return config if config is not None and config["path"] in ("qmv", "qmv_split") else None

    qkv, gate_up = own_path(qkv_call), own_path(gate_up_call)
    fused_act = act in quantized_matmul_kernel.GLUS and gate_up is not None and int(gate_up["rpw"]) >= 2
    one = shape[1] == 1  # one position per sequence: q/k/v's rows are the batch
    qkv_params = {**({"heads": (shape[0], *heads)} if one else {}), **({"norm": eps[0]} if qkv else {})}
    gate_up_params = {**({"glu": act} if fused_act else {}), **({"norm": eps[1]} if gate_up else {})}
    return [None if qkv else {}, qkv_params, {"residual": True} if gate_up else {}, None if gate_up else {},
            gate_up_params, None if fused_act else {}, {"residual": True}]


def _graphs(runners: tuple[Any, ...], shape: tuple[int, ...], dims: tuple[int, int, int, int],
            rope: tuple[Any, ...]) -> tuple[Any, Any]:
    """The layer's two graphs on ``x`` of ``shape`` (batch, L, K) through ``runners`` (in the order of the
    block's plan, with :func:`_epilogues`' parameters; None for a norm or the activation a quantized matmul's
    launch does), to be ``mx.compile``d."""
    norm_run, qkv_run, o_run, add_norm_run, gate_up_run, act_run, down_run = runners
    heads, kv_heads, hd, inter = dims
    b, length, k = shape
    rows = b * length
    one = length == 1  # q/k/v come out of their matmul as attention holds them
    rope_dims, traditional, base, scale = rope

    def pre(x: mx.array, offset: mx.array, norm: mx.array, w: mx.array, s: mx.array, bi: mx.array,
            *freqs: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        rows_in = x.reshape(rows, k)
        if norm_run is None:  # q/k/v's launch normalises x
            qkv = qkv_run([rows_in, w, s, bi, norm])
        else:
            qkv = qkv_run([norm_run([rows_in, norm])[0], w, s, bi])
        if one:
            q, keys, values = qkv
        else:
            q, keys, values = split_heads(qkv[0], b, length, heads, kv_heads, hd)
        f = freqs[0] if freqs else None
        q, keys = (mx.fast.rope(t, rope_dims, traditional=traditional, base=base, scale=scale, offset=offset,
                                freqs=f) for t in (q, keys))
        return q, keys, values

    def post(x: mx.array, attn: mx.array, ow: mx.array, os_: mx.array, ob: mx.array, norm: mx.array,
             gw: mx.array, gs: mx.array, gb: mx.array, dw: mx.array, ds: mx.array, db: mx.array) -> mx.array:
        # (batch, heads, L, head dim) -> (rows, heads * head dim); at one position a reshape alone
        a = (attn if one else attn.transpose(0, 2, 1, 3)).reshape(rows, heads * hd)
        if add_norm_run is None:  # o adds the residual, gate/up's launch normalises the sum
            h = o_run([a, ow, os_, ob, x.reshape(rows, k)])[0]
            gate_up_in = [h, gw, gs, gb, norm]
        else:
            normed, h = add_norm_run([x.reshape(rows, k), o_run([a, ow, os_, ob])[0], norm])
            gate_up_in = [normed, gw, gs, gb]
        if act_run is None:
            mid = gate_up_run(gate_up_in)[0]
        else:
            gu = gate_up_run(gate_up_in)[0]
            mid = act_run([gu[:, :inter], gu[:, inter:]])[0]
        out: mx.array = down_run([mid, dw, ds, db, h])[0].reshape(b, length, k)
        return out
    return pre, post
