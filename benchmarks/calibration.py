"""Prediction confidence against what held-out data shows, on the committed GPU reports.

    python benchmarks/calibration.py [FILE.jsonl ...]   # default: the GPU reports -> results/calibration.txt

The reports are stored the coordinator's way (a temporary SQLite database, ``store_report``, which
fills ``config_stats``), and the observations a profile build sees are read back from the stats
(:func:`kernelfleet.service.aggregates.current_rows`). Then :mod:`kernelfleet.service.calibration`
holds out each measured (chip, kernel, shape, dtype) in turn and predicts it from the rest, in each
mode (``own``: the chip's other shapes too; ``cross``: other chips only; ``transfer``: another chip's
measured pick at the very shape, scored by its margin over the built-in).

Two tables:

1. the calibration itself: per (mode, score bin), samples, hits (within 5 % of the tuned best) and
   the confidence the coordinator assigns ((hits + 1) / (n + 2));
2. an honest check of that confidence on data it was not fitted on: the series are split in two
   folds (by a hash of chip, kernel, shape, dtype); bins fitted on one fold give each prediction of
   the other its confidence; per confidence bin, the observed within-5 % rate of those predictions
   (both directions pooled). The threshold row says what a profile would keep at 0.8.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

from kernelfleet.service import aggregates, calibration, profiles
from kernelfleet.service.calibration import Sample
from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.migrate import upgrade
from kernelfleet.service.models import ConfigStat
from kernelfleet.service.predict import Observations, Picks, Prediction
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport

RESULTS = Path(__file__).parent / "results"
GPU_FILES = ("h100_tuning.jsonl", "h100_fleet_tuning.jsonl", "h200_tuning.jsonl", "h100_session_tuning.jsonl",
             "h100_spread_tuning.jsonl", "h100_session_run6_tuning.jsonl",
             # the H200's own tunes from the cross-chip benchmark: two chips with many shapes in common
             "h200_cross_chip_tuning.jsonl", "h200_cross_chip_run2_tuning.jsonl")
THRESHOLD = 0.8
CONF_BINS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01)


def observations(paths: list[Path]) -> dict[str, tuple[Observations, Picks]]:
    """backend -> (chip -> table, the chips' measured picks), read back from config_stats after storing
    every report."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/calibration.db"
        upgrade(url)
        engine = make_engine(url)
        factory = make_sessionmaker(engine)
        with factory() as session, immediate(session):
            for path in paths:
                for line in path.read_text().splitlines():
                    if line.strip():
                        store_report(session, TuningReport.model_validate_json(line), source="lease")
        out = {}
        with factory() as session:
            for backend in sorted(set(session.scalars(ConfigStat.__table__.select().with_only_columns(
                    ConfigStat.backend).distinct()))):
                tables, evidence = profiles.observations(
                    aggregates.current_rows(session, ConfigStat.backend == backend))
                out[backend] = (tables, profiles.measured_picks(evidence, backend))
        engine.dispose()
    return out


def fold(s: Sample) -> int:
    return hashlib.sha256(f"{s.chip}|{s.kernel}|{s.shape}|{s.dtype}".encode()).digest()[0] % 2


def as_pick(s: Sample) -> Prediction:
    return Prediction(config_key="", median_us=0.0, speedup=None, score=s.score, cross_chip=s.mode != "own",
                      transfer=s.mode == "transfer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS / "calibration.txt")
    args = ap.parse_args(argv)
    paths = args.files or [RESULTS / f for f in GPU_FILES]
    lines = [f"Prediction confidence calibration on held-out data ({', '.join(p.name for p in paths)})", ""]
    for backend, (tables, picks) in observations(paths).items():
        if backend == "cpu":
            continue
        samples = calibration.held_out(tables, profiles._validator, picks=picks)
        chips = ", ".join(f"{c} ({len(t)} series)" for c, t in sorted(tables.items()))
        lines += [f"backend {backend}: {chips}; {len(samples)} held-out predictions", "",
                  "1. calibration (all samples): score bin -> observed within-5 % rate",
                  f"  {'mode':<8} {'score':<10} {'n':>4} {'hits':>5} {'confidence':>10}"]
        for b in calibration.bins(samples):
            if b["n"]:
                lines.append(f"  {b['mode']:<8} {b['lo']:.1f}-{b['hi']:.1f}    {b['n']:>4} {b['hits']:>5} "
                             f"{b['rate']:>10.3f}")
        scored = []
        for k in (0, 1):
            table = calibration.bins([s for s in samples if fold(s) == k])
            scored += [(calibration.confidence(table, as_pick(s)), s.hit, s.mode)
                       for s in samples if fold(s) != k]
        lines += ["", "2. two-fold check: confidence from the other fold -> observed within-5 % rate",
                  f"  {'confidence':<12} {'n':>4} {'hits':>5} {'observed':>9}"]
        for lo, hi in zip(CONF_BINS, CONF_BINS[1:], strict=False):
            inside = [h for c, h, _ in scored if lo <= c < hi]
            if inside:
                lines.append(f"  {lo:.1f}-{min(hi, 1.0):.1f}      {len(inside):>4} {sum(inside):>5} "
                             f"{sum(inside) / len(inside):>9.3f}")
        kept = [h for c, h, _ in scored if c >= THRESHOLD]
        dropped = [h for c, h, _ in scored if c < THRESHOLD]
        lines += ["", f"  at threshold {THRESHOLD}: {len(kept)} of {len(scored)} predictions kept, "
                      f"{sum(kept)}/{len(kept) or 1} = {sum(kept) / (len(kept) or 1):.1%} within 5 %; "
                      f"the {len(dropped)} below fall back to the built-in (their own pick would have "
                      f"been within 5 % in {sum(dropped)}/{len(dropped) or 1})", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
