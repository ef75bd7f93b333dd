"""Honest measurement of kernel candidates.

- Every candidate is built, run once and compared with the float32 reference before any timing.
  A failure is a result: ``compile_error`` (building raised, or the first launch failed while
  compiling), ``launch_error`` (a call or evaluation raised), ``mismatch`` (outside the spec's
  tolerance), ``unsupported`` (the backend says this chip cannot run the config: on Metal, a
  threadgroup over the compiled pipeline's ``maxTotalThreadsPerThreadgroup``; the error names the
  limit). Nothing is dropped; an unsupported config is never measured or chosen.
- Each good candidate is warmed up, then calibrated: K launches per round, chosen so one round
  lasts at least ``min_round_s`` (4 ms), so a decode-size launch is timed as many launches between
  two ``mx.synchronize()`` calls rather than one launch drowned in sync overhead. K is read from a
  short pass, then checked: a full round of K launches is timed and, while it falls short of
  ``min_round_s`` by over 10 %, K is scaled up from it (``check_rounds`` times at most). A short
  pass can carry one-time costs (the first launches' output buffers allocated, clocks ramping up)
  and so set K too low; a round of too few launches is then mostly its fixed start-and-drain cost,
  slow and noisy. A slow phase can outlast the calibration (on an H200, moe_combine 16384x2x4096
  hint=2: 490 µs a launch in the calibration's last round, 102 µs after, K 8 where 40 was due), so
  a timed round that lasts under half of ``min_round_s`` scales K up for the rounds after it (its
  own sample is kept; ``resize_rounds``). A round also pays a fixed cost to start and drain the
  queue. On an H100 host (``benchmarks/results/h100_launch_floor.txt``) a 200 µs kernel's median
  (layernorm 16384x8192) came out 11 % above its 16 ms-round median with 1 ms rounds, 3 % with
  4 ms rounds; a 1 GiB copy 8 % and 2 %. The calibration's last timing (at least a quarter round)
  is kept apart from the samples: search strategies may use it to screen candidates
  (:meth:`Measurer.best_seen`); reports hold only the timed rounds.
- Candidates whose kernels are identical on the backend (``Backend.kernel_identity``: rendered
  source, template arguments, launch geometry; on Metal the ``hint`` axis renders the same source)
  are built, checked and timed once; each still gets its trial, its result that measurement's,
  marked ``shares_measurement_with`` the candidate measured.
- A round times K launches (each ``mx.async_eval``'d) between synchronizations; one sample is the
  round time / K, in microseconds. Rounds visit the candidates in a freshly shuffled (seeded)
  order each time, so drift (clocks, heat, other tenants) hits all candidates alike.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from kernelfleet.kernels.spec import Config, KernelFn, KernelSpec, Shape, compare, config_key
from kernelfleet.worker.backends.base import Backend

OK, COMPILE_ERROR, LAUNCH_ERROR, MISMATCH = "ok", "compile_error", "launch_error", "mismatch"
UNSUPPORTED = "unsupported"
PENDING = "pending"
MAX_SAMPLES = 1000
_MAX_ERROR_CHARS = 2000
# A first-launch failure whose message says this is a compile failure, not a launch failure.
_COMPILE_HINT = re.compile(r"compil|nvrtc|unable to build|program_source|error: ", re.IGNORECASE)


class MeasureError(Exception):
    """Base class for measurement errors."""


class AllCandidatesFailed(MeasureError):
    pass


@dataclass
class Trial:
    """One candidate config and everything measured about it."""

    config: Config
    key: str
    is_builtin: bool
    status: str = PENDING
    error: str | None = None
    samples_us: list[float] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    launches_per_round: int = 1
    calibration_us: float | None = None  # per-launch time of the calibration's last timing
    resized: int = 0  # times a timed round fell under half of min_round_s and K was scaled up after it
    # the candidate whose kernels this one's are, byte for byte (Backend.kernel_identity): measured
    # once, there; this trial reports that measurement, marked as shared
    shares_measurement_with: str | None = None
    fn: KernelFn | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def fail(self, status: str, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.status, self.error, self.fn = status, text[:_MAX_ERROR_CHARS], None
        self.samples_us = []

    def median(self) -> float | None:
        return float(np.median(self.samples_us)) if self.ok and self.samples_us else None

    def to_report(self) -> dict[str, Any]:
        """This trial in the tuning-report format (failed trials: null timings, n 0)."""
        timed = self.ok and bool(self.samples_us)
        samples = [float(s) for s in self.samples_us] if timed else None
        p10, p50, p90 = (np.percentile(self.samples_us, [10, 50, 90]).tolist() if timed else (None,) * 3)
        shares = self.shares_measurement_with
        shared = {"shares_measurement_with": shares} if shares else {}
        return {
            "config_key": self.key, "config": dict(self.config), "is_builtin": self.is_builtin,
            "status": self.status, "error": self.error,
            "samples_us": samples if samples is not None and len(samples) <= MAX_SAMPLES else None,
            "median_us": p50, "p10_us": p10, "p90_us": p90, "n": len(self.samples_us) if timed else 0,
            "max_abs_err": _finite_or_none(self.max_abs_err),
            "max_rel_err": _finite_or_none(self.max_rel_err),
            **shared,
        }


def _finite_or_none(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _launch(fn: KernelFn, inputs: Sequence[mx.array], k: int) -> None:
    for _ in range(k):
        mx.async_eval(fn(inputs))


class Measurer:
    """Prepares candidates lazily (build, check, warm up, calibrate) and times them in rounds.

    ``on_step`` is called after each prepared candidate and each candidate-round, for progress.
    """

    def __init__(self, spec: KernelSpec, backend: Backend, shape: Shape, dtype: str,
                 inputs: Sequence[mx.array], reference: Sequence[mx.array], configs: Sequence[Config], *,
                 seed: int = 0, min_round_s: float = 4e-3, max_launches: int = 4096, warmup: int = 1,
                 check_rounds: int = 3, resize_rounds: bool = True,
                 on_step: Callable[[], None] | None = None) -> None:
        self.spec, self.backend, self.shape, self.dtype = spec, backend, shape, dtype
        self.inputs, self.reference = list(inputs), list(reference)
        self.tol = spec.tolerance(dtype)
        self.min_round_s, self.max_launches, self.warmup = min_round_s, max_launches, warmup
        self.check_rounds, self.resize_rounds = check_rounds, resize_rounds
        self.rng = random.Random(seed)
        self.on_step = on_step or (lambda: None)
        self.trials: dict[str, Trial] = {}
        for config in configs:
            key = config_key(config)
            self.trials.setdefault(key, Trial(config=dict(config), key=key, is_builtin=key == "builtin"))
        self.prepare_s = 0.0
        self.measure_s = 0.0
        self._by_identity: dict[str, str] = {}  # kernel identity -> the key measured for it

    # -------------------------------------------------------------------- preparation

    def prepare(self, keys: Sequence[str]) -> None:
        """Build, verify, warm up and calibrate every pending candidate among ``keys``."""
        t0 = time.perf_counter()
        for key in keys:
            trial = self.trials[key]
            if trial.status == PENDING:
                self._prepare_one(trial)
                self.on_step()
        self.prepare_s += time.perf_counter() - t0

    def _prepare_one(self, trial: Trial) -> None:
        if not trial.is_builtin:
            identity = self.backend.kernel_identity(self.spec, trial.config, self.shape, self.dtype,
                                                    self.inputs)
            if identity is not None:
                first = self._by_identity.setdefault(identity, trial.key)
                if first != trial.key:  # the same kernels as a candidate already prepared: not built again
                    trial.shares_measurement_with = first
                    self._share(trial)
                    return
        try:
            fn = self.backend.build(self.spec, trial.config, self.shape, self.dtype)
        except Exception as e:  # noqa: BLE001 - any build failure is a recorded result
            trial.fail(COMPILE_ERROR, e)
            return
        try:
            outputs = list(fn(self.inputs))
            mx.eval(outputs)
        except Exception as e:  # noqa: BLE001 - first launch: compile or launch failure
            reason = self.backend.unsupported_reason(e)
            if reason is not None:
                trial.fail(UNSUPPORTED, reason)
            else:
                trial.fail(COMPILE_ERROR if _COMPILE_HINT.search(str(e)) else LAUNCH_ERROR, e)
            return
        check = compare(outputs, self.reference, self.tol, getattr(self.spec, "exact_outputs", ()))
        trial.max_abs_err, trial.max_rel_err = check.max_abs_err, check.max_rel_err
        if not check.ok:
            trial.fail(MISMATCH, check.detail or "output outside tolerance")
            return
        try:
            _launch(fn, self.inputs, self.warmup)
            self.backend.synchronize()
            trial.launches_per_round, trial.calibration_us = self._calibrate(fn)
        except Exception as e:  # noqa: BLE001
            trial.fail(LAUNCH_ERROR, e)
            return
        trial.fn, trial.status = fn, OK

    def _share(self, trial: Trial) -> None:
        """``trial`` takes the result of the candidate it shares a measurement with: its status,
        errors, calibration and its very list of samples (rounds append to it for both)."""
        src = self.trials[trial.shares_measurement_with or trial.key]
        trial.status, trial.error, trial.samples_us = src.status, src.error, src.samples_us
        trial.max_abs_err, trial.max_rel_err = src.max_abs_err, src.max_rel_err
        trial.launches_per_round, trial.calibration_us = src.launches_per_round, src.calibration_us
        trial.resized = src.resized
        trial.fn = None

    def _calibrate(self, fn: KernelFn) -> tuple[int, float]:
        """Launches per round so that a round lasts at least ``min_round_s`` (also warms up), and
        the per-launch time (µs) the calibration's last timing measured: a pass of launches grown
        fourfold until it lasts a quarter round gives K, then up to ``check_rounds`` full rounds of K
        launches check it, scaling K up while a round falls over 10 % short of ``min_round_s``."""
        n = 2
        while True:
            elapsed = self._time_launches(fn, n)
            if elapsed >= 0.25 * self.min_round_s or n >= self.max_launches:
                break
            n = min(n * 4, self.max_launches)
        k = self._launches_for(n, elapsed)
        for _ in range(self.check_rounds):
            if k >= self.max_launches:
                break
            n, elapsed = k, self._time_launches(fn, k)
            if elapsed >= 0.9 * self.min_round_s:
                break
            k = max(k + 1, self._launches_for(k, elapsed))
        return k, max(elapsed / n, 1e-9) * 1e6

    def _time_launches(self, fn: KernelFn, n: int) -> float:
        """Seconds ``n`` launches take between two synchronizations."""
        self.backend.synchronize()
        t0 = time.perf_counter()
        _launch(fn, self.inputs, n)
        self.backend.synchronize()
        return time.perf_counter() - t0

    def _launches_for(self, n: int, elapsed: float) -> int:
        """Launches per round for ``min_round_s``, from ``n`` launches that took ``elapsed`` s."""
        per_launch = max(elapsed / n, 1e-9)
        return max(1, min(self.max_launches, math.ceil(self.min_round_s / per_launch)))

    # -------------------------------------------------------------------- timing

    def measure(self, keys: Sequence[str], rounds: int) -> dict[str, float | None]:
        """Prepare ``keys`` if needed, then time ``rounds`` interleaved rounds over the good ones.

        Returns the median per-launch time (µs) over all samples so far, None for failures.
        """
        self.prepare(keys)
        # each kernel once: a candidate that shares a measurement is timed as the one it shares
        measured = dict.fromkeys(self.trials[k].shares_measurement_with or k for k in keys)
        live = [self.trials[k] for k in measured if self.trials[k].ok]
        t0 = time.perf_counter()
        for _ in range(max(0, rounds)):
            order = live[:]
            self.rng.shuffle(order)
            for trial in order:
                if not trial.ok or trial.fn is None:
                    continue
                try:
                    self.backend.synchronize()
                    start = time.perf_counter()
                    _launch(trial.fn, self.inputs, trial.launches_per_round)
                    self.backend.synchronize()
                    elapsed = time.perf_counter() - start
                except Exception as e:  # noqa: BLE001 - a launch failure is a recorded result
                    trial.fail(LAUNCH_ERROR, e)
                    continue
                trial.samples_us.append(elapsed / trial.launches_per_round * 1e6)
                if (self.resize_rounds and elapsed < 0.5 * self.min_round_s
                        and trial.launches_per_round < self.max_launches):
                    trial.launches_per_round = self._launches_for(trial.launches_per_round, elapsed)
                    trial.resized += 1
                self.on_step()
        self.measure_s += time.perf_counter() - t0
        for trial in self.trials.values():  # a shared measurement that failed in a round fails for all
            if trial.shares_measurement_with is not None:
                self._share(trial)
        return {k: self.trials[k].median() for k in keys}

    def median(self, key: str) -> float | None:
        return self.trials[key].median()

    def samples(self, key: str) -> list[float]:
        trial = self.trials[key]
        return list(trial.samples_us) if trial.ok else []

    def best_seen(self, keys: Sequence[str]) -> dict[str, float | None]:
        """The fastest per-launch time seen per key, calibration included (None = failed)."""
        out: dict[str, float | None] = {}
        for key in keys:
            trial = self.trials[key]
            seen = trial.samples_us + ([trial.calibration_us] if trial.calibration_us is not None else [])
            out[key] = min(seen) if trial.ok and seen else None
        return out

    def ok_keys(self, keys: Sequence[str] | None = None) -> list[str]:
        return [k for k in (keys if keys is not None else self.trials) if self.trials[k].ok]

    def touched(self) -> list[Trial]:
        """Every candidate that was prepared (in candidate order), failures included."""
        return [t for t in self.trials.values() if t.status != PENDING]

    def raise_if_all_failed(self) -> None:
        done = self.touched()
        if done and not any(t.ok for t in done):
            lines = "; ".join(f"{t.key}: {t.status} ({(t.error or '')[:160]})" for t in done[:6])
            more = f" (+{len(done) - 6} more)" if len(done) > 6 else ""
            raise AllCandidatesFailed(f"all {len(done)} candidates failed for {self.spec.name} "
                                      f"{'x'.join(map(str, self.shape))} {self.dtype}: {lines}{more}")
