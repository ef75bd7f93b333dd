"""What :func:`kernelfleet.patch` recognises in an mlx-lm model, and the call that replaces each.

A pattern matches one module and returns a :class:`Site`: the catalog kernels the module's computation
maps onto, the shape family per kernel (one model dimension, any number of tokens), and the
replacement ``__call__``. Modules of mlx-lm classes are matched only where the source of their
``__call__`` is the computation replaced here (checked with :func:`inspect.getsource`), so a changed
mlx-lm or another architecture keeps its own code. Each replacement asks its :class:`Router` per call
which config the profile holds for the exact (kernel, shape, dtype) and runs it through
:func:`kernelfleet.kernels.patch.runtime.run` (the catalog's built-in where there is none).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..catalog import get_spec
from ..common import dtype_name, prod
from ..spec import BUILTIN, BadShape, Config, Shape, format_shape
from . import runtime
from .profile_view import ProfileView

Member = Callable[[Shape], bool]


@dataclass
class Router:
    """Per patched module: the profile's choice per call, and which path each call took.

    A call where the profile holds a custom config for one of its kernels at the exact shape takes the
    kernel path: each kernel runs its profile config, or the catalog's built-in where it has none.
    Any other call runs the module's own code (``module`` calls). With ``gpu`` False (CPU, or
    ``patch(custom_kernels=False)``) the kernel path is taken at the same calls but every kernel runs
    as the catalog's built-in."""

    view: ProfileView
    gpu: bool  # custom kernels can run on this backend
    _module: list[int] = field(default_factory=lambda: [0], repr=False)  # own-code calls, as a cell
    params: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # their parameters
    _memo: dict[tuple[str, Shape, Any], tuple[tuple[str, str, str], Config | None]] = field(
        default_factory=dict, repr=False)
    _fused_memo: dict[tuple[str, Shape, Any], Config | None] = field(default_factory=dict, repr=False)
    _runners: dict[tuple[Any, ...], tuple[list[int], runtime.Runner]] = field(
        default_factory=dict, repr=False)
    shared: dict[Any, Any] = field(default_factory=dict, repr=False)  # one patch's graphs, by plain values
    _tally: dict[tuple[str, str, str], list[int]] = field(default_factory=dict, repr=False)  # runs a key
    _custom_keys: set[tuple[str, str, str]] = field(default_factory=set, repr=False)

    def graph(self, key: Any, build: Callable[[], Any]) -> Any:
        """The patch's graph under ``key`` in :attr:`shared`, built by ``build`` the first time."""
        got = self.shared.get(key)
        if got is None:
            got = self.shared[key] = build()
        return got

    @property
    def module(self) -> int:
        """Calls that ran the module's own code."""
        return self._module[0]

    @property
    def seen(self) -> dict[tuple[str, str, str], int]:
        """Kernel runs per (kernel, shape, dtype) key."""
        return {key: cell[0] for key, cell in self._tally.items()}

    @property
    def custom(self) -> int:
        """Kernel runs with a profile config (on CPU these execute as the built-in)."""
        return sum(cell[0] for key, cell in self._tally.items() if key in self._custom_keys)

    @property
    def builtin(self) -> int:
        """Kernel runs as the catalog's built-in (the call's other kernels had a profile config)."""
        return sum(cell[0] for key, cell in self._tally.items() if key not in self._custom_keys)

    def _choice(self, kernel: str, shape: Shape, dt: Any) -> tuple[tuple[str, str, str], Config | None]:
        memo_key = (kernel, shape, dt)
        hit = self._memo.get(memo_key)
        if hit is None:  # decided once per (kernel, shape, dtype): calls stay cheap
            dtype = dtype_name(dt) if dt in (mx.float32, mx.float16, mx.bfloat16) else ""
            config = self.view.choice(kernel, shape, dtype)
            if config is not None and not self._fits(kernel, shape):
                config = None
            hit = self._memo[memo_key] = ((kernel, format_shape(shape), dtype), config)
        return hit

    def picks(self, *calls: tuple[str, Shape, Any]) -> bool:
        """Whether any of these (kernel, shape, dtype) calls has a custom config in the profile."""
        return any(self.pick(*c) is not None for c in calls)

    def pick(self, kernel: str, shape: Shape, dt: Any) -> Config | None:
        """The profile's custom config for a call, on any backend (:meth:`choice` is what runs here)."""
        return self._choice(kernel, shape, dt)[1]

    def own(self, orig: Call, module: Any, *args: Any, **kwargs: Any) -> Any:
        self._module[0] += 1
        return orig(module, *args, **kwargs)

    def choice(self, kernel: str, shape: Shape, dt: Any) -> Config | None:
        """The config a call of ``kernel`` at ``shape`` runs: the profile's, None where it runs the built-in
        (no pick, or no custom kernels here)."""
        config = self._choice(kernel, shape, dt)[1]
        return config if self.gpu else None

    def fused(self, kernel: str, shape: Shape, dt: Any) -> Config | None:
        """The config a launch that also does the work around the kernel runs (a layer block's fused
        quantized matmul: :meth:`ProfileView.fused_choice`), None where it runs the built-in (or no custom
        kernels run here)."""
        return self._fused_choice(kernel, shape, dt) if self.gpu else None

    def fuses(self, *calls: tuple[str, Shape, Any]) -> bool:
        """Whether any of these calls has a config for a fused launch (:meth:`fused`; on any backend, as
        :meth:`picks`)."""
        return any(self._fused_choice(*c) is not None for c in calls)

    def _fused_choice(self, kernel: str, shape: Shape, dt: Any) -> Config | None:
        key, config = self._choice(kernel, shape, dt)
        if config is not None:
            return config
        memo_key = (kernel, shape, dt)
        if memo_key not in self._fused_memo:
            alt = self.view.fused_choice(kernel, shape, key[2])
            self._fused_memo[memo_key] = alt if alt is not None and self._fits(kernel, shape) else None
        return self._fused_memo[memo_key]

    def _fits(self, kernel: str, shape: Shape) -> bool:
        try:
            get_spec(kernel).validate_shape(shape)
        except BadShape:
            return False
        return True

    def resolved(self, kernel: str, shape: Shape, dt: Any, params: dict[str, Any],
                 epilogue: dict[str, Any] | None = None, fused: Config | None = None
                 ) -> tuple[list[int], runtime.Runner]:
        """(the call counter, what runs) for one kernel call, resolved on the first call per (kernel,
        shape, dtype, parameter values) and kept. The caller adds 1 to ``counter[0]`` per run.
        ``epilogue``: parameters of this launch only (work around the kernel's own, e.g. quantized_matmul's
        norm prologue and epilogues), not recorded in :attr:`params`, which price the kernel alone.
        ``fused``: the config a fused launch runs (:meth:`fused`), in place of the profile's choice."""
        extra = epilogue or {}
        memo_key = (kernel, shape, dt, *params.values(), *extra.items(), fused is not None)
        hit = self._runners.get(memo_key)
        if hit is None:
            key, config = self._choice(kernel, shape, dt)
            config = fused if fused is not None else config
            if config is not None:
                self._custom_keys.add(key)
            run = config if config is not None and self.gpu else BUILTIN
            runner = runtime.resolve(kernel, shape, key[2], run, {**params, **extra})
            hit = self._runners[memo_key] = (self._tally.setdefault(key, [0]), runner)
            self.params.setdefault(key, params)
        return hit

    def run(self, kernel: str, inputs: list[mx.array], shape: Shape, **params: Any) -> list[mx.array]:
        """Run ``kernel`` as the profile says at this shape. What runs is resolved on the first call per
        (kernel, shape, dtype, parameter values) and kept, so a later call costs a dictionary lookup
        before the launch itself (host time a patched forward pays on every call)."""
        counter, runner = self.resolved(kernel, shape, inputs[0].dtype, params)
        counter[0] += 1
        return runner(inputs)


Call = Callable[..., Any]


Plan = Callable[[tuple[int, ...]], list[tuple[str, Shape]]]  # input shape -> the (kernel, shape) calls
# (router, input shape, input dtype, the module's own code as a call) -> the call for inputs of that
# shape, or None: the module's own code
Bind = Callable[[Router, tuple[int, ...], Any, Call], Call | None]


@dataclass
class Site:
    """What a pattern found in one module. ``call`` is the kernel path, decided per call by ``plan``;
    a site with ``bind`` instead resolves its whole call once per input shape and dtype (no lookups
    left per call: :mod:`kernelfleet.kernels.patch.model_quant`). A site with ``refusal`` is kept as it is,
    and the report says why (e.g. a quantization format the catalog kernel does not take)."""

    kind: str
    families: dict[str, Member]  # kernel -> its shapes at this module, any token count
    label: str  # e.g. "rows x 4096"
    plan: Plan  # the kernel calls a call with this first input's shape makes
    call: Call | None  # the kernel path: (module, router, original __call__, *args, **kwargs)
    consumes: tuple[str, ...] = ()  # child modules whose computation this call takes over
    replace_child: str | None = None  # replace this attribute by a wrapper instead of the module's class
    bind: Bind | None = None
    refusal: str | None = None
    describe: Callable[[Shape], str] = format_shape  # a tuned shape, as the report names it
    single_input: bool = False  # the module's __call__ takes x alone (its wrapper passes nothing else)
    prepare: Callable[[], None] | None = None  # run once when the module is patched, before any call
    # a tuned (shape, config) its fused launches run where the built-in won alone (the report's
    # ProfileView.family; model_layer.fused_roles)
    fused: Callable[[Shape, Config], bool] | None = None


def _rows(x: mx.array) -> int:
    return prod(x.shape[:-1])


MEMO_MAX = 1024  # distinct (input shape, dtype) decisions kept per patched module


def wrap(site: Site, router: Router, orig: Call) -> Call:
    """The patched ``__call__``: the kernel path where the profile picks a custom config for one of the
    call's kernels at this input shape, else the module's own code. Decided once per (input shape,
    dtype) and kept by shape with its dtype beside it (one dictionary lookup and a dtype comparison
    a call: a (shape, dtype) key costs more, since MLX's dtypes hash slowly), so a later call pays
    that before what runs; the own-code path calls the module's ``__call__`` directly."""
    memo: dict[tuple[int, ...], tuple[Any, Call | None]] = {}
    plan, call, bind, module_calls = site.plan, site.call, site.bind, router._module

    def own(self: Any, *args: Any, **kwargs: Any) -> Any:
        module_calls[0] += 1
        return orig(self, *args, **kwargs)

    def kernels(self: Any, *args: Any, **kwargs: Any) -> Any:
        assert call is not None
        return call(self, router, orig, *args, **kwargs)

    def lookup(x: mx.array) -> Call | None:
        shape, dt = x.shape, x.dtype
        if bind is not None:
            fn = bind(router, shape, dt, own)
        else:
            fn = kernels if router.picks(*((kernel, s, dt) for kernel, s in plan(shape))) else None
        if len(memo) >= MEMO_MAX:
            memo.clear()
        memo[shape] = (dt, fn)
        return fn

    def __call__(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        hit = memo.get(x.shape)
        fn = hit[1] if hit is not None and hit[0] == x.dtype else lookup(x)
        if fn is None:
            module_calls[0] += 1
            return orig(self, x, *args, **kwargs)
        return fn(self, x, *args, **kwargs)

    def call_x(self: Any, x: mx.array) -> Any:  # a module called with x alone: no packing of the rest
        hit = memo.get(x.shape)
        fn = hit[1] if hit is not None and hit[0] == x.dtype else lookup(x)
        if fn is None:
            module_calls[0] += 1
            return orig(self, x)
        return fn(self, x)
    return call_x if site.single_input else __call__


@cache
def source_has(obj: Any, *lines: str) -> bool:
    """Whether the source of ``obj.__call__`` (a class) or of ``obj`` (a function) contains every line
    (whitespace-insensitive)."""
    try:
        src = " ".join(inspect.getsource(obj.__call__ if isinstance(obj, type) else obj).split())
    except (OSError, TypeError):
        return False
    return all(" ".join(line.split()) in src for line in lines)


def mlx_lm_class(module: Any, *names: str) -> bool:
    """Whether ``module`` is of an mlx-lm model class of one of these names."""
    cls = type(module)
    return cls.__module__.startswith("mlx_lm.models.") and cls.__name__ in names


def _out_dims(linear: Any, axis: int = 0) -> int:
    return int(linear.weight.shape[axis])


def rms_norm(m: nn.Module) -> Site | None:
    if type(m) is not nn.RMSNorm:
        return None
    d = int(m.weight.shape[-1])

    def call(self: Any, r: Router, orig: Call, x: mx.array) -> mx.array:
        return r.run("rmsnorm", [x, self.weight], (_rows(x), d), eps=float(self.eps))[0]
    return Site("rmsnorm", {"rmsnorm": lambda s: len(s) == 2 and s[1] == d}, f"rows x {d}",
                lambda shape: [("rmsnorm", (prod(shape[:-1]), d))], call)


def layer_norm(m: nn.Module) -> Site | None:
    if type(m) is not nn.LayerNorm or "weight" not in m or "bias" not in m:
        return None
    d = int(m.weight.shape[-1])

    def call(self: Any, r: Router, orig: Call, x: mx.array) -> mx.array:
        return r.run("layernorm", [x, self.weight, self.bias], (_rows(x), d), eps=float(self.eps))[0]
    return Site("layernorm", {"layernorm": lambda s: len(s) == 2 and s[1] == d}, f"rows x {d}",
                lambda shape: [("layernorm", (prod(shape[:-1]), d))], call)


def rope(m: nn.Module) -> Site | None:
    if type(m) is not nn.RoPE or m.traditional or m.scale != 1.0:
        return None
    dims = int(m.dims)

    def plan(shape: tuple[int, ...]) -> list[tuple[str, Shape]]:
        if len(shape) < 3 or shape[-1] != dims:  # partial rotation: mlx's own
            return []
        return [("rope", (prod(shape[:-2]), shape[-2], dims))]

    def call(self: Any, r: Router, orig: Call, x: mx.array, offset: Any = 0) -> mx.array:
        if isinstance(offset, mx.array) and offset.size != 1:  # per-sequence offsets: mlx's own
            return r.own(orig, self, x, offset)
        off = offset.astype(mx.int32).reshape(1) if isinstance(offset, mx.array) \
            else mx.array([int(offset)], mx.int32)
        # mlx-lm's attention layers hand rope (batch, heads, L, Dh) transposed from the projections
        return r.run("rope", [x, off], plan(x.shape)[0][1], base=float(self.base), heads_inner=x.ndim == 4)[0]
    return Site("rope", {"rope": lambda s: len(s) == 3 and s[2] == dims}, f"heads x positions x {dims}",
                plan, call)


def swiglu_fn() -> Any:
    """mlx-lm's own ``activations.swiglu`` (imported when first asked for)."""
    from mlx_lm.models import activations

    return activations.swiglu


GATED_MLPS = {  # the __call__ line of mlx-lm's gated MLPs -> the catalog kernel of its activation
    "return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))": "swiglu",  # llama, qwen, ...
    "return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))": "geglu",  # gemma 2, 3
}


def gated_activation(m: nn.Module) -> str | None:
    """The catalog kernel of the activation of mlx-lm's dense gated MLP ``m`` (its ``__call__`` is
    ``down_proj(act(gate_proj(x)) * up_proj(x))`` with mlx-lm's own ``swiglu`` or ``nn.gelu_approx``),
    or None when ``m`` is not such an MLP."""
    if not mlx_lm_class(m, "MLP"):
        return None
    kernel = next((k for line, k in GATED_MLPS.items() if source_has(type(m), line)), None)
    names = vars(inspect.getmodule(type(m)) or nn)
    if kernel is None or (kernel == "swiglu" and names.get("swiglu") is not swiglu_fn()) \
            or (kernel == "geglu" and names.get("nn") is not nn):
        return None
    return kernel


def gated_mlp(m: nn.Module) -> Site | None:
    """mlx-lm's dense gated MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))`` with SwiGLU (mlx-lm's
    ``activations.swiglu``) or the tanh GELU (``nn.gelu_approx``, as the catalog's geglu)."""
    kernel = gated_activation(m)
    if kernel is None:
        return None
    inter = _out_dims(m.gate_proj)

    def call(self: Any, r: Router, orig: Call, x: mx.array) -> mx.array:
        g, u = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(r.run(kernel, [g, u], (_rows(x), inter))[0])
    return Site(kernel, {kernel: lambda s: len(s) == 2 and s[1] == inter}, f"rows x {inter}",
                lambda shape: [(kernel, (prod(shape[:-1]), inter))], call)


class KernelSwiGLU(nn.Module):
    """Stands in for mlx-lm's ``SwiGLU`` activation inside one ``SwitchGLU`` (mlx-lm shares a single
    default ``SwiGLU()`` between every ``SwitchGLU``, so that object is never changed itself)."""

    def __init__(self, call: Call, original: nn.Module):
        super().__init__()
        self._call = call
        object.__setattr__(self, "_original", original)  # not a child module: the tree stays as it was

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        return self._call(self._original, x, gate)


def stock_swiglu(act: Any) -> bool:
    """Whether ``act`` is mlx-lm's ``SwiGLU`` (``SwitchGLU``'s default activation): ``swiglu(gate, x)``
    with mlx-lm's own ``activations.swiglu``."""
    return isinstance(act, nn.Module) and mlx_lm_class(act, "SwiGLU") \
        and source_has(type(act), "return swiglu(gate, x)") \
        and vars(inspect.getmodule(type(act)) or nn).get("swiglu") is swiglu_fn()


def switch_glu(m: nn.Module) -> Site | None:
    """mlx-lm's ``SwitchGLU`` (MoE experts) with the stock ``SwiGLU`` activation."""
    if not mlx_lm_class(m, "SwitchGLU") or not stock_swiglu(getattr(m, "activation", None)):
        return None
    inter = int(m.gate_proj.weight.shape[-2])

    def call(self: Any, r: Router, orig: Call, x: mx.array, gate: mx.array) -> mx.array:
        return r.run("swiglu", [gate, x], (_rows(gate), inter))[0]
    return Site("swiglu (experts)", {"swiglu": lambda s: len(s) == 2 and s[1] == inter}, f"rows x {inter}",
                lambda shape: [("swiglu", (prod(shape[:-1]), inter))], call, replace_child="activation")


# mlx-lm's Qwen3MoeSparseMoeBlock.__call__ (mlx-lm 0.32): the router's softmax, top k and normalisation,
# the experts and the weighted combine (moe_router; model_moe_layer runs all of it in one graph)
QWEN3_MOE_LINES = (
    "if self.sharding_group is not None: x = sum_gradients(self.sharding_group)(x)",
    "gates = self.gate(x)",
    "gates = mx.softmax(gates, axis=-1, precise=True)",
    "k = self.top_k",
    "inds = mx.argpartition(gates, kth=-k, axis=-1)[..., -k:]",
    "inds = mx.stop_gradient(inds)",
    "scores = mx.take_along_axis(gates, inds, axis=-1)",
    "if self.norm_topk_prob: scores /= mx.sum(scores, axis=-1, keepdims=True)",
    "y = self.switch_mlp(x, inds)",
    "y = (y * scores[..., None]).sum(axis=-2).astype(y.dtype)",
    "if self.sharding_group is not None: y = mx.distributed.all_sum(y, group=self.sharding_group)",
    "return y",
)


def moe_router(m: nn.Module) -> Site | None:
    """Qwen3-MoE and Mixtral sparse blocks: router softmax + top-k, the experts, the weighted combine."""
    if mlx_lm_class(m, "Qwen3MoeSparseMoeBlock") and source_has(type(m), *QWEN3_MOE_LINES):
        k, normalize = int(m.top_k), bool(m.norm_topk_prob)
    elif mlx_lm_class(m, "MixtralSparseMoeBlock") and source_has(
            type(m), "inds = mx.stop_gradient(mx.argpartition(-gates, kth=k - 1, axis=-1)[..., :k])",
            "scores = mx.softmax(scores, axis=-1, precise=True)", "y = self.switch_mlp(x, inds)",
            "y = (y * scores[..., None]).sum(axis=-2)"):
        k, normalize = int(m.num_experts_per_tok), True  # softmax over the top k = renormalised top k
    else:
        return None
    experts = _out_dims(m.gate)
    d = int(m.switch_mlp.down_proj.weight.shape[-2])

    def call(self: Any, r: Router, orig: Call, x: mx.array) -> mx.array:
        if getattr(self, "sharding_group", None) is not None:
            return r.own(orig, self, x)
        rows = _rows(x)
        gates = self.gate(x)
        w, inds = r.run("topk_gating_softmax", [gates], (rows, experts), k=k)
        if normalize:
            w = w / mx.sum(w, axis=-1, keepdims=True)
        y = self.switch_mlp(x, inds)
        return r.run("moe_combine", [y, w.astype(y.dtype)], (rows, k, d))[0].astype(y.dtype)
    return Site("moe router + combine",
                {"topk_gating_softmax": lambda s: len(s) == 2 and s[1] == experts,
                 "moe_combine": lambda s: len(s) == 3 and s[1] == k and s[2] == d},
                f"{experts} experts, top {k}, {d}",
                lambda shape: [("topk_gating_softmax", (prod(shape[:-1]), experts)),
                               ("moe_combine", (prod(shape[:-1]), k, d))], call)


_BLOCK_LINES = ("r = self.self_attn(self.input_layernorm(x), mask, cache)", "h = x + r", "out = h + r")


def residual_norm_block(m: nn.Module) -> Site | None:
    """A pre-norm decoder block whose post-attention norm follows the residual add: the add and the
    RMSNorm become one ``add_rmsnorm`` call."""
    post = getattr(m, "post_attention_layernorm", None)
    if type(post) is not nn.RMSNorm or not isinstance(getattr(m, "self_attn", None), nn.Module) \
            or type(getattr(m, "input_layernorm", None)) is not nn.RMSNorm:
        return None
    mlp_name = next((n for n in ("mlp", "block_sparse_moe") if isinstance(getattr(m, n, None), nn.Module)),
                    None)
    if mlp_name is None or not type(m).__module__.startswith("mlx_lm.models.") or not source_has(
            type(m), *_BLOCK_LINES, f"r = self.{mlp_name}(self.post_attention_layernorm(h))"):
        return None
    d = int(post.weight.shape[-1])

    def call(self: Any, r: Router, orig: Call, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        attn = self.self_attn(self.input_layernorm(x), mask, cache)
        post = self.post_attention_layernorm
        normed, h = r.run("add_rmsnorm", [x, attn, post.weight], (_rows(x), d), eps=float(post.eps))
        return h + getattr(self, mlp_name)(normed)
    return Site("residual add + rmsnorm", {"add_rmsnorm": lambda s: len(s) == 2 and s[1] == d},
                f"rows x {d}", lambda shape: [("add_rmsnorm", (prod(shape[:-1]), d))], call,
                consumes=("post_attention_layernorm",))


# blocks first: a block that fuses its post-attention norm takes that norm over
PATTERNS: tuple[Callable[[nn.Module], Site | None], ...] = (
    residual_norm_block, moe_router, gated_mlp, switch_glu, rms_norm, layer_norm, rope)
