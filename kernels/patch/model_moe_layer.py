"""mlx-lm's Qwen3-MoE decoder layer (``qwen3_moe``: Qwen3-30B-A3B, Qwen3-235B-A22B) with quantized
projections and experts as one block for :func:`kernelfleet.patch`.

A decode step at batch 1 is host time on a GPU: what it costs is the calls from Python and the
primitives MLX builds (``benchmarks/decode_floor.py --graph`` counts both). A stock Qwen3-MoE layer makes
some twenty module calls from Python a step (norms, q/k/v, per-head norms, RoPE twice, o, the router,
``SwitchGLU`` and its three expert projections, the activation); this block makes two compiled-graph
calls around mlx-lm's own KV cache and attention, as :mod:`kernelfleet.kernels.patch.model_layer` does for
llama, and runs the same computation as mlx-lm's ``Qwen3MoeDecoderLayer.__call__``,
``Attention.__call__`` and ``Qwen3MoeSparseMoeBlock.__call__`` (their sources checked, and ``SwitchGLU``'s
with its sort: :func:`_sources`):

- ``pre`` (:func:`~kernelfleet.kernels.patch.model_layer.pre_graph`): the input RMSNorm, q/k/v as one
  ``quantized_matmul`` over their joined weights, the split into heads, ``q_norm`` and ``k_norm`` over
  the head dim, RoPE on q and k (its offset an array: one graph serves every position);
- mlx-lm's ``cache.update_and_fetch`` and ``scaled_dot_product_attention``, as its attention calls them;
- ``post`` (:func:`_post_graph`): ``o_proj``, the residual add and the post-attention RMSNorm, the router
  (``mlp.gate``, a quantized matmul: 8 bits as ``mlx_lm.convert`` quantizes it), its softmax, top k
  (``mx.argpartition``) and normalisation, the experts as ``SwitchGLU`` runs them (up, gate, mlx-lm's
  ``swiglu``, down, each ``mx.gather_qmm``; at 64 or more (token, expert) pairs sorted by expert first and
  unsorted after, exactly as ``SwitchGLU`` does), the weighted combine and the second residual add. Its
  ``mx.stop_gradient`` calls are left out: they change no value, and a patched model is for inference.

Each kernel of the plan (:func:`quantized_moe_decoder_layer`'s ``plan``: the norms, the quantized matmuls,
the experts' ``gather_quantized_matmul``) runs the profile's config at the call's M, the catalog's
built-in where it has none; where the profile picks nothing for an expert projection it runs
``mx.gather_qmm`` as mlx-lm calls it. Unsorted calls (decode: fewer than 64 pairs) take the profile's pick
where it is a path that takes pairs in any order (qmv, qmv_split: one token's 8 experts in 6.4-6.7 us
against MLX's 13-28 on an H200), up and gate a token's row of x for each of its experts; MLX's op
otherwise. The
router's softmax and top k, the activation and the combine are MLX's ops as mlx-lm writes them (the
catalog's ``topk_gating_softmax``, ``swiglu`` and ``moe_combine`` are not used inside the block: they
order or round differently). Where the profile picks qmv or qmv_split, q/k/v's launch normalises x and,
at one position per sequence, writes attention's layout
(:func:`~kernelfleet.kernels.patch.model_layer.qkv_params`), and o's launch adds the residual (then the
post-attention norm is ``rmsnorm`` alone).

A layer whose q/k/v views were replaced (``load_weights``), a sharded MoE block (``model.shard``), a cache
whose offset is not one number (batched caches with an offset per sequence), or one sequence where the
profile picks nothing at that M runs mlx-lm's own code. A quantized layer the block cannot take (a format
``quantized_matmul`` refuses, q/k/v in different formats, a router left in full precision, an mlx-lm whose
code differs) is kept, the report says why, and its modules take their own patterns. A dense layer
(``mlp_only_layers``) is not this block's: its attention projections and MLP take theirs.
"""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..catalog.gather_quantized_matmul_kernel import SORTED_MIN_PAIRS
from ..common import prod
from ..spec import Config, Shape
from . import runtime
from .model_decode import decode_graph, report_note
from .model_layer import (
    LAYER_LINES,
    AttentionHalf,
    attention_half,
    attention_rows,
    block_launches,
    fused_roles,
    layer_call,
    pre_graph,
    qkv_params,
    rope_settings,
    rows_of,
)
from .model_patterns import (
    QWEN3_MOE_LINES,
    Call,
    Router,
    Site,
    mlx_lm_class,
    source_has,
    stock_swiglu,
    swiglu_fn,
)
from .model_quant import ATTENTION_LINES as LLAMA_ATTENTION_LINES
from .model_quant import (
    GATHER,
    KERNEL,
    MODE,
    QKV,
    Joined,
    decode_form,
    describe,
    experts_format,
    joined_format,
    layer_format,
)

KIND = "quantized MoE decoder layer"
FUSED = (1, 4)  # the plan's calls whose launches do the work around them (q/k/v, o)
# mlx-lm's qwen3_moe Attention.__call__ (mlx-lm 0.32): llama's, with q_norm and k_norm over the head dim
ATTENTION_LINES = (
    *LLAMA_ATTENTION_LINES[:2],
    "queries = self.q_norm(queries.reshape(B, L, self.n_heads, -1)).transpose( 0, 2, 1, 3 ) "
    "keys = self.k_norm(keys.reshape(B, L, self.n_kv_heads, -1)).transpose( 0, 2, 1, 3 ) "
    "values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)",
    *LLAMA_ATTENTION_LINES[3:],
)
# mlx-lm's SwitchGLU.__call__ and the sort around its experts (switch_layers, mlx-lm 0.32)
SWITCH_GLU_LINES = (
    "x = mx.expand_dims(x, (-2, -3))",
    "indices = mx.stop_gradient(indices) do_sort = indices.size >= 64 idx = indices inv_order = None "
    "if do_sort: x, idx, inv_order = _gather_sort(x, indices)",
    "x_up = self.up_proj(x, idx, sorted_indices=do_sort) "
    "x_gate = self.gate_proj(x, idx, sorted_indices=do_sort) "
    "x = self.down_proj( self.activation(x_up, x_gate), idx, sorted_indices=do_sort, )",
    "if do_sort: x = _scatter_unsort(x, inv_order, indices.shape) return x.squeeze(-2)",
)
GATHER_SORT_LINES = ("*_, M = indices.shape indices = indices.flatten() order = mx.argsort(indices) "
                     "inv_order = mx.argsort(order) "
                     "return x.flatten(0, -3)[order // M], indices[order], inv_order",)
SCATTER_UNSORT_LINES = ("x = x[inv_order] if shape is not None: x = mx.unflatten(x, 0, shape) return x",)
EXPERTS = ("up_proj", "gate_proj", "down_proj")  # in the order SwitchGLU calls them
# the modules the block takes over: their own patterns do not apply to them
CONSUMES = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp",
            *(f"self_attn.{name}" for name in (*QKV, "o_proj", "rope", "q_norm", "k_norm")),
            "mlp.gate", "mlp.switch_mlp", *(f"mlp.switch_mlp.{name}" for name in EXPERTS))
NAMES = ("q/k/v", "o", "router", "gate/up", "down")  # the block's quantized weights, in the order they run


def _sources(m: nn.Module) -> dict[str, tuple[Any, tuple[str, ...]]]:
    """What the block replaces, by name: (the class or function, the lines its source must have)."""
    switch = type(m.mlp.switch_mlp)
    helpers = vars(inspect.getmodule(switch) or nn)
    return {f"{type(m).__name__}.__call__": (type(m), LAYER_LINES),
            "Attention.__call__": (type(m.self_attn), ATTENTION_LINES),
            f"{type(m.mlp).__name__}.__call__": (type(m.mlp), QWEN3_MOE_LINES),
            "SwitchGLU.__call__": (switch, SWITCH_GLU_LINES),
            "_gather_sort": (helpers.get("_gather_sort"), GATHER_SORT_LINES),
            "_scatter_unsort": (helpers.get("_scatter_unsort"), SCATTER_UNSORT_LINES)}


def _refusal(m: nn.Module) -> str | None:
    """Why the block cannot take the quantized Qwen3-MoE layer ``m`` (None: it can)."""
    for name, (obj, lines) in _sources(m).items():
        if obj is None or not source_has(obj, *lines):
            import mlx_lm

            return f"{name} is not the computation this block replaces (mlx-lm {mlx_lm.__version__})"
    attn, moe = m.self_attn, m.mlp
    if not stock_swiglu(getattr(moe.switch_mlp, "activation", None)):
        return "the experts' activation is not mlx-lm's SwiGLU"
    norms = {"input_layernorm": m, "post_attention_layernorm": m, "self_attn.q_norm": attn,
             "self_attn.k_norm": attn}
    for path, owner in norms.items():
        if type(getattr(owner, path.rsplit(".", 1)[-1], None)) is not nn.RMSNorm:
            return f"{path} is not nn.RMSNorm"
    rope = getattr(attn, "rope", None)
    if rope_settings(rope) is None:
        return f"its RoPE ({type(rope).__name__}) is not one the block runs in its graph"
    linears = {f"self_attn.{n}": getattr(attn, n, None) for n in (*QKV, "o_proj")} | {"mlp.gate": moe.gate}
    for path, p in linears.items():
        if type(p) is not nn.QuantizedLinear:
            return f"{path} is a {type(p).__name__}, not a QuantizedLinear"
        fmt = layer_format(p)
        if isinstance(fmt, str):
            return f"{path}: {fmt}"
        if joined_format([p]) is None:
            return f"{path}: a bias (the block runs bias-free projections)"
    for name in EXPERTS:
        got = experts_format(getattr(moe.switch_mlp, name, None))
        if not isinstance(got, tuple):
            return f"mlp.switch_mlp.{name}: {got or 'not a QuantizedSwitchLinear'}"
    if joined_format([getattr(attn, n) for n in QKV]) is None:
        return "q, k and v are not quantized in one format (the block runs them as one matmul)"
    return None


Formats = tuple[AttentionHalf, tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _formats(m: nn.Module) -> Formats | str:
    """(the attention half, the router's (K, N, bits, group), the experts' up/gate and down (K, N, E, bits,
    group)) of the quantized Qwen3-MoE layer ``m``, or why the block cannot take it."""
    why = _refusal(m)
    if why is not None:
        return why
    half = attention_half(m, ATTENTION_LINES, qk_norm=True)
    if half is None:
        return "its attention is not one the block runs (q, k, v and o of the head layout)"
    router = layer_format(m.mlp.gate)
    up, gate, down = (experts_format(getattr(m.mlp.switch_mlp, name)) for name in EXPERTS)
    if not (isinstance(router, tuple) and isinstance(up, tuple) and isinstance(down, tuple)) or gate != up \
            or (up[0], down[:3], router[:2]) != (half.k, (up[1], half.k, up[2]), (half.k, up[2])):
        return "its router and experts do not share the hidden size, the expert width and count"
    return half, (half.k, up[2], *router[3:]), up, down


def _quantized(m: nn.Module) -> bool:
    """Whether any projection or expert of the layer is quantized (an unquantized model is not this block's:
    its norms, RoPE and MoE routing take their own patterns)."""
    attn, switch = m.self_attn, m.mlp.switch_mlp
    parts = [getattr(attn, n, None) for n in (*QKV, "o_proj")] + [m.mlp.gate]
    return any(isinstance(p, nn.QuantizedLinear) for p in parts) \
        or any(experts_format(getattr(switch, n, None)) is not None for n in EXPERTS)


def quantized_moe_decoder_layer(m: nn.Module) -> Site | None:
    """mlx-lm's ``Qwen3MoeDecoderLayer`` with a ``Qwen3MoeSparseMoeBlock`` and quantized projections: the
    layer as two compiled graphs around the KV cache and attention (the module docstring), or, where the
    block cannot take it, a kept site that says why."""
    if not mlx_lm_class(m, "Qwen3MoeDecoderLayer") \
            or not isinstance(getattr(m, "self_attn", None), nn.Module) \
            or not mlx_lm_class(getattr(m, "mlp", None), "Qwen3MoeSparseMoeBlock") or not _quantized(m):
        return None
    fmt = _formats(m)
    if isinstance(fmt, str):
        return Site(KIND, {}, type(m).__name__, lambda shape: [], None, refusal=f"kept mlx-lm's code: {fmt}")
    half, router_tail, up_tail, down_tail = fmt
    k, hd, (heads, kv_heads, _) = half.k, half.hd, half.head_dims
    e, inter = up_tail[2], up_tail[1]
    moe = m.mlp
    topk, normalize = int(moe.top_k), bool(moe.norm_topk_prob)
    tails = [half.qkv_tail, half.o_tail, router_tail, up_tail, down_tail]
    assert half.qk_eps is not None
    eps = (half.eps, *half.qk_eps, float(m.post_attention_layernorm.eps))  # input, q_norm, k_norm, post
    joined: list[Joined] = []  # q/k/v joined, made when the patch is applied

    def plan(shape: tuple[int, ...]) -> list[tuple[str, Shape]]:
        """The layer's kernel calls in the order they run: the input norm, q/k/v, q_norm, k_norm, o, the
        residual add and post-attention norm, the router, the experts' up, gate, down (sorted where
        SwitchGLU sorts them, from 64 pairs; else the decode form, :func:`_expert_params`)."""
        if len(shape) != 3 or shape[-1] != k:
            return []
        rows, pairs = prod(shape[:-1]), prod(shape[:-1]) * topk
        return [
            ("rmsnorm", (rows, k)), (KERNEL, (rows, *half.qkv_tail)), ("rmsnorm", (rows * heads, hd)),
            ("rmsnorm", (rows * kv_heads, hd)), (KERNEL, (rows, *half.o_tail)), ("add_rmsnorm", (rows, k)),
            (KERNEL, (rows, *router_tail)),
            (GATHER, (pairs, *up_tail)), (GATHER, (pairs, *up_tail)), (GATHER, (pairs, *down_tail))]

    def bind(router: Router, shape: tuple[int, ...], dt: Any, own: Call) -> Call | None:
        calls = plan(shape)
        launches = block_launches(router, calls, shape, dt, FUSED)
        if launches is None:
            return None  # one sequence and no custom config: mlx-lm's own code, MLX's ops
        fused_norm, fused_residual = (launches[i] is not None for i in FUSED)
        if fused_residual:  # o's launch adds the residual: the post-attention norm alone after it
            calls[5] = ("rmsnorm", calls[5][1])
        params: list[dict[str, Any]] = [{"eps": eps[0]}, {}, {"eps": eps[1]}, {"eps": eps[2]}, {},
                                        {"eps": eps[3]}, {}, {}, {}, {}][:len(calls)]
        sort = calls[7][1][0] >= SORTED_MIN_PAIRS  # SwitchGLU sorts the pairs by expert
        epilogues: list[dict[str, Any] | None] = [
            None if fused_norm else {}, qkv_params(fused_norm, shape, half.head_dims, eps[0]), {}, {},
            {"residual": True} if fused_residual else {}, {}, {},
            *(_expert_params(router.pick(kernel, s, dt), sort, topk if i < 2 else 1)
              for i, (kernel, s) in enumerate(calls[7:]))]
        resolved = [None if epilogue is None else router.resolved(kernel, s, dt, p, epilogue, fused)
                    for (kernel, s), p, epilogue, fused
                    in zip(calls, params, epilogues, launches, strict=True)]
        counters = [got[0] for got in resolved if got is not None]
        runners = tuple(None if got is None else got[1] for got in resolved)
        pre = pre_graph(half, runners[:4], shape)
        post = _post_graph(runners[4:], shape, (heads * hd, topk, normalize, sort, fused_residual),
                           (up_tail, down_tail))
        key = (runners, shape, tuple(tails), eps, half.rope, topk, normalize)
        graphs = ((pre, router.graph(("moe layer pre", *key), lambda: mx.compile(pre))),
                  (post, router.graph(("moe layer post", *key), lambda: mx.compile(post))))
        qkv = joined[0]

        def inputs(self: Any) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]] | None:
            # a module is a dict of its children and arrays: item lookups, not Module.__getattr__ (a Python
            # call each, ~1.4 us on a 2-core host: 40 us a layer where this looked them up as attributes)
            a, moe = self["self_attn"], self["mlp"]
            if not qkv.current() or moe.sharding_group is not None:
                return None
            experts = moe["switch_mlp"]
            o, r, up, gate, down = (a["o_proj"], moe["gate"], experts["up_proj"], experts["gate_proj"],
                                    experts["down_proj"])
            return ((self["input_layernorm"]["weight"], qkv.weight, qkv.scales, qkv.biases,
                     a["q_norm"]["weight"], a["k_norm"]["weight"]),
                    (o["weight"], o["scales"], o["biases"], self["post_attention_layernorm"]["weight"],
                     r["weight"], r["scales"], r["biases"], up["weight"], up["scales"], up["biases"],
                     gate["weight"], gate["scales"], gate["biases"], down["weight"], down["scales"],
                     down["biases"]))
        backend = runtime.gpu_backend() if router.gpu else None
        decode = decode_graph(post, shape, dt, half.head_dims, backend, router.graph,
                              ("moe layer decode", *key))
        return layer_call(own, counters, graphs, half.sdpa, inputs, decode)

    names: dict[tuple[int, ...], str] = {}
    for name, tail in zip(NAMES, tails, strict=True):
        names[tail] = f"{names[tail]} + {name}" if tail in names and name not in names[tail] else name

    def named(s: Shape) -> str:  # a tuned shape in the report: which projections or norms it is
        tail = tuple(s[1:])
        if tail in names:
            return f"{'T' if len(s) == 6 else 'M'}={s[0]} {names[tail]}"
        return f"{describe(s)} q/k norm" if len(s) == 2 and s[1] == hd != k else describe(s)

    def prepare() -> None:
        joined.append(Joined([getattr(m.self_attn, name) for name in QKV]))

    label = (f"{k} -> {' + '.join(map(str, half.ns))} | {e} experts, top {topk}, {k} -> {inter} -> {k}, "
             f"{half.bits}-bit, group {half.group}")
    others = [f"{n} {t[-2]}-bit group {t[-1]}" for n, t in zip(NAMES, tails, strict=True)
              if t[-2:] != (half.bits, half.group)]
    if others:
        label += f" ({', '.join(others)})"
    label += report_note(half.head_dims, runtime.gpu_backend())
    families = {KERNEL: lambda s: len(s) == 5 and tuple(s[1:]) in names,
                GATHER: lambda s: len(s) == 6 and tuple(s[1:]) in names,
                "rmsnorm": lambda s: len(s) == 2 and s[1] in (k, hd), "add_rmsnorm": rows_of(k)}
    return Site(KIND, families, label, plan, None, bind=bind, describe=named, consumes=CONSUMES,
                prepare=prepare, fused=fused_roles([half.qkv_tail, half.o_tail]))


def _expert_params(pick: Config | None, sort: bool, shared_x: int) -> dict[str, Any] | None:
    """An expert projection's launch parameters, or None where MLX's ``gather_qmm`` runs it as mlx-lm
    calls it: no pick, or unsorted pairs (decode, under 64 pairs) with a pick that takes sorted pairs
    only (:func:`~kernelfleet.kernels.patch.model_quant.decode_form`; ``shared_x``: the experts a token)."""
    if pick is None or not sort:
        return decode_form(pick, shared_x)
    return {}


def _post_graph(runners: tuple[Any, ...], shape: tuple[int, ...], how: tuple[int, int, bool, bool, bool],
                experts: tuple[tuple[int, ...], tuple[int, ...]]) -> Any:
    """The layer's graph after attention, to be ``mx.compile``d, on ``x`` as rows (batch * L, K; ``shape`` is
    the layer's input's) and attention's output. ``runners``: o, the residual add and post-attention norm
    (``rmsnorm`` alone where o's launch adds the residual), the router, then where the pairs are sorted the
    experts' up, gate and down (None: MLX's ``gather_qmm``). ``how``: o's input width, the experts a token,
    whether the top k's weights are normalised, whether SwitchGLU sorts the pairs, whether o adds the
    residual. ``experts``: the (K, N, E, bits, group) of up/gate and of down."""
    o_run, norm_run, router_run, *expert_runs = runners
    up_run, gate_run, down_run = expert_runs if expert_runs else (None, None, None)
    o_in, topk, normalize, sort, fused_residual = how
    (_, inter, _, bits, group), (_, _, _, down_bits, down_group) = experts
    b, length, k = shape
    rows = b * length
    pairs = rows * topk
    one = length == 1
    swiglu = swiglu_fn()
    # gather_qmm's lhs_indices as MLX defaults them (x's batch in order, broadcast against the experts'
    # indices), made once: left out, MLX builds an arange, a reshape and a broadcast in every call. Unsorted,
    # up and gate take a token's row for each of its experts, down a row per pair
    pair_rows = mx.arange(pairs, dtype=mx.uint32)
    token_rows = pair_rows if sort else \
        mx.contiguous(mx.broadcast_to(mx.arange(rows, dtype=mx.uint32)[:, None], (rows, topk)))
    if not sort:
        pair_rows = pair_rows.reshape(rows, topk)
    mx.eval(pair_rows, token_rows)

    def gathered(run: Any, x: mx.array, w: mx.array, s: mx.array, bi: mx.array, lhs: mx.array, idx: mx.array,
                 n: int, fmt: tuple[int, int]) -> mx.array:
        """One expert projection as mlx-lm's QuantizedSwitchLinear calls gather_qmm, or the profile's
        gather_quantized_matmul: on the sorted pairs (x of (pairs, 1, K)), or unsorted, in its decode form
        (x as rows: a token's at up and gate, a pair's at down; the output (pairs, n), no reshapes, since
        each is a primitive a host-bound decode step pays for)."""
        if run is None:
            if not sort and x.ndim == 2:  # down after the decode form's up and gate: gather_qmm's layout
                x = x.reshape(rows, topk, 1, x.shape[-1])
            return mx.gather_qmm(x, w, s, bi, lhs_indices=lhs, rhs_indices=idx, transpose=True,
                                 group_size=fmt[1], bits=fmt[0], mode=MODE, sorted_indices=sort)
        if sort:
            out: mx.array = run([x.reshape(pairs, x.shape[-1]), w, s, bi, idx.astype(mx.uint32)])[0]
            return out.reshape(pairs, 1, n)
        rows_x = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
        return run([rows_x, w, s, bi, idx])[0]

    def post(x: mx.array, attn: mx.array, ow: mx.array, os_: mx.array, ob: mx.array, norm: mx.array,
             rw: mx.array, rs: mx.array, rb: mx.array, uw: mx.array, us: mx.array, ub: mx.array,
             gw: mx.array, gs: mx.array, gb: mx.array, dw: mx.array, ds: mx.array, db: mx.array) -> mx.array:
        a = attention_rows(attn, one, rows, o_in)
        if fused_residual:
            h = o_run([a, ow, os_, ob, x])[0]
            normed = norm_run([h, norm])[0]
        else:
            normed, h = norm_run([x, o_run([a, ow, os_, ob])[0], norm])
        # Qwen3MoeSparseMoeBlock.__call__: the router, softmax, top k, their weights normalised
        gates = mx.softmax(router_run([normed, rw, rs, rb])[0], axis=-1, precise=True)
        inds = mx.argpartition(gates, kth=-topk, axis=-1)[..., -topk:]
        scores = mx.take_along_axis(gates, inds, axis=-1)
        if normalize:
            scores = scores / mx.sum(scores, axis=-1, keepdims=True)
        # SwitchGLU.__call__: sorted by expert from 64 pairs on (_gather_sort), unsorted after
        if sort:
            flat = inds.flatten()
            order = mx.argsort(flat)
            inv_order = mx.argsort(order)
            xs, idx = normed.reshape(rows, 1, k)[order // topk], flat[order]
        elif up_run is None:
            xs, idx = normed.reshape(rows, 1, 1, k), inds
        else:  # the decode form: x the tokens' rows, the indices made contiguous once for the three launches
            xs, idx = normed, mx.contiguous(inds)
        x_up = gathered(up_run, xs, uw, us, ub, token_rows, idx, inter, (bits, group))
        x_gate = gathered(gate_run, xs, gw, gs, gb, token_rows, idx, inter, (bits, group))
        y = gathered(down_run, swiglu(x_gate, x_up), dw, ds, db, pair_rows, idx, k, (down_bits, down_group))
        if sort:
            y = y[inv_order]
        y = y.reshape(rows, topk, k)
        y = (y * scores[..., None]).sum(axis=-2).astype(y.dtype)
        out: mx.array = (h + y).reshape(b, length, k)
        return out
    return post
