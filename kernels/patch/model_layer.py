"""mlx-lm's llama decoder layer (``TransformerBlock``: Llama, Mistral) with quantized projections as one
block for :func:`kernelfleet.patch`.

A decode step at batch 1 is host time on a GPU (``benchmarks/decode_floor.py``): what it costs is the
calls from Python and the primitives MLX builds, not the kernels' GPU time. The projection blocks of
:mod:`kernelfleet.kernels.patch.model_quant` join q/k/v and gate/up; this block goes on to run the whole
layer in two ``mx.compile``d graphs per input shape, around the KV cache and attention:

- ``pre``: the input RMSNorm, q/k/v as one ``quantized_matmul`` over their joined weights, the split
  into heads and RoPE on q and k (its offset passed as an array, so one graph serves every position);
  at one position per sequence q/k/v's call itself rotates q and k (:func:`fused_rope`);
- mlx-lm's own ``cache.update_and_fetch`` and ``scaled_dot_product_attention``, as its layer calls them;
  at a decode step over mlx-lm's ``KVCache`` the cache's writes and the block's own attention kernel
  instead, the attention compiled with the post graph (:mod:`.model_decode`);
- ``post``: ``o_proj``, the residual add, the post-attention RMSNorm, gate/up joined, the activation,
  ``down_proj`` and the second residual add.

Where the profile picks qmv or qmv_split, the quantized matmuls take ``quantized_matmul``'s RMSNorm
prologue and epilogues (:func:`_epilogues`): q/k/v's launch normalises x and, at one position per
sequence, writes attention's layout; o's adds the residual; gate/up's normalises that and computes the
activation where its config holds row pairs; down's adds the residual. Where q/k/v's config holds row
pairs, its launch also applies RoPE to q and k (two ``mx.fast.rope`` launches a layer fewer). Each is a
primitive MLX does not build, host time a decode step does not pay.

Each kernel (the input ``rmsnorm``, the quantized matmuls, ``add_rmsnorm`` for the residual add and the
post-attention norm, the activation) runs the profile's config at the call's M, the catalog's built-in
where it has none (MLX's ``mx.fast.rms_norm`` for the norms, as the layer's own ``nn.RMSNorm``); RoPE
runs MLX's ``mx.fast.rope``, as the layer's own, where q/k/v's launch does not. A layer whose
projections' views were replaced (``load_weights``), a cache whose offset is not one number (batched
caches with an offset per sequence), or one sequence where the profile picks nothing at that M runs the
layer's own code: mlx-lm's modules, MLX's ops, as in the stock model.

The attention half (:func:`attention_half`, :func:`pre_graph`), the launch parameters (:func:`own_launch`,
:func:`qkv_params`) and the call around the KV cache (:func:`layer_call`) serve Qwen3-MoE's layer block
too (:mod:`kernelfleet.kernels.patch.model_moe_layer`), whose attention adds per-head norms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..catalog import quantized_matmul_kernel
from ..common import prod
from ..render.launch import interceptor
from ..spec import Config, Shape
from . import runtime
from .model_decode import DecodeGraph, decode_graph, report_note
from .model_patterns import Call, Router, Site, source_has
from .model_quant import (
    ATTENTION_LINES,
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
FUSED = (1, 4)  # the plan's calls whose launches do the work around them (q/k/v, gate/up): _epilogues


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


@dataclass(frozen=True)
class AttentionHalf:
    """A decoder layer's attention half as a layer block runs it: the input RMSNorm, q/k/v joined, the
    per-head norms where the layer has them (Qwen3), RoPE, mlx-lm's KV cache and attention, o."""

    k: int  # the hidden size
    ns: tuple[int, ...]  # the N of q, k and v
    bits: int  # q/k/v's format
    group: int
    heads: int
    kv_heads: int
    hd: int  # head dim
    o_tail: tuple[int, int, int, int]  # o's (K, N, bits, group)
    rope: tuple[Any, ...]  # mx.fast.rope's settings: dims, traditional, base, scale
    freqs: mx.array | None  # its freqs (Llama3RoPE), or None
    eps: float  # the input norm's
    qk_eps: tuple[float, float] | None  # q_norm's and k_norm's (Qwen3); None: no per-head norms
    sdpa: Any  # mlx-lm's scaled_dot_product_attention, as the layer's module calls it

    @property
    def qkv_tail(self) -> tuple[int, int, int, int]:
        return self.k, sum(self.ns), self.bits, self.group

    @property
    def head_dims(self) -> tuple[int, int, int]:
        return self.heads, self.kv_heads, self.hd


def attention_half(m: nn.Module, lines: Sequence[str] = ATTENTION_LINES, qk_norm: bool = False
                   ) -> AttentionHalf | None:
    """The attention half of decoder layer ``m`` where its ``input_layernorm`` is ``nn.RMSNorm``, its
    ``self_attn`` an mlx-lm ``Attention`` whose ``__call__`` has ``lines`` with q, k and v in one format
    (:func:`~kernelfleet.kernels.patch.model_quant.attention_format`), a bias-free quantized ``o_proj`` of the
    hidden size and a RoPE this block runs in its graph (:func:`rope_settings`), and, with ``qk_norm``,
    ``q_norm`` and ``k_norm`` ``nn.RMSNorm`` over the head dim; else None."""
    attn, norm = getattr(m, "self_attn", None), getattr(m, "input_layernorm", None)
    if not isinstance(attn, nn.Module) or type(norm) is not nn.RMSNorm:
        return None
    fmt, o_fmt = attention_format(attn, lines), joined_format([getattr(attn, "o_proj", None)])
    rope = rope_settings(getattr(attn, "rope", None))
    if fmt is None or o_fmt is None or rope is None:
        return None
    k, ns, bits, group, heads, kv_heads, hd = fmt
    o_in, (o_out,), o_bits, o_group = o_fmt
    if (o_in, o_out) != (heads * hd, k):
        return None
    qk_eps = None
    if qk_norm:
        qk = [getattr(attn, name, None) for name in ("q_norm", "k_norm")]
        if not all(type(n) is nn.RMSNorm and tuple(n.weight.shape) == (hd,) for n in qk):
            return None
        qk_eps = (float(qk[0].eps), float(qk[1].eps))  # type: ignore[union-attr]
    return AttentionHalf(k, ns, bits, group, heads, kv_heads, hd, (o_in, k, o_bits, o_group), rope[0],
                         rope[1], float(norm.eps), qk_eps, attention_function(attn))


def quantized_decoder_layer(m: nn.Module) -> Site | None:
    """mlx-lm's llama ``TransformerBlock`` (source checked) whose attention half the block takes
    (:func:`attention_half`), whose MLP is a gated MLP of quantized projections
    (:func:`~kernelfleet.kernels.patch.model_quant.gated_mlp_format`) and whose post-attention norm is
    ``nn.RMSNorm``: the layer as two compiled graphs around the KV cache and attention (the module
    docstring)."""
    cls = type(m)
    if not (cls.__module__.startswith("mlx_lm.models.") and cls.__name__ == "TransformerBlock") \
            or not source_has(cls, *LAYER_LINES):
        return None
    attn, mlp = getattr(m, "self_attn", None), getattr(m, "mlp", None)
    post_norm = getattr(m, "post_attention_layernorm", None)
    if not isinstance(mlp, nn.Module) or type(post_norm) is not nn.RMSNorm:
        return None
    half, mlp_fmt = attention_half(m), gated_mlp_format(mlp)
    if half is None or mlp_fmt is None:
        return None  # the projection blocks and layers, each on its own, say what runs
    act, k_mlp, inter, (gate_up, down) = mlp_fmt
    if k_mlp != half.k:
        return None
    k, ns, bits, group = half.k, half.ns, half.bits, half.group
    tails = [half.qkv_tail, half.o_tail, gate_up, down]
    eps = (half.eps, float(post_norm.eps))
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
        launches = block_launches(router, calls, shape, dt, FUSED)
        if launches is None:
            return None  # one sequence and no custom config: mlx-lm's own code, MLX's ops
        params = {kernel: {"eps": e} for kernel, e in zip(NORMS, eps, strict=True)}
        rope = fused_rope(half, shape)
        epilogues = _epilogues(launches, shape, half.head_dims, act, eps, rope)
        resolved = [None if epilogue is None else
                    router.resolved(kernel, s, dt, params.get(kernel, {}), epilogue, fused)
                    for (kernel, s), epilogue, fused in zip(calls, epilogues, launches, strict=True)]
        counters = [got[0] for got in resolved if got is not None]
        runners = tuple(None if got is None else got[1] for got in resolved)
        pre = pre_graph(half, runners[:2], shape, rope is not None)
        post = _post_graph(runners[2:], shape, half.head_dims, inter)
        key = (runners, shape, half.head_dims, inter, eps, half.rope)
        graphs = ((pre, router.graph(("layer pre", *key), lambda: mx.compile(pre))),
                  (post, router.graph(("layer post", *key), lambda: mx.compile(post))))
        qkv, gu = joined
        rope_freqs = () if half.freqs is None and rope is None else (rope_freqs_of(half),)

        def inputs(self: Any) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]] | None:
            if not (qkv.current() and gu.current()):
                return None
            # item lookups (a module is a dict of its children): no Module.__getattr__ calls
            o, d = self["self_attn"]["o_proj"], self["mlp"]["down_proj"]
            return ((self["input_layernorm"]["weight"], qkv.weight, qkv.scales, qkv.biases, *rope_freqs),
                    (o["weight"], o["scales"], o["biases"], self["post_attention_layernorm"]["weight"],
                     gu.weight, gu.scales, gu.biases, d["weight"], d["scales"], d["biases"]))
        backend = runtime.gpu_backend() if router.gpu else None
        decode = decode_graph(post, shape, dt, half.head_dims, backend, router.graph, ("layer decode", *key))
        return layer_call(own, counters, graphs, half.sdpa, inputs, decode)

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
    label += report_note(half.head_dims, runtime.gpu_backend())
    families = {KERNEL: member, act: rows_of(inter), **{kernel: rows_of(k) for kernel in NORMS}}
    return Site("quantized decoder layer", families, label, plan, None, bind=bind, describe=named,
                consumes=CONSUMES, prepare=prepare, fused=fused_roles([tails[0], tails[2]]))


def rows_of(d: int) -> Any:
    """A ``rows x d`` family's member test."""
    return lambda s: len(s) == 2 and s[1] == d


def own_launch(router: Router, call: tuple[str, Shape], dt: Any) -> Config | None:
    """The config of a quantized matmul ``call`` whose launch does the work around the matmul (qmv,
    qmv_split: ``quantized_matmul``'s norm prologue and epilogues), else None: the profile's pick, or where
    the built-in runs, a custom config within
    :data:`~kernelfleet.kernels.patch.profile_view.FUSED_MIN_SPEEDUP` of it
    (:meth:`~kernelfleet.kernels.patch.profile_view.ProfileView.runner_up`, through :meth:`Router.fused`)."""
    config = router.fused(call[0], call[1], dt)
    return config if fusable(config) else None


def fusable(config: Config | None) -> bool:
    """Whether a quantized matmul config's launch takes the norm prologue and the epilogues."""
    return config is not None and config.get("path") in ("qmv", "qmv_split")


def block_launches(router: Router, calls: list[tuple[str, Shape]], shape: tuple[int, ...], dt: Any,
                   roles: Sequence[int]) -> list[Config | None] | None:
    """Per call of a layer block's plan, the config of its fused launch (:func:`own_launch`) for the calls
    at ``roles`` (the quantized matmuls whose launches do the work around them), None elsewhere; or None
    where the block does not run: no plan, or one sequence with neither a profile pick nor a fused
    launch's config (:meth:`Router.fuses`) among its calls."""
    if not calls or (shape[0] <= 1 and not router.picks(*((kernel, s, dt) for kernel, s in calls))
                     and not router.fuses(*((*calls[i], dt) for i in roles))):
        return None
    return [own_launch(router, call, dt) if i in roles else None for i, call in enumerate(calls)]


def fused_roles(roles: Sequence[tuple[int, ...]]) -> Callable[[Shape, Config], bool]:
    """The report's test (:meth:`ProfileView.family`'s ``fused``) for a layer block whose quantized
    matmuls at these shape tails (q/k/v's, ...) are fused launches: a tuned shape there whose config is
    :func:`fusable`."""
    tails = {tuple(t) for t in roles}

    def fused(shape: Shape, config: Config) -> bool:
        return len(shape) == 5 and tuple(shape[1:]) in tails and fusable(config)
    return fused


def qkv_params(fused_norm: bool, shape: tuple[int, ...], heads: tuple[int, int, int], eps: float,
               rope: float | None = None) -> dict[str, Any]:
    """q/k/v's launch parameters: at one position per sequence q, k and v written as attention holds them
    (batch, heads, 1, head dim), and with ``rope`` (:func:`fused_rope`: its scale) q and k rotated; with
    ``fused_norm`` (its config is :func:`own_launch`'s) x normalised in the launch."""
    one = shape[1] == 1
    return {**({"heads": (shape[0], *heads)} if one else {}),
            **({"rope": rope} if one and rope is not None else {}), **({"norm": eps} if fused_norm else {})}


def fused_rope(half: AttentionHalf, shape: tuple[int, ...]) -> float | None:
    """RoPE's scale where q/k/v's call rotates q and k (``quantized_matmul``'s ``rope``, with the heads
    epilogue: one position per sequence, the whole head dim rotated, half-split, no per-head norms between
    the matmul and RoPE), else None: ``mx.fast.rope`` runs in the graph after it."""
    dims, traditional, _, scale = half.rope
    if shape[1] != 1 or dims != half.hd or traditional or half.qk_eps is not None:
        return None
    return float(scale)


def rope_freqs_of(half: AttentionHalf) -> mx.array:
    """RoPE's freqs as ``mx.fast.rope`` takes them: the module's own (``Llama3RoPE``), or ``base ** (2i /
    dims)``, what its ``base`` stands for."""
    if half.freqs is not None:
        return half.freqs
    dims, base = half.rope[0], float(half.rope[2])
    return base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)


def _epilogues(launches: list[Config | None], shape: tuple[int, ...], heads: tuple[int, int, int], act: str,
               eps: tuple[float, ...], rope: float | None = None) -> list[dict[str, Any] | None]:
    """Per call of the plan, the parameters its launch takes beyond the kernel's own (``quantized_matmul``'s
    epilogues and RMSNorm prologue: MLX's ops around the matmul where its config does not do them), None
    for a norm or the activation that a quantized matmul's launch does instead. ``launches``: the plan's
    fused launches (:func:`block_launches`, at :data:`FUSED`). Where q/k/v's config is
    qmv or qmv_split its launch normalises x; at one position per sequence it writes q, k and v as attention
    holds them (:func:`qkv_params`). Where gate/up's is, o adds the residual and gate/up's launch
    normalises the sum, and at 2 or more rows a warp (a gate row and its up row in one warp) computes the
    activation. down adds the residual. With ``rope`` (:func:`fused_rope`) q/k/v's call rotates q and k
    (in its launch where its config holds row pairs). Every MLX primitive a decode step leaves out is host
    time it does not pay (``benchmarks/host_cost.py``)."""
    qkv, gate_up = launches[1], launches[4]
    fused_act = act in quantized_matmul_kernel.GLUS and gate_up is not None and int(gate_up["rpw"]) >= 2
    gate_up_params = {**({"glu": act} if fused_act else {}), **({"norm": eps[1]} if gate_up else {})}
    return [None if qkv else {}, qkv_params(qkv is not None, shape, heads, eps[0], rope),
            {"residual": True} if gate_up else {}, None if gate_up else {},
            gate_up_params, None if fused_act else {}, {"residual": True}]


def pre_graph(half: AttentionHalf, runners: Sequence[Any], shape: tuple[int, ...], rope_in_qkv: bool = False
              ) -> Any:
    """The layer's graph before the KV cache on ``x`` of ``shape`` (batch, L, K), to be ``mx.compile``d:
    the input norm (``runners[0]``; None where q/k/v's launch normalises x), q/k/v joined (``runners[1]``),
    the split into heads, the per-head norms (``runners[2:4]``, Qwen3) and RoPE on q and k (in q/k/v's call
    with ``rope_in_qkv``, :func:`fused_rope`: its last two inputs RoPE's offset and freqs). Its inputs:
    x, RoPE's offset (an array: one graph serves every position), the input norm's weight, q/k/v's joined
    weight, scales and biases, then q_norm's and k_norm's weights where the layer has them, then RoPE's
    freqs where it has them or q/k/v's call rotates (:func:`rope_freqs_of`). Its outputs: queries, keys
    and values, and x as rows (batch * L, K) for the post graph's residual (one reshape a layer, not
    two)."""
    norm_run, qkv_run, *qk_runs = runners
    heads, kv_heads, hd = half.head_dims
    b, length, k = shape
    rows = b * length
    one = length == 1  # q/k/v come out of their matmul as attention holds them
    rope_dims, traditional, base, scale = half.rope

    def pre(x: mx.array, offset: mx.array, norm: mx.array, w: mx.array, s: mx.array, bi: mx.array,
            *rest: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array]:
        rows_in = x.reshape(rows, k)
        rope_in = [offset, rest[-1]] if rope_in_qkv else []
        if norm_run is None:  # q/k/v's launch normalises x
            qkv = qkv_run([rows_in, w, s, bi, norm, *rope_in])
        else:
            qkv = qkv_run([norm_run([rows_in, norm])[0], w, s, bi, *rope_in])
        per_head = None
        if qk_runs:  # q_norm and k_norm over the head dim, before RoPE
            (q_run, k_run), (q_w, k_w), rest = qk_runs, rest[:2], rest[2:]

            def per_head(q: mx.array, keys: mx.array) -> tuple[mx.array, mx.array]:
                return q_run([q, q_w])[0], k_run([keys, k_w])[0]
        if one:
            q, keys, values = qkv
            if per_head is not None:
                q, keys = per_head(q, keys)
        else:
            q, keys, values = split_heads(qkv[0], b, length, heads, kv_heads, hd, per_head)
        if not rope_in_qkv:
            f = rest[0] if rest else None
            q, keys = (mx.fast.rope(t, rope_dims, traditional=traditional, base=base, scale=scale,
                                    offset=offset, freqs=f) for t in (q, keys))
        return q, keys, values, rows_in
    return pre


Inputs = Callable[[Any], "tuple[tuple[mx.array, ...], tuple[mx.array, ...]] | None"]


@lru_cache(maxsize=8)
def offset_array(offset: int) -> mx.array:
    """The cache's offset as a 1-element array: ``mx.fast.rope`` takes it, and so does a kernel (not a
    scalar). One array an offset, not one a layer: a decode step's layers share it."""
    return mx.array([offset], mx.int32)


def layer_call(own: Call, counters: Sequence[list[int]], graphs: tuple[tuple[Any, Any], tuple[Any, Any]],
               sdpa: Any, inputs: Inputs, decode: DecodeGraph | None = None) -> Call:
    """A layer block's ``__call__``: the pre graph (:func:`pre_graph`), mlx-lm's own
    ``cache.update_and_fetch`` and ``scaled_dot_product_attention`` as its layer calls them, the post graph
    (on x as rows, from the pre graph, and attention's output). ``graphs``: (plain, compiled) of each; the
    plain ones run while launches are recorded (``launch.capture``: no trace). ``inputs(self)``: the arrays
    of each graph after its own (x and the offset; x and attention's output), or None where the layer no
    longer holds what the block was made for (new weights: ``load_weights``), which then runs its own code,
    as does a cache whose offset is not one number (an offset per sequence). With ``decode``
    (:func:`~kernelfleet.kernels.patch.model_decode.decode_graph`), a step whose cache it takes writes the
    cache as mlx-lm does after the pre graph, then attends over it with the block's own kernel, compiled
    with the post graph."""
    (pre_plain, pre_compiled), (post_plain, post_compiled) = graphs

    def call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        offset = 0 if cache is None else cache.offset
        arrays = inputs(self)
        if arrays is None or type(offset) is not int:
            return own(self, x, mask, cache)
        for counter in counters:
            counter[0] += 1
        plain = interceptor() is not None
        at = offset_array(offset)
        pre = pre_plain if plain else pre_compiled
        if decode is not None and decode.takes(cache, mask):
            return decode.run(pre, x, at, cache, self["self_attn"].scale, arrays, plain)
        queries, keys, values, x_rows = pre(x, at, *arrays[0])
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        out = sdpa(queries, keys, values, cache=cache, scale=self["self_attn"].scale, mask=mask)
        result: mx.array = (post_plain if plain else post_compiled)(x_rows, out, *arrays[1])
        return result
    return call


def _post_graph(runners: tuple[Any, ...], shape: tuple[int, ...], heads: tuple[int, int, int], inter: int
                ) -> Any:
    """The llama layer's graph after attention on ``x`` (batch * L, K) through ``runners`` (o,
    add_rmsnorm, gate/up, the activation, down, with :func:`_epilogues`' parameters; None for a norm or the
    activation a quantized matmul's launch does), to be ``mx.compile``d."""
    o_run, add_norm_run, gate_up_run, act_run, down_run = runners
    n_heads, _, hd = heads
    b, length, k = shape
    rows = b * length
    one = length == 1  # attention's output (batch, heads, 1, head dim) is already (rows, heads * head dim)

    def post(x: mx.array, attn: mx.array, ow: mx.array, os_: mx.array, ob: mx.array, norm: mx.array,
             gw: mx.array, gs: mx.array, gb: mx.array, dw: mx.array, ds: mx.array, db: mx.array) -> mx.array:
        a = attention_rows(attn, one, rows, n_heads * hd)
        if add_norm_run is None:  # o adds the residual, gate/up's launch normalises the sum
            h = o_run([a, ow, os_, ob, x])[0]
            gate_up_in = [h, gw, gs, gb, norm]
        else:
            normed, h = add_norm_run([x, o_run([a, ow, os_, ob])[0], norm])
            gate_up_in = [normed, gw, gs, gb]
        if act_run is None:
            mid = gate_up_run(gate_up_in)[0]
        else:
            gu = gate_up_run(gate_up_in)[0]
            mid = act_run([gu[:, :inter], gu[:, inter:]])[0]
        out: mx.array = down_run([mid, dw, ds, db, h])[0].reshape(b, length, k)
        return out
    return post


def attention_rows(attn: mx.array, one: bool, rows: int, n: int) -> mx.array:
    """Attention's output (batch, heads, L, head dim) as o's input rows (batch * L, heads * head dim); at one
    position a reshape alone."""
    return (attn if one else attn.transpose(0, 2, 1, 3)).reshape(rows, n)
