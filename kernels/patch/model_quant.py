"""Quantized layers for :func:`kernelfleet.patch`: ``mlx.nn.QuantizedLinear`` through the catalog's
``quantized_matmul``, picked per call by M, the tokens in the call.

A ``QuantizedLinear`` holds MLX's affine format: ``weight`` (uint32, N x K*bits/32), ``scales`` and
``biases`` (N x K/group_size), an optional ``bias`` (N). Its call is
``mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size, bits, mode)`` over every
leading dimension of ``x``, then ``+ bias``. The patch matches the class exactly (a subclass keeps
its own code) and only where the source of its ``__call__`` is that computation. A layer in another
format (mode, bits, group size, packing) keeps MLX's op and the report says why.

The kernel's shape is ``M x K x N x bits x group_size`` with M the product of ``x``'s leading
dimensions, so a decode step (M = batch), a draft-verify or batched call (M = 2..32) and a prefill
(M = tokens) each find their own profile entry. Each (input shape, dtype) is resolved once, on the
first call of that shape (:func:`bind`): the profile's config, the runner from
:func:`kernelfleet.kernels.patch.runtime.resolve`, and one ``mx.compile``d graph of ``x`` reshaped to
``(M, K)``, the kernel and the output reshaped back, shared by every layer of the same shape. A later
call is a dictionary lookup (:func:`kernelfleet.kernels.patch.model_patterns.wrap`), the counts of the
report and the graph's replay. Where the profile has no custom config at that M, MLX's op runs: the
layer's own ``__call__`` where ``x`` is ``(M, K)`` or ``(1, M, K)``, else MLX's op on ``x`` reshaped to
``(M, K)`` (:func:`_mlx_graph`: the same values, and MLX runs a batch of single-token rows as one matmul
instead of one matrix-vector product per row).

A dense gated MLP whose three projections are such layers is patched as one block
(:func:`quantized_gated_mlp`): gate, up, the activation and down in one compiled graph per input
shape, so a decode step makes one call from Python for it instead of four.

mlx-lm's ``QuantizedSwitchLinear`` (MoE experts, ``mx.gather_qmm``) runs the catalog's
``gather_quantized_matmul`` where ``SwitchGLU`` hands it (token, expert) pairs sorted by expert
(:func:`quantized_experts`); its unsorted calls (decode) its decode form, where the profile picks it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..catalog.gather_quantized_matmul_kernel import ORDER_FREE, SORTED_MIN_PAIRS
from ..common import prod
from ..render.launch import interceptor
from ..spec import Config, Shape
from .model_patterns import Call, Router, Site, gated_activation, source_has

KERNEL = "quantized_matmul"
GATHER = "gather_quantized_matmul"
MODE = "affine"
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
FLOATS = (mx.float16, mx.bfloat16, mx.float32)

# mlx.nn.QuantizedLinear.__call__ as this patch replaces it (MLX 0.32)
QUANTIZED_LINEAR_LINES = (
    'x = mx.quantized_matmul( x, self["weight"], scales=self["scales"], biases=self.get("biases"), '
    "transpose=True, group_size=self.group_size, bits=self.bits, mode=self.mode, )",
    'if "bias" in self: x = x + self["bias"]',
    "return x",
)


def format_refusal(mode: Any, bits: Any, group: Any) -> str | None:
    """Why ``quantized_matmul`` cannot take weights quantized this way (None: it can)."""
    if mode != MODE:
        return f"mode {mode!r} (quantized_matmul takes {MODE!r})"
    if bits not in BITS:
        return f"{bits}-bit (quantized_matmul takes {' or '.join(map(str, BITS))} bits)"
    if group not in GROUP_SIZES:
        return f"group size {group} (quantized_matmul takes {', '.join(map(str, GROUP_SIZES))})"
    return None


def layer_format(m: nn.Module, experts: bool = False) -> tuple[int, int, int, int, int] | str:
    """(K, N, E, bits, group_size) of a ``QuantizedLinear`` (E 0) or, ``experts``, of mlx-lm's
    ``QuantizedSwitchLinear`` (E experts), or why the catalog's kernel cannot take it."""
    mode, bits, group = getattr(m, "mode", None), getattr(m, "bits", None), getattr(m, "group_size", None)
    refusal = format_refusal(mode, bits, group)
    if refusal is not None:
        return refusal
    assert isinstance(bits, int) and isinstance(group, int)
    if experts and getattr(m, "global_scale", None) is not None:
        return "a global scale (nvfp4's)"
    w, scales, biases = m.get("weight"), m.get("scales"), m.get("biases")
    if biases is None:
        return "no biases (affine quantization has them)"
    rank = 3 if experts else 2
    if not (isinstance(w, mx.array) and isinstance(scales, mx.array) and isinstance(biases, mx.array)) \
            or not w.ndim == scales.ndim == biases.ndim == rank or w.dtype != mx.uint32:
        return f"weight, scales and biases are not MLX's packed {rank}-D layout"
    lead, n, k = tuple(w.shape[:-2]), int(w.shape[-2]), int(w.shape[-1]) * 32 // bits
    if k % group or tuple(scales.shape) != (*lead, n, k // group) or tuple(biases.shape) != scales.shape \
            or scales.dtype not in FLOATS or biases.dtype != scales.dtype:
        return f"scales or biases {tuple(scales.shape)} do not match a {n} x {k} weight in groups of {group}"
    bias = m.get("bias")
    if bias is not None and (experts or not isinstance(bias, mx.array) or tuple(bias.shape) != (n,)):
        shape = tuple(getattr(bias, "shape", ()))
        return f"a bias of shape {shape} (the patch adds a bias of {n} to a linear layer)"
    return k, n, int(lead[0]) if experts else 0, bits, group


def _format_label(m: nn.Module) -> str:
    return f"{getattr(m, 'bits', '?')}-bit, group {getattr(m, 'group_size', '?')}, {getattr(m, 'mode', '?')}"


def describe(shape: Shape) -> str:
    return f"M={shape[0]}"


def quantized_linear(m: nn.Module) -> Site | None:
    """``mlx.nn.QuantizedLinear``: its quantized matmul (the bias is added after it, as MLX does)."""
    if type(m) is not nn.QuantizedLinear:
        return None
    fmt = layer_format(m)
    if isinstance(fmt, str):
        return Site("quantized linear", {}, _format_label(m), lambda shape: [], None,
                    refusal=f"kept MLX's op: {fmt}")
    if not source_has(nn.QuantizedLinear, *QUANTIZED_LINEAR_LINES):
        return Site("quantized linear", {}, f"{fmt[0]} -> {fmt[1]}", lambda shape: [], None,
                    refusal="kept MLX's op: mlx.nn.QuantizedLinear.__call__ is not the computation this "
                            f"patch replaces (MLX {getattr(mx, '__version__', '?')})")
    k, n, _, bits, group = fmt
    tail = (k, n, bits, group)

    def bind(router: Router, shape: tuple[int, ...], dt: Any, own: Call) -> Call | None:
        if not shape or shape[-1] != k:
            return None
        rows = prod(shape[:-1])
        call = (KERNEL, (rows, *tail), dt)
        if not router.picks(call):
            if prod(shape[:-2]) <= 1:  # x is already (M, K) to MLX: the layer's own call
                return None
            mlx_graph = router.graph(("mlx", shape, tail), lambda: _mlx_graph(shape, rows, k, n, bits, group))
            return _mlx_call(router, mlx_graph)
        counter, runner = router.resolved(*call, {})
        # keyed by the runner: resolved once per process for its plain values
        graph = router.graph((runner, shape), lambda: _graph(runner, shape, rows, k, n))
        return _call(counter, runner, graph, rows, k, n, shape)

    return Site("quantized linear", {KERNEL: lambda s: len(s) == 5 and s[1:] == tail},
                f"{k} -> {n}, {bits}-bit, group {group}", lambda shape: [(KERNEL, (prod(shape[:-1]), *tail))],
                None, bind=bind, describe=describe, single_input=True)


def _graph(runner: Any, shape: tuple[int, ...], rows: int, k: int, n: int) -> Any:
    """The kernel on ``x`` of ``shape``: reshaped to (M, K), run, reshaped back, plus the layer's
    ``bias`` where it has one; one ``mx.compile``d graph, so the reshapes and the add cost no host
    time per call (the runner's own graph is traced into it)."""
    lead = shape[:-1]

    def fn(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *bias: mx.array) -> mx.array:
        out: mx.array = runner([x.reshape(rows, k), w, scales, biases])[0].reshape(*lead, n)
        return out + bias[0] if bias else out
    return mx.compile(fn)


def _mlx_graph(shape: tuple[int, ...], rows: int, k: int, n: int, bits: int, group: int) -> Any:
    """MLX's own op on ``x`` reshaped to ``(M, K)``, as one ``mx.compile``d graph (bias added as the
    layer does): the same rows in the same order, the layer's values bit for bit (the tests check it on
    CPU; ``benchmarks/results/h200_decode8_why.txt`` on CUDA). MLX 0.32's CUDA backend takes 2.5-7.9x
    the time on ``x`` of ``(B, 1, K)`` (a decode step of B sequences, as mlx-lm passes it) that it takes
    on ``(B, K)`` at B = 8 (H200, 4 and 8 bits; 4-bit 4096x14336: 210 against 32 µs), and the profile's
    built-in is timed on ``(M, K)``."""
    lead = shape[:-1]

    def fn(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, *bias: mx.array) -> mx.array:
        out = mx.quantized_matmul(x.reshape(rows, k), w, scales, biases, transpose=True, group_size=group,
                                  bits=bits, mode=MODE).reshape(*lead, n)
        return out + bias[0] if bias else out
    return mx.compile(fn)


def _mlx_call(router: Router, graph: Any) -> Call:
    """A call that keeps MLX's op (counted as the module's own code), through :func:`_mlx_graph`."""
    module_calls = router._module

    def call(self: Any, x: mx.array) -> mx.array:
        module_calls[0] += 1
        if "bias" in self:
            return graph(x, self["weight"], self["scales"], self["biases"], self["bias"])
        return graph(x, self["weight"], self["scales"], self["biases"])
    return call


def _call(counter: list[int], runner: Any, graph: Any, rows: int, k: int, n: int, shape: Sequence[int]
          ) -> Call:
    lead = tuple(shape[:-1])

    def call(self: Any, x: mx.array) -> mx.array:
        counter[0] += 1
        if interceptor() is not None:  # launches recorded (launch.capture): the plain path, no trace
            y = runner([x.reshape(rows, k), self["weight"], self["scales"], self["biases"]])[0]
            return y.reshape(*lead, n) + self["bias"] if "bias" in self else y.reshape(*lead, n)
        if "bias" in self:
            return graph(x, self["weight"], self["scales"], self["biases"], self["bias"])
        return graph(x, self["weight"], self["scales"], self["biases"])
    return call


# mlx-lm's QuantizedSwitchLinear.__call__ as this patch replaces it (mlx-lm 0.32)
QUANTIZED_EXPERTS_LINES = (
    'x = mx.gather_qmm( x, self["weight"], self["scales"], self.get("biases"), rhs_indices=indices, '
    "transpose=True, group_size=self.group_size, bits=self.bits, mode=self.mode, "
    "global_scale=self.global_scale, sorted_indices=sorted_indices, )",
    "return x",
)


def experts_format(m: Any) -> tuple[int, int, int, int, int] | str | None:
    """(K, N, E, bits, group_size) of mlx-lm's ``QuantizedSwitchLinear`` (its ``__call__`` checked), why the
    catalog's kernel cannot take it, or None for any other module."""
    cls: type = type(m)
    if not (cls.__module__.startswith("mlx_lm.models.") and cls.__name__ == "QuantizedSwitchLinear"):
        return None
    fmt = layer_format(m, experts=True)
    if not isinstance(fmt, str) and not source_has(cls, *QUANTIZED_EXPERTS_LINES):
        return "QuantizedSwitchLinear.__call__ is not the computation this patch replaces"
    return fmt


def quantized_experts(m: nn.Module) -> Site | None:
    """mlx-lm's ``QuantizedSwitchLinear`` (MoE experts, ``mx.gather_qmm``) through the catalog's
    ``gather_quantized_matmul``, which takes (token, expert) pairs sorted by expert: the calls
    ``SwitchGLU`` makes once it routes 64 pairs or more (prefill, larger batches), with ``x`` of
    ``(T, 1, K)`` and ``T`` indices. Its unsorted calls (decode: ``x`` of ``(..., 1, 1, K)`` a token at up
    and gate, ``(..., experts, 1, K)`` a pair at down, indices ``(..., experts)``) run the kernel's decode
    form where the profile picks an order-free path at those pairs (:func:`_unsorted`), else MLX's op."""
    fmt = experts_format(m)
    if fmt is None:
        return None
    if isinstance(fmt, str):
        return Site("quantized experts", {}, _format_label(m), lambda shape: [], None,
                    refusal=f"kept MLX's gather_qmm: {fmt}")
    k, n, e, bits, group = fmt
    tail = (k, n, e, bits, group)

    def pairs(shape: tuple[int, ...]) -> int | None:
        """T where ``x`` is (T, 1, K), as SwitchGLU hands sorted pairs; None for any other shape."""
        return shape[0] if len(shape) == 3 and shape[1] == 1 and shape[2] == k else None

    def bind(router: Router, shape: tuple[int, ...], dt: Any, own: Call) -> Call | None:
        t = pairs(shape)
        if t is None:
            return _unsorted(router, shape, dt, own, tail)
        if not router.picks(call := (GATHER, (t, *tail), dt)):
            return None
        counter, runner = router.resolved(*call, {})

        def fn(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, idx: mx.array) -> mx.array:
            out: mx.array = runner([x.reshape(t, k), w, scales, biases, idx.astype(mx.uint32)])[0]
            return out.reshape(t, 1, n)
        graph = router.graph((runner, shape), lambda: mx.compile(fn))

        def gathered(self: Any, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
            if not sorted_indices:
                return own(self, x, indices, sorted_indices)
            counter[0] += 1
            w, scales, biases = self["weight"], self["scales"], self["biases"]
            if interceptor() is not None:  # launches recorded: the plain path, no trace
                out: mx.array = runner([x.reshape(t, k), w, scales, biases, indices.astype(mx.uint32)])[0]
                return out.reshape(t, 1, n)
            return graph(x, w, scales, biases, indices)
        return gathered

    def plan(shape: tuple[int, ...]) -> list[tuple[str, Shape]]:
        t = pairs(shape)
        return [] if t is None else [(GATHER, (t, *tail))]

    return Site("quantized experts", {GATHER: lambda s: len(s) == 6 and s[1:] == tail},
                f"{e} experts, {k} -> {n}, {bits}-bit, group {group}", plan, None, bind=bind,
                describe=lambda s: f"T={s[0]}")


def decode_form(pick: Config | None, shared_x: int) -> dict[str, Any] | None:
    """The launch parameters of an expert projection on unsorted pairs (decode, under 64): the decode form
    of ``gather_quantized_matmul`` where the profile's pick takes pairs in any order, ``shared_x`` pairs in a
    row on one row of x (a token's experts at up and gate); None where MLX's ``gather_qmm`` runs instead."""
    if pick is None or pick.get("path") not in ORDER_FREE:
        return None
    return {"sorted_pairs": False, **({"shared_x": shared_x} if shared_x > 1 else {})}


def _unsorted(router: Router, shape: tuple[int, ...], dt: Any, own: Call, tail: tuple[int, ...]
              ) -> Call | None:
    """A ``QuantizedSwitchLinear`` call on unsorted pairs, x of ``shape``: ``gather_quantized_matmul``'s
    decode form (``shared_x`` pairs a row of x, in the router's order) where the profile picks an
    order-free path at the call's pairs, else MLX's op. The pairs come with the indices, so the first call
    per indices shape decides: x's rows must be the indices' leading rows, one a pair or one for all the
    experts of a token (gather_qmm's broadcast as SwitchGLU calls it)."""
    k, n = tail[0], tail[1]
    if len(shape) < 4 or shape[-2] != 1 or shape[-1] != k:
        return None
    lead = shape[:-2]
    decided: dict[tuple[int, ...], tuple[list[int], Any] | None] = {}

    def decide(ishape: tuple[int, ...]) -> tuple[list[int], Any] | None:
        if lead == ishape:
            shared = 1  # a row a pair: down
        elif lead == (*ishape[:-1], 1):
            shared = ishape[-1]  # a token's row for its experts: up and gate
        else:
            return None
        pairs = prod(ishape)
        params = decode_form(router.pick(GATHER, (pairs, *tail), dt), shared) \
            if pairs < SORTED_MIN_PAIRS else None
        return None if params is None else router.resolved(GATHER, (pairs, *tail), dt, {}, params)

    def gathered(self: Any, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        if sorted_indices:
            return own(self, x, indices, sorted_indices)
        ishape = tuple(indices.shape)
        if ishape not in decided:
            decided[ishape] = decide(ishape)
        hit = decided[ishape]
        if hit is None:
            return own(self, x, indices, sorted_indices)
        counter, runner = hit
        counter[0] += 1
        idx = indices if indices.dtype == mx.uint32 else indices.astype(mx.uint32)  # as the kernel reads them
        out: mx.array = runner([x.reshape(-1, k), self["weight"], self["scales"], self["biases"], idx])[0]
        return out.reshape(*ishape, 1, n)
    return gathered


PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # a gated MLP's and SwitchGLU's, in mlx-lm's names
QKV = ("q_proj", "k_proj", "v_proj")
ARRAYS = ("weight", "scales", "biases")


def joined_format(parts: Sequence[Any]) -> tuple[int, tuple[int, ...], int, int] | None:
    """(K, each part's N, bits, group) where ``parts`` are bias-free ``QuantizedLinear`` layers of one
    input and one format that the catalog's kernel takes (so they can run as one quantized matmul over
    their weights joined along N); else None."""
    if not all(type(p) is nn.QuantizedLinear and "bias" not in p for p in parts) \
            or not source_has(nn.QuantizedLinear, *QUANTIZED_LINEAR_LINES):
        return None
    formats: list[tuple[int, int, int, int, int]] = []
    for p in parts:
        fmt = layer_format(p)
        if isinstance(fmt, str):
            return None  # each layer's own pattern says why it keeps MLX's op
        formats.append(fmt)
    k, _, _, bits, group = formats[0]
    if any((f[0], f[3], f[4]) != (k, bits, group) for f in formats) \
            or len({p["scales"].dtype for p in parts}) != 1:
        return None
    return k, tuple(f[1] for f in formats), bits, group


class Joined:
    """Quantized projections of one input (q/k/v, gate/up) as one quantized matmul: their weights,
    scales and biases joined along N once, when the patch is applied, and each projection's own arrays
    replaced by views into the joined ones. No second copy is kept, so memory stays what it was, and
    the projections' own calls (MLX's op, at the calls the profile leaves to it) read the same values.
    :func:`kernelfleet.unpatch` leaves the views: they hold the layer's values bit for bit. A call checks
    that the projections still hold those views (:meth:`current`); after ``load_weights`` or
    ``update`` the module's own code runs."""

    def __init__(self, parts: Sequence[nn.Module]) -> None:
        joined = [mx.concatenate([p[name] for p in parts]) for name in ARRAYS]
        mx.eval(joined)
        self.weight, self.scales, self.biases = joined
        start = 0
        for p in parts:
            n = int(p["weight"].shape[0])
            for name, array in zip(ARRAYS, joined, strict=True):
                p[name] = array[start:start + n]
            start += n
        mx.eval([p[name] for p in parts for name in ARRAYS])
        self._held = tuple((p, p["weight"], p["scales"], p["biases"]) for p in parts)

    def current(self) -> bool:
        """Whether every projection still holds its views into the joined arrays."""
        for p, w, s, b in self._held:
            if p["weight"] is not w or p["scales"] is not s or p["biases"] is not b:
                return False
        return True


def gated_mlp_format(m: nn.Module) -> tuple[str, int, int, list[tuple[int, ...]]] | None:
    """(the activation's catalog kernel, K, the intermediate size, the (K, N, bits, group) of gate and
    up joined and of down) where ``m`` is mlx-lm's dense gated MLP whose three projections are
    bias-free ``QuantizedLinear`` layers the catalog's kernel takes, gate and up in one format; else
    None."""
    act = gated_activation(m)
    if act is None:
        return None
    projections = [getattr(m, name, None) for name in PROJECTIONS]
    up_fmt, down_fmt = joined_format(projections[:2]), joined_format(projections[2:])
    if up_fmt is None or down_fmt is None:
        return None
    (k, (inter, n_up), bits, group), (k_down, (n_down,), bits_down, group_down) = up_fmt, down_fmt
    if (n_up, k_down, n_down) != (inter, inter, k):
        return None
    return act, k, inter, [(k, 2 * inter, bits, group), (inter, k, bits_down, group_down)]


def quantized_gated_mlp(m: nn.Module) -> Site | None:
    """mlx-lm's dense gated MLP (:func:`~kernelfleet.kernels.patch.model_patterns.gated_activation`) whose
    three projections are ``QuantizedLinear`` layers the catalog's kernel takes, without biases, gate and
    up in one format: the whole block, ``down(act(gate(x)) * up(x))``, becomes one ``mx.compile``d graph
    per input shape. Gate and up run as one ``quantized_matmul`` over their joined weights
    (:class:`Joined`: ``K x 2*inter``), then the activation on its two halves, then down, each at the
    profile's config for that M (the built-in where it has none). A decode step's host time is paid per
    call from Python and per launch (``benchmarks/decode_floor.py --routes``): this makes one call of the
    block's four, and two quantized launches of its three. Where no kernel of the block has a custom
    config at a call's M and ``x`` is one sequence, the block runs its own code, every projection MLX's
    op as in the stock model."""
    fmt = gated_mlp_format(m)
    if fmt is None:
        return None  # each projection's own pattern says why, or runs alone
    act, k, inter, tails = fmt
    bits, group = tails[0][2:]
    projections = [getattr(m, name) for name in PROJECTIONS]
    joined: list[Joined] = []  # the joined gate/up, made when the patch is applied

    def plan(shape: tuple[int, ...]) -> list[tuple[str, Shape]]:
        rows = prod(shape[:-1])
        return [(KERNEL, (rows, *tails[0])), (act, (rows, inter)), (KERNEL, (rows, *tails[1]))]

    def bind(router: Router, shape: tuple[int, ...], dt: Any, own: Call) -> Call | None:
        if not shape or shape[-1] != k:
            return None
        calls = plan(shape)
        if not router.picks(*((kernel, s, dt) for kernel, s in calls)) and prod(shape[:-2]) <= 1:
            return None
        resolved = [router.resolved(kernel, s, dt, {}) for kernel, s in calls]
        counters = [counter for counter, _ in resolved]
        runners = tuple(runner for _, runner in resolved)
        plain = _block(runners, shape, k, inter)
        graph = router.graph((runners, shape), lambda: mx.compile(plain))
        gu = joined[0]

        def call(self: Any, x: mx.array) -> mx.array:
            if not gu.current():
                return own(self, x)
            for counter in counters:
                counter[0] += 1
            d = self.down_proj
            fn = plain if interceptor() is not None else graph  # launches recorded: no trace
            return fn(x, gu.weight, gu.scales, gu.biases, d["weight"], d["scales"], d["biases"])
        return call

    def member(s: Shape) -> bool:
        return len(s) == 5 and tuple(s[1:]) in tails

    def named(s: Shape) -> str:  # a tuned shape in the report: which projections it is
        if len(s) != 5 or tails[0] == tails[1]:
            return describe(s)
        return f"M={s[0]} {'down' if tuple(s[1:]) == tails[1] else 'gate/up'}"

    label = f"{k} -> {inter} -> {k}, {bits}-bit, group {group}"
    if tails[1][2:] != (bits, group):
        label += f" (down {tails[1][2]}-bit, group {tails[1][3]})"
    return Site("quantized gated MLP", {KERNEL: member, act: lambda s: len(s) == 2 and s[1] == inter},
                label, plan, None, bind=bind, describe=named, consumes=PROJECTIONS, single_input=True,
                prepare=lambda: joined.append(Joined(projections[:2])))


def _block(runners: Sequence[Any], shape: tuple[int, ...], k: int, inter: int) -> Any:
    """The gated MLP on ``x`` of ``shape`` through ``runners`` (gate and up joined, activation, down)."""
    gate_up, act, down = runners
    rows, lead = prod(shape[:-1]), shape[:-1]

    def fn(x: mx.array, w: mx.array, s: mx.array, b: mx.array, dw: mx.array, ds: mx.array, db: mx.array
           ) -> mx.array:
        gu = gate_up([x.reshape(rows, k), w, s, b])[0]
        h = act([gu[:, :inter], gu[:, inter:]])[0]
        out: mx.array = down([h, dw, ds, db])[0]
        return out.reshape(*lead, k)
    return fn


# mlx-lm's llama Attention.__call__ (mlx-lm 0.32), as quantized_attention replaces it: the code after the
# projections is the same in the replacement
ATTENTION_LINES = (
    "B, L, D = x.shape",
    "queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)",
    "queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3) "
    "keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3) "
    "values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)",
    "if cache is not None: queries = self.rope(queries, offset=cache.offset) "
    "keys = self.rope(keys, offset=cache.offset) keys, values = cache.update_and_fetch(keys, values) "
    "else: queries = self.rope(queries) keys = self.rope(keys)",
    "output = scaled_dot_product_attention( queries, keys, values, cache=cache, scale=self.scale, "
    "mask=mask )",
    "output = output.transpose(0, 2, 1, 3).reshape(B, L, -1) return self.o_proj(output)",
)


def attention_function(m: nn.Module) -> Any:
    """mlx-lm's ``scaled_dot_product_attention`` as the module of ``m``'s class calls it (None: none)."""
    return vars(inspect.getmodule(type(m)) or nn).get("scaled_dot_product_attention")


def attention_format(m: nn.Module, lines: Sequence[str] = ATTENTION_LINES
                     ) -> tuple[int, tuple[int, ...], int, int, int, int, int] | None:
    """(K, the N of q, k and v, bits, group, heads, KV heads, head dim) where ``m`` is an mlx-lm
    ``Attention`` whose ``__call__`` has ``lines`` (llama's by default; Qwen3-MoE's:
    :data:`kernelfleet.kernels.patch.model_moe_layer.ATTENTION_LINES`) and whose q, k and v are bias-free
    ``QuantizedLinear`` layers of one format the catalog's kernel takes; else None."""
    if not (type(m).__module__.startswith("mlx_lm.models.") and type(m).__name__ == "Attention") \
            or not source_has(type(m), *lines) or attention_function(m) is None:
        return None
    fmt = joined_format([getattr(m, name, None) for name in QKV])
    if fmt is None:
        return None
    k, ns, bits, group = fmt
    heads, kv_heads = int(getattr(m, "n_heads", 0)), int(getattr(m, "n_kv_heads", 0))
    hd = ns[0] // heads if heads else 0
    if not hd or ns != (heads * hd, kv_heads * hd, kv_heads * hd):
        return None
    return k, ns, bits, group, heads, kv_heads, hd


def split_heads(qkv: mx.array, b: int, length: int, heads: int, kv_heads: int, hd: int,
                norm: Callable[[mx.array, mx.array], tuple[mx.array, mx.array]] | None = None
                ) -> tuple[mx.array, mx.array, mx.array]:
    """Joined q/k/v rows (``b * length`` x their N) as mlx-lm's attention hands them on: queries, keys and
    values of ``(b, heads, length, hd)``. ``norm``: what Qwen3's attention does to queries and keys of
    ``(b, length, heads, hd)`` before the transpose (its per-head ``q_norm`` and ``k_norm``)."""
    t = qkv.reshape(b, length, heads + 2 * kv_heads, hd)
    q, k, v = t[:, :, :heads], t[:, :, heads:heads + kv_heads], t[:, :, heads + kv_heads:]
    if norm is not None:
        q, k = norm(q, k)
    return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def quantized_attention(m: nn.Module) -> Site | None:
    """mlx-lm's llama ``Attention`` (Llama, Mistral) whose q, k and v projections are bias-free
    ``QuantizedLinear`` layers of one format: q, k and v run as one ``quantized_matmul`` over their
    joined weights (:class:`Joined`: ``K x (heads + 2 kv heads) * head_dim``), split into heads in the
    same compiled graph; the rest (RoPE, the KV cache, attention, ``o_proj``) is mlx-lm's code, each
    module called as before. One quantized launch and one call from Python instead of three. Where the
    profile has no custom config at a call's M, a batch of sequences runs MLX's op on the joined weights
    and ``x`` as ``(M, K)``, and one sequence the module's own code."""
    fmt = attention_format(m)
    if fmt is None:
        return None
    k, ns, bits, group, heads, kv_heads, hd = fmt
    parts = [getattr(m, name) for name in QKV]
    sdpa = attention_function(m)
    tail = (k, sum(ns), bits, group)
    joined: list[Joined] = []  # the joined q/k/v, made when the patch is applied

    def plan(shape: tuple[int, ...]) -> list[tuple[str, Shape]]:
        return [(KERNEL, (prod(shape[:-1]), *tail))] if len(shape) == 3 and shape[-1] == k else []

    def bind(router: Router, shape: tuple[int, ...], dt: Any, own: Call) -> Call | None:
        calls = plan(shape)
        if not calls or (not router.picks((KERNEL, calls[0][1], dt)) and shape[0] <= 1):
            return None  # one sequence and no custom config: mlx-lm's own code, MLX's op on (1, L, K)
        # the profile's config, or the catalog's built-in (MLX's op on x as (M, K), as the quantized
        # linear layers run a decode batch: _mlx_graph)
        counter, runner = router.resolved(KERNEL, calls[0][1], dt, {})
        b, length = shape[0], shape[1]

        def heads_of(x: mx.array, w: mx.array, s: mx.array, bi: mx.array
                     ) -> tuple[mx.array, mx.array, mx.array]:
            qkv = runner([x.reshape(b * length, k), w, s, bi])[0]
            return split_heads(qkv, b, length, heads, kv_heads, hd)
        graph = router.graph((runner, shape, heads, kv_heads), lambda: mx.compile(heads_of))
        qkv = joined[0]

        def call(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
            if not qkv.current():
                return own(self, x, mask, cache)
            counter[0] += 1
            fn = heads_of if interceptor() is not None else graph  # launches recorded: no trace
            queries, keys, values = fn(x, qkv.weight, qkv.scales, qkv.biases)
            if cache is not None:
                queries = self.rope(queries, offset=cache.offset)
                keys = self.rope(keys, offset=cache.offset)
                keys, values = cache.update_and_fetch(keys, values)
            else:
                queries = self.rope(queries)
                keys = self.rope(keys)
            output = sdpa(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
            return self.o_proj(output.transpose(0, 2, 1, 3).reshape(b, length, -1))
        return call

    return Site("quantized attention projections", {KERNEL: lambda s: len(s) == 5 and tuple(s[1:]) == tail},
                f"{k} -> {' + '.join(map(str, ns))}, {bits}-bit, group {group}", plan, None, bind=bind,
                describe=lambda s: f"M={s[0]} q/k/v", consumes=QKV,
                prepare=lambda: joined.append(Joined(parts)))


# blocks first: a block takes over the layers it holds (model_patch matches these before the others)
BLOCKS = (quantized_gated_mlp, quantized_attention)
PATTERNS = (quantized_linear, quantized_experts)
