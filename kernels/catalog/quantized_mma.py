"""The tensor-core (CUDA ``mma.sync``) path of quantized matmul, for M = 1-32 tokens: its axes, configs and
launches, for :mod:`.quantized_matmul_kernel` and, gathered, :mod:`.gather_quantized_matmul_kernel`. The
kernel itself, written once for both, and how it works: :mod:`.quantized_mma_source`.

Axes: ``rpw`` rows per warp (16, 32 or 64), ``tg`` threads a block (its warps split K), ``unr`` chunks
loaded before use, ``gsum`` (4 bits: a group's codes straight into the mma), ``vw`` 4; the gathered form
adds ``mt``, the pairs a block takes. float16 and bfloat16 only; CUDA workers only (:func:`config_backends`).
"""

from __future__ import annotations

from ..common import mx_dtype
from ..render.launch import Launch, TemplateArg
from ..spec import Config, GpuBackend, Shape

MAX_M = 32
DTYPES = ("float16", "bfloat16")
RTS = (1, 2, 4)
TGS = (32, 64, 128, 256, 512)  # 512: at up to 16 tokens, MAX_TILES_AT_512
UNRS = (1, 2)
GATHER_TILES = (16, 32)  # pairs a block of the gathered kernel takes
MAX_SHARED_FLOATS = 8192  # the split-K sum's buffer: 32 KB of the 48 KB a block may declare
# at 512 threads a lane has 128 registers. On the H200 (h200_quantized_mma_tg512.txt) rpw 64 with unr 2 at M=8
# and rpw 16 at M=32 (4-bit) would not launch (too many resources); row tiles x token tiles x chunks in
# flight <= 4 at up to 16 tokens all launched and matched the reference
MAX_TILES_AT_512 = 4


def config_backends(config: Config) -> tuple[GpuBackend, ...]:
    """Who may run a config of a spec with this path: ``mma`` configs CUDA only, the rest both."""
    return ("cuda",) if config.get("path") == "mma" else ("metal", "cuda")


def _axes(k: int, n: int, bits: int, tokens: int, dtype: str) -> list[tuple[int, int, int]]:
    """(row tiles, threads, chunks in flight) valid for ``tokens`` tokens a block (none where the path
    does not apply)."""
    if dtype not in DTYPES or k % (16 * (32 // bits)):
        return []
    chunks = k // (16 * (32 // bits))
    nt = -(-tokens // 8)
    return [(rt, tg, unr) for rt in RTS for tg in TGS for unr in UNRS
            if n % (16 * rt) == 0 and (tg // 32) * unr <= chunks
            and (tg // 32) * rt * nt * 4 * 32 <= MAX_SHARED_FLOATS
            and (tg < 512 or (nt <= 2 and rt * nt * unr <= MAX_TILES_AT_512))]


def space(shape: Shape, dtype: str) -> list[Config]:
    """The mma path's configs at ``shape`` (M x K x N x bits x group): none where it does not apply."""
    m, k, n, bits, _group = shape
    if m > MAX_M:
        return []
    return [{"path": "mma", "rpw": 16 * rt, "vw": 4, "tg": tg, "unr": unr, **sums}
            for rt, tg, unr in _axes(k, n, bits, m, dtype) for sums in _sums(bits)]


def gather_space(shape: Shape, dtype: str) -> list[Config]:
    """The gathered path's configs at ``shape`` (T x K x N x E x bits x group): ``mt`` pairs a block."""
    t, k, n, _e, bits, _group = shape
    # 512 threads: checked on the GPU for the plain kernel only, whose gathered form holds more a lane
    return [{"path": "mma", "rpw": 16 * rt, "vw": 4, "tg": tg, "unr": unr, **sums, "mt": mt}
            for mt in GATHER_TILES if mt <= max(t, GATHER_TILES[0])
            for rt, tg, unr in _axes(k, n, bits, mt, dtype) if tg < 512 for sums in _sums(bits)]


def _sums(bits: int) -> list[dict[str, int]]:
    """The ``gsum`` axis (4 bits): absent, each weight dequantized before the mma; 1, a group's codes into
    the mma and its scale and bias applied to the sums."""
    return [{}, {"gsum": 1}] if bits == 4 else [{}]


def _template(config: Config, dtype: str, k: int, n: int, bits: int, group: int, tokens: int
              ) -> tuple[TemplateArg, ...]:
    return (("T", mx_dtype(dtype)), ("K", k), ("N", n), ("BITS", bits), ("GS", group), ("MR", tokens),
            ("RT", int(config["rpw"]) // 16), ("TG", int(config["tg"])), ("UNR", int(config["unr"])),
            ("GSUM", int(config.get("gsum", 0))))


def launch(config: Config, shape: Shape, dtype: str) -> Launch:
    m, k, n, bits, group = shape
    tg = int(config["tg"])
    return Launch(((n // int(config["rpw"])) * tg, 1, 1), (tg, 1, 1),
                  _template(config, dtype, k, n, bits, group, m))


def gather_launch(config: Config, shape: Shape, dtype: str) -> Launch:
    t, k, n, _e, bits, group = shape
    tg, mt = int(config["tg"]), int(config["mt"])
    blocks = (n // int(config["rpw"])) * -(-t // mt)
    return Launch((blocks * tg, 1, 1), (tg, 1, 1),
                  (*_template(config, dtype, k, n, bits, group, mt), ("TOKENS", t)))
