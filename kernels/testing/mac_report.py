"""``make test-metal``: what a first run on a Mac should check, printed as a report to paste back.

Off a Mac, the strict compile model and the CPU emulator (this package) cannot see Apple's
compiler rules they do not model, the numerics of Apple's math library, per-chip pipeline limits
or speed. On a Mac this runs every config of every catalog kernel and dtype at the test shapes on
Metal, checked against the float32 reference exactly as the catalog test does, and reports:

- the machine (chip, macOS, MLX version);
- per kernel and dtype: ok / mismatch (largest error) / compile or launch error (first message) /
  unsupported (a threadgroup over the pipeline's maxTotalThreadsPerThreadgroup, with the limit);
- the pipeline limits seen, per kernel and threadgroup size.

Usage: ``python -m kernelfleet.kernels.testing.mac_report [--kernels a,b] [--out report.md]``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections import Counter

import mlx.core as mx

from kernelfleet.kernels.catalog import NAMES, get_spec
from kernelfleet.kernels.spec import config_key


def run(kernels: list[str]) -> str:
    from kernelfleet.worker.backends.metal import MetalBackend

    backend = MetalBackend()
    info = mx.metal.device_info() if backend.available() else {}
    lines = ["# KernelFleet on Metal: first-run report", "",
             f"- chip: {info.get('device_name', '?')}; macOS {platform.mac_ver()[0] or '?'}; "
             f"MLX {getattr(mx, '__version__', '?')}; python {platform.python_version()}"]
    if not backend.available():
        return "\n".join([*lines, "- MLX's Metal backend is not available here: run this on an Apple Mac."])
    totals: Counter[str] = Counter()
    problems: list[str] = []
    limits: dict[tuple[str, str], str] = {}
    t0 = time.perf_counter()
    lines += ["", "| kernel | dtype | ok | mismatch | error | unsupported |", "|---|---|---|---|---|---|"]
    with mx.stream(mx.gpu):
        for name in kernels:
            spec = get_spec(name)
            for dtype in spec.dtypes:
                counts: Counter[str] = Counter()
                for shape in spec.test_shapes:
                    inputs = spec.make_inputs(shape, dtype, 0)
                    ref = spec.reference(inputs)
                    mx.eval(ref)
                    for config in spec.space(shape, dtype):
                        key = f"{name} {dtype} {'x'.join(map(str, shape))} {config_key(config)}"
                        try:
                            outs = backend.build(spec, config, shape, dtype)(inputs)
                            mx.eval(outs)
                        except Exception as e:  # noqa: BLE001 - every failure is a line of the report
                            reason = backend.unsupported_reason(e)
                            if reason is not None:
                                counts["unsupported"] += 1
                                limits[(name, f"tg={config.get('tg', '?')}")] = reason
                            else:
                                counts["error"] += 1
                                problems.append(f"- {key}: {type(e).__name__}: {str(e)[:400]}")
                            continue
                        cmp = spec.compare(outs, ref, dtype)
                        if cmp.ok:
                            counts["ok"] += 1
                        else:
                            counts["mismatch"] += 1
                            problems.append(f"- {key}: mismatch: {cmp.detail}")
                totals.update(counts)
                cells = [counts[k] for k in ("ok", "mismatch", "error", "unsupported")]
                lines.append(f"| {name} | {dtype} | " + " | ".join(map(str, cells)) + " |")
    lines += ["", f"Totals: {dict(totals)} in {time.perf_counter() - t0:.0f} s.", ""]
    lines += ["## Failures (first 60)", *(problems[:60] or ["- none"]), ""]
    lines += ["## Pipeline limits seen", *([f"- {k} {tg}: {r}" for (k, tg), r in sorted(limits.items())]
                                          or ["- none (every threadgroup size ran)"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(NAMES), help="comma-separated catalog kernels")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args(argv)
    names = [n for n in args.kernels.split(",") if n]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        print(f"unknown kernels {unknown}; known: {', '.join(NAMES)}", file=sys.stderr)
        return 2
    report = run(names)
    print(report)
    if not mx.metal.is_available():
        return 1
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
