"""``make test-metal``: what a first run on a Mac should check, printed as a report to paste back.

Off a Mac, the strict compile model and the CPU emulator (this package) cannot see Apple's
compiler rules they do not model, the numerics of Apple's math library, per-chip pipeline limits
or speed. On a Mac this runs every catalog kernel (zmlx's family included: ground truth known to
work) and dtype on Metal, checked against the float32 reference exactly as the catalog test does:

- every config at the test shapes;
- at the production shapes (decode, and the smallest large one), the configs most likely to hit a
  per-pipeline thread limit: the most cached values per thread (``NITER x V``) and every
  threadgroup of 512 or more, a few per kernel, dtype and shape (about 10 minutes on a base M1).

It reports, each row streamed to stdout and the report file as it completes (a GPU fault or Ctrl-C
keeps what ran): the machine (chip, GPU architecture string such as ``applegpu_g14d``, macOS, the
Metal language version kernels compile with, MLX and Python versions); per kernel, dtype and
shape kind: ok / mismatch / error / unsupported counts; the failures; and each config and dtype
that hit a pipeline limit. ``--quick`` (``make test-metal QUICK=1``): a 2-minute smoke run (a few
configs per kernel and dtype, one decode config per kernel). ``--backend metal-emu`` runs the same
on the CPU emulator (a dry run of the report off a Mac; needs clang++).

Usage: ``python -m kernelfleet.worker.mac_report [--quick] [--kernels a,b] [--out report.md]``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TextIO

NEEDS = (3, 11)
PYTHON_HINT = ("KernelFleet needs Python 3.11 or newer; macOS's /usr/bin/python3 is 3.9. Install one "
               "(brew install python@3.12, or python.org's installer), then: "
               "make test-metal PYTHON=python3.12")
PRODUCTION_PICKS = 3  # configs per kernel x dtype x production shape (1 in quick mode)
QUICK_TEST_CONFIGS = 4  # configs per kernel x dtype at the test shapes in quick mode
BIG_THREADGROUP = 512


class Report:
    """Lines written as they come, to stdout and (if given) a file, flushed each time."""

    def __init__(self, out: TextIO | None) -> None:
        self.out = out

    def __call__(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            if self.out is not None:
                self.out.write(line + "\n")
                self.out.flush()


def _values_per_thread(spec: Any, config: dict[str, Any], shape: Any, dtype: str) -> int:
    """Cached values per thread of a config's first launch (template NITER x V where the kernel has
    them, else 1)."""
    from kernelfleet.kernels.common import shapes_only
    from kernelfleet.kernels.render.launch import capture

    with shapes_only():
        inputs = spec.make_inputs(shape, dtype, 0)
    try:
        with capture() as recs:
            spec.build(config, "metal", shape, dtype)(inputs)
    except RuntimeError:  # a kernel that calls MLX's Metal itself (zmlx's) captures nothing off a Mac
        return 1
    if not recs:
        return 1
    t = {name: value for name, value in recs[0].launch.template if isinstance(value, int)}
    return int(t.get("NITER", 1)) * int(t.get("V", 1))


def production_picks(spec: Any, shape: Any, dtype: str, k: int) -> list[dict[str, Any]]:
    """The ``k`` configs at ``shape`` most likely to hit a pipeline limit: by cached values per
    thread, then threadgroup size; every config with tg >= 512 ranks before the rest's ties."""
    configs = spec.space_for(shape, dtype, "metal")
    scored = sorted(configs, key=lambda c: (-_values_per_thread(spec, c, shape, dtype),
                                            -int(c.get("tg", 0))))
    picks = scored[:k]
    big = max((c for c in configs if int(c.get("tg", 0)) >= BIG_THREADGROUP),
              key=lambda c: int(c.get("tg", 0)), default=None)
    if big is not None and big not in picks:
        picks = [*picks[:k - 1], big] if k > 1 else [big]
    return picks


def production_shapes(spec: Any, quick: bool) -> list[tuple[str, Any]]:
    decode = [("decode", tuple(s)) for s in spec.shapes.get("decode", ())]
    large = sorted((tuple(s) for s in spec.shapes.get("large", ())), key=lambda s: _prod(s))
    return decode[:1] if quick else decode + [("large", large[0])] if large else decode


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _machine(backend_name: str, metal_version: str) -> list[str]:
    import mlx.core as mx

    info: dict[str, Any] = {}
    if backend_name == "metal" and mx.metal.is_available():
        info = dict(mx.metal.device_info())
    return [f"- chip: {info.get('device_name', '?')}; GPU architecture: {info.get('architecture', '?')}",
            f"- macOS {platform.mac_ver()[0] or '? (not macOS: ' + platform.platform() + ')'}; "
            f"Metal language: {metal_version}",
            f"- MLX {getattr(mx, '__version__', '?')}; Python {platform.python_version()}; "
            f"backend {backend_name}"]


def metal_language_version() -> str:
    """__METAL_VERSION__ as a kernel compiled by MLX sees it (e.g. 310: MSL 3.1)."""
    import mlx.core as mx

    probe: Any = mx.fast.metal_kernel(name="kf_metal_version", input_names=["x"], output_names=["out"],
                                      source="out[0] = __METAL_VERSION__;")
    out = probe(inputs=[mx.zeros((1,), dtype=mx.int32)], output_shapes=[(1,)], output_dtypes=[mx.int32],
                grid=(1, 1, 1), threadgroup=(1, 1, 1))[0]
    v = int(out.item())
    return f"{v // 100}.{v % 100 // 10} (__METAL_VERSION__ {v})"


def run(kernels: Sequence[str], write: Callable[..., None], *, quick: bool = False,
        backend_name: str = "metal", emu_max_threads: int = 1024) -> int:
    """Run the checks, writing the report as it goes. The number of failures (mismatches and
    errors; an unsupported config is a finding, not a failure)."""
    import random

    import mlx.core as mx

    from kernelfleet.kernels.catalog import ZMLX_NAMES, get_spec
    from kernelfleet.kernels.spec import config_key

    backend: Any
    if backend_name == "metal-emu":
        from kernelfleet.worker.backends.metal_emu import MetalEmuBackend

        backend = MetalEmuBackend(max_threads_per_threadgroup=emu_max_threads)
        metal_version = "n/a (CPU emulator: the strict model's MSL)"
    else:
        from kernelfleet.worker.backends.metal import MetalBackend

        backend = MetalBackend()
        metal_version = metal_language_version() if backend.available() else "?"
    write("# KernelFleet on Metal: first-run report" + (" (quick)" if quick else ""), "",
          *_machine(backend_name, metal_version))
    if not backend.available():
        write("- this backend is not available here: run this on an Apple Mac (or --backend metal-emu "
              "with clang++ for a dry run).")
        return 1
    totals: Counter[str] = Counter()
    problems: list[str] = []
    limits: list[str] = []  # a threadgroup over the pipeline's thread limit
    elsewhere: list[str] = []  # unsupported for another reason the backend names
    t0 = time.perf_counter()
    write("", "| kernel | dtype | shapes | configs | ok | mismatch | error | unsupported | s |",
          "|---|---|---|---|---|---|---|---|---|")
    device = mx.gpu if backend_name == "metal" else mx.cpu
    skipped = [n for n in kernels if n in ZMLX_NAMES] if backend_name == "metal-emu" else []
    with mx.stream(device):
        for name in (n for n in kernels if n not in skipped):
            spec = get_spec(name)
            dtypes = list(spec.dtypes)
            for dtype in dtypes:
                plans: list[tuple[str, Any, list[dict[str, Any]]]] = []
                for shape in spec.test_shapes:
                    space = spec.space_for(shape, dtype, "metal")
                    if quick:
                        space = random.Random(f"{name}-{dtype}").sample(space,
                                                                        min(QUICK_TEST_CONFIGS, len(space)))
                    plans.append(("test", shape, space))
                if not quick or dtype == dtypes[0]:
                    for kind, shape in production_shapes(spec, quick):
                        plans.append((kind, shape, production_picks(spec, shape, dtype,
                                                                    1 if quick else PRODUCTION_PICKS)))
                for kind in dict.fromkeys(k for k, _, _ in plans):
                    t1 = time.perf_counter()
                    counts: Counter[str] = Counter()
                    for _, shape, configs in (p for p in plans if p[0] == kind):
                        inputs = spec.make_inputs(shape, dtype, 0)
                        ref = spec.reference(inputs)
                        mx.eval(ref)
                        for config in configs:
                            key = f"{name} {dtype} {'x'.join(map(str, shape))} {config_key(config)}"
                            try:
                                outs = backend.build(spec, config, shape, dtype)(inputs)
                                mx.eval(outs)
                            except Exception as e:  # noqa: BLE001 - every failure is a line of the report
                                reason = backend.unsupported_reason(e)
                                if reason is not None:
                                    counts["unsupported"] += 1
                                    limit = "maxTotalThreadsPerThreadgroup" in reason
                                    (limits if limit else elsewhere).append(f"- {key}: {reason}")
                                else:
                                    counts["error"] += 1
                                    problems.append(f"- {key}: {type(e).__name__}: {str(e)[:400]}")
                                continue
                            cmp = spec.compare(outs, ref, dtype)
                            counts["ok" if cmp.ok else "mismatch"] += 1
                            if not cmp.ok:
                                problems.append(f"- {key}: mismatch: {cmp.detail}")
                    totals.update(counts)
                    n = sum(len(c) for k, _, c in plans if k == kind)
                    cells = [counts[k] for k in ("ok", "mismatch", "error", "unsupported")]
                    write(f"| {name} | {dtype} | {kind} | {n} | " + " | ".join(map(str, cells))
                          + f" | {time.perf_counter() - t1:.1f} |")
    if skipped:
        write(f"| {', '.join(skipped)} | - | - | - | not run: zmlx calls MLX's Metal itself, which the "
              "emulator cannot intercept | | | | |")
    write("", f"Totals: {dict(totals)} in {time.perf_counter() - t0:.0f} s.", "",
          "## Failures (first 60)", *(problems[:60] or ["- none"]), "",
          "## Configs and dtypes that hit a pipeline limit",
          *(limits or ["- none (every threadgroup size ran)"]),
          *(["", "## Unsupported here for another reason", *elsewhere] if elsewhere else []))
    return totals["mismatch"] + totals["error"]


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < NEEDS:
        print(PYTHON_HINT, file=sys.stderr)
        return 2
    from kernelfleet.kernels.catalog import NAMES, ZMLX_NAMES

    known = NAMES + ZMLX_NAMES
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(known), help="comma-separated catalog kernels "
                        "(default: all, zmlx's family included)")
    parser.add_argument("--quick", action="store_true", help="a 2-minute smoke run")
    parser.add_argument("--backend", choices=("metal", "metal-emu"), default="metal",
                        help="metal-emu: a dry run on the CPU emulator (needs clang++)")
    parser.add_argument("--emu-max-threads", type=int, default=1024,
                        help="metal-emu: the per-pipeline thread limit it models (a chip's, e.g. 512)")
    parser.add_argument("--out", help="also write the report to this file (row by row)")
    args = parser.parse_args(argv)
    names = [n for n in args.kernels.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown kernels {unknown}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    try:
        out = open(args.out, "w") if args.out else None  # noqa: SIM115 - closed below
    except OSError as e:
        print(f"cannot write the report to {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        failures = run(names, Report(out), quick=args.quick, backend_name=args.backend,
                       emu_max_threads=args.emu_max_threads)
    except KeyboardInterrupt:
        print("interrupted: the rows above (and in the report file) are what ran", file=sys.stderr)
        return 130
    finally:
        if out is not None:
            out.close()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
