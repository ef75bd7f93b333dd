"""Regression detection in the coordinator: the result hook, confirmations and the scan (a person's
actions on alerts: :mod:`.triage`).

- Each stored result (:func:`on_result`, registered with :mod:`kernelfleet.service.hooks`) is
  checked by the online detector against its series' runs since the baseline started. A suspect
  becomes a regression in status ``confirming`` together with a ``confirm`` job targeted at that
  exact chip and backend, in one transaction. The regression names the first slower run (which
  may be a few runs before the newest) and the run just before it, and its cause is what changed
  between those two runs. While it waits, the series raises no other suspect.
- When that confirm job's result arrives, the suspect's slower runs (and any run stored since) and
  the re-run are tested together against the same baseline: reproduced, the regression becomes
  ``open`` with the joint effect; else ``dismissed``.
- A confirm job that no worker has leased within ``regression_confirm_wait_seconds`` while no
  worker of its chip is online (imported reports; a Mac that is off) is cancelled, and the
  regression is judged on the runs of its series stored since (the newest as the re-run), or, with
  none, raised ``open`` all the same as "unconfirmed: no worker of this chip"
  (:func:`settle_unconfirmable`, from the background loop). Either way it is no longer
  ``confirming``: an open one alerts, and its series is watched again. A slowdown confirmed within
  :data:`EXTEND_RUNS` runs after an open regression of the series (a ramp) moves that regression's
  new level instead of raising a second alert.
- :func:`scan` runs the offline change-point pass over every series; what it finds that no
  regression covers yet (:func:`.base.same_change`) is stored as ``open`` (its evidence already
  spans several runs). Where it finds an open regression's change one run off
  (:func:`.base.relocates`), it moves that regression to its run pair (cause and group included).
  Then every open regression of the series is re-placed where its change most likely is, now that
  runs on both sides are stored (:func:`.locate.locate`: maximum likelihood of the two levels around
  it, favouring a run pair where a recorded attribute changed).
- Every test takes the series' own minimum effect where one is set (:func:`.triage.min_effect`), else
  the settings' ``regression_min_effect``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import db_now, immediate, is_sqlite
from kernelfleet.service.hooks import on_result_stored
from kernelfleet.service.models import (
    Backend,
    Job,
    JobKind,
    JobState,
    Regression,
    RegressionStatus,
    Result,
    Worker,
)
from kernelfleet.service.regressions import base
from kernelfleet.service.regressions.attribution import attribute, group_key
from kernelfleet.service.regressions.locate import locate
from kernelfleet.service.regressions.series import SeriesKey, history, load_runs, reset_point, to_run
from kernelfleet.service.regressions.triage import min_effect
from kernelfleet.service.settings import Settings
from kernelfleet.service.targets import exact_chip_pattern, target_id

logger = logging.getLogger(__name__)

SCAN_LOCK = 0x6B66_7265  # PostgreSQL advisory lock id for the scan ("kfre")
SCAN_RUNS = 200  # runs per series the scan looks at
EXTEND_RUNS = 6  # a slowdown confirmed this soon after an open regression extends it
CONFIRM_RUNS = 60  # runs loaded to settle a confirmation (the suspect's baseline and slower runs)
# how a regression was confirmed (Regression.confirmation)
RERUN = "re-run"  # its confirmation job, run by a worker of its chip, reproduced it
STORED_RUNS = "stored runs"  # no worker of its chip re-ran it in time: the runs stored after it did
UNCONFIRMED = "unconfirmed: no worker of this chip"  # nothing confirmed it within the wait: raised anyway


def _run_of(session: Session, result_id: int) -> tuple[Result, base.RunPoint] | None:
    from kernelfleet.service.models import Trial

    row = session.execute(
        select(Result, Trial.samples_us, Trial.p10_us, Trial.p90_us, Trial.n)
        .outerjoin(Trial, and_(Trial.result_id == Result.id, Trial.config_key == Result.best_config_key))
        .where(Result.id == result_id)
        .limit(1)
    ).first()
    if row is None:
        return None
    result = row[0]
    if result.best_config_key is None or not result.best_median_us or result.best_median_us <= 0:
        return None  # every trial failed: nothing to time
    return result, to_run(result, row[1], row[2], row[3], row[4])


def on_result(factory: sessionmaker[Session], result_id: int, settings: Settings) -> None:
    """The result hook: check a new run, or settle the regression it was a confirmation for.
    Runs in one write transaction, so two results of one series are judged one after the other."""
    with factory() as session, immediate(session):
        loaded = _run_of(session, result_id)
        if loaded is None:
            return
        result, run = loaded
        if result.job_id is not None:
            job_kind = session.scalar(select(Job.kind).where(Job.id == result.job_id))
            if job_kind == JobKind.confirm:
                settle_confirmation(session, result, run, settings)
                return
        check_run(session, result, run, settings)


def can_rerun(session: Session, chip: str, backend: str, settings: Settings) -> bool:
    """True when an enrolled, unrevoked worker of ``chip`` and ``backend`` was seen lately (by the fleet
    page's offline threshold): one that could lease a confirmation job now."""
    seen = db_now(-settings.worker_offline_after_seconds)
    return bool(session.scalar(select(func.count(Worker.id)).where(
        Worker.chip == chip, Worker.backend == Backend(backend), Worker.revoked_at.is_(None),
        Worker.last_heartbeat_at >= seen)))


def check_run(session: Session, result: Result, run: base.RunPoint, settings: Settings) -> Regression | None:
    """Inside a transaction: a ``confirming`` regression and its confirm job when ``run`` is suspect."""
    key = SeriesKey.of(result)
    pending = session.scalar(
        select(func.count(Regression.id)).where(
            *_series_where(key), Regression.status == RegressionStatus.confirming
        )
    )
    if pending:
        return None  # one question at a time: the series waits for its confirmation
    past = history(session, key, result.id, settings.regression_history_runs)
    finding = base.online().check(past, run, min_effect(session, key, settings.regression_min_effect))
    if finding is None:
        return None
    runs = [*past, run]
    before, first_slow = runs[finding.index - 1], runs[finding.index]
    cause = attribute(before, first_slow)
    job = _confirm_job(session, result, settings)
    regression = Regression(
        group_key=group_key(result.kernel, key.as_tuple(), cause),
        kernel=result.kernel,
        shape=result.shape,
        dtype=result.dtype,
        chip=result.chip,
        config_key=result.best_config_key,
        status=RegressionStatus.confirming,
        detector=finding.detector,
        baseline_median_us=finding.baseline_median_us,
        new_median_us=finding.new_median_us,
        effect=finding.effect,
        p_value=finding.p_value,
        cause=cause,
        baseline_result_id=before.result_id,
        result_id=first_slow.result_id,
        confirm_job_id=job.id,
    )
    session.add(regression)
    session.flush()
    logger.info("suspected regression %s on %s: %+.1f%%, confirm job %s", regression.id, key,
                100 * finding.effect, job.id)
    return regression


def _confirm_job(session: Session, result: Result, settings: Settings) -> Job:
    chip_pattern = exact_chip_pattern(result.chip)
    job = Job(
        kind=JobKind.confirm,
        kernel=result.kernel,
        shape=result.shape,
        dtype=result.dtype,
        target_backend=Backend(result.backend),
        target_chip=chip_pattern,
        target_id=target_id(session, Backend(result.backend), chip_pattern),
        state=JobState.queued,
        attempts=0,
        max_attempts=settings.max_attempts,
    )
    session.add(job)
    session.flush()
    return job


def settle_confirmation(session: Session, result: Result, rerun: base.RunPoint, settings: Settings) -> None:
    """Inside a transaction: open or dismiss the regression whose confirm job produced ``result``."""
    regression = session.scalars(
        select(Regression).where(
            Regression.confirm_job_id == result.job_id, Regression.status == RegressionStatus.confirming
        )
    ).first()
    if regression is not None:  # else acknowledged meanwhile, or not ours
        _settle(session, regression, rerun, settings, RERUN, result)


def _settle(session: Session, regression: Regression, rerun: base.RunPoint, settings: Settings,
            how: str, rerun_result: Result | None = None) -> None:
    """Open ``regression`` (confirmed ``how``) when its slower runs and ``rerun`` reproduce it
    together and are enough to alert (:meth:`.base.OnlineDetector.settled`); else dismiss it. When
    they reproduce it but are too few (two slower runs of a modest effect, as a bad pair looks), it
    stays ``confirming``: with ``rerun_result`` (a confirm job's) another confirm job is queued,
    else (judged on stored runs) it waits for the next stored run."""
    if regression.result_id is None:
        return
    key = SeriesKey.of(regression)
    # the baseline and the suspect's slower runs, plus whatever the series stored since
    past = history(session, key, rerun.result_id, CONFIRM_RUNS)
    index = next((i for i, p in enumerate(past) if p.result_id == regression.result_id), 0)
    suspect = base.Finding(
        detector=regression.detector,
        index=index,
        baseline_median_us=regression.baseline_median_us,
        new_median_us=regression.new_median_us,
        effect=regression.effect,
        p_value=regression.p_value or 0.0,
    )
    detector = base.online()
    joint = detector.confirms(past, suspect, rerun, min_effect(session, key, settings.regression_min_effect))
    if joint is not None and not detector.settled(joint, len(past) - index + 1):
        # the next re-run: a new confirm job, or (none can run) the next run stored
        regression.confirm_job_id = (
            _confirm_job(session, rerun_result, settings).id if rerun_result is not None else None
        )
        logger.info("regression %s reproduced on too few runs: one more re-run", regression.id)
        return
    if joint is None:
        regression.status = RegressionStatus.dismissed
        if how == STORED_RUNS:
            regression.acknowledged_note = "not confirmed by the runs stored after it (no worker of its chip)"
        logger.info("regression %s dismissed by result %s (%s)", regression.id, rerun.result_id, how)
        return
    regression.confirmation = how
    regression.new_median_us, regression.effect, regression.p_value = (
        joint.new_median_us, joint.effect, joint.p_value
    )
    extended = _extends(session, key, regression, index, past[0].result_id if past else None)
    if extended is not None:
        extended.new_median_us = joint.new_median_us
        extended.effect = joint.new_median_us / extended.baseline_median_us - 1.0
        regression.status = RegressionStatus.dismissed
        regression.acknowledged_note = (
            f"continues regression {extended.id} (the slowdown kept rising): its new level was updated"
        )
        logger.info("regression %s extends regression %s", regression.id, extended.id)
        return
    regression.status = RegressionStatus.open
    logger.info("regression %s confirmed by result %s (%s)", regression.id, rerun.result_id, how)


def settle_unconfirmable(factory: sessionmaker[Session], settings: Settings) -> list[int]:
    """Background: every regression still ``confirming`` after
    :attr:`Settings.regression_confirm_wait_seconds` whose confirm job no worker has leased while no
    worker of its chip is online (none enrolled: imported reports; or a Mac that is off) is settled
    without it: by the runs of its series stored since (the newest as the re-run: ``open``, confirmed
    by :data:`STORED_RUNS`, or ``dismissed``), else raised ``open`` as :data:`UNCONFIRMED`. Its job is
    cancelled; an open one alerts, and the series is watched again. Returns the ids settled."""
    settled: list[int] = []
    with factory() as session, immediate(session):
        waiting = session.execute(
            select(Regression, Job.state, Result.backend)
            .outerjoin(Job, Job.id == Regression.confirm_job_id)
            .outerjoin(Result, Result.id == Regression.result_id)
            .where(Regression.status == RegressionStatus.confirming,
                   Regression.detected_at < db_now(-settings.regression_confirm_wait_seconds))
        ).all()
        for regression, job_state, backend in waiting:
            if job_state not in (None, JobState.queued) or regression.result_id is None or (
                    can_rerun(session, regression.chip, backend or "cpu", settings)):
                continue  # leased, or a worker that can run it is online: let it
            if regression.confirm_job_id is not None:
                session.execute(update(Job).where(Job.id == regression.confirm_job_id,
                                                  Job.state == JobState.queued)
                                .values(state=JobState.cancelled, updated_at=db_now(), finished_at=db_now())
                                .execution_options(synchronize_session=False))
            since = load_runs(session, SeriesKey.of(regression), after_id=regression.result_id + 1, limit=1)
            if since:  # the newest run stored after it stands for the re-run
                _settle(session, regression, since[-1], settings, STORED_RUNS)
            else:
                regression.status, regression.confirmation = RegressionStatus.open, UNCONFIRMED
                logger.info("regression %s raised unconfirmed: no worker of %s", regression.id,
                            regression.chip)
            settled.append(regression.id)
    return settled


def _extends(
    session: Session, key: SeriesKey, regression: Regression, index: int, first_loaded: int | None
) -> Regression | None:
    """The open regression this confirmed one continues: the series' baseline restarted at it (so
    the runs loaded, ``first_loaded`` on, start there) no more than :data:`EXTEND_RUNS` runs before
    this one's first slower run (``index``)."""
    assert regression.result_id is not None
    start = reset_point(session, key, regression.result_id)
    if start is None or start != first_loaded or index > EXTEND_RUNS:
        return None
    earlier = session.scalars(
        select(Regression).where(*_series_where(key), Regression.result_id == start).order_by(Regression.id)
    ).first()
    return earlier if earlier is not None and earlier.status == RegressionStatus.open else None


def _series_where(key: SeriesKey) -> tuple[ColumnElement[bool], ...]:
    return (
        Regression.chip == key.chip,
        Regression.kernel == key.kernel,
        Regression.shape == key.shape,
        Regression.dtype == key.dtype,
    )


@dataclass(frozen=True)
class ScanReport:
    series: int
    findings: int
    created: list[int]
    moved: list[int]  # open regressions whose first slower run (and cause) the scan corrected


def scan(factory: sessionmaker[Session], settings: Settings) -> ScanReport:
    """The offline change-point pass over every series; stores what no regression covers yet."""
    detector = base.offline()
    created: list[int] = []
    moved: list[int] = []
    findings = 0
    with factory() as session:
        keys = [
            SeriesKey(*row)
            for row in session.execute(
                select(Result.chip, Result.kernel, Result.shape, Result.dtype)
                .distinct()
                .where(Result.best_config_key.is_not(None))
            ).all()
        ]
    for key in keys:
        with factory() as session, immediate(session):
            if not is_sqlite(session.get_bind().engine):
                session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCAN_LOCK})
            runs = load_runs(session, key, limit=SCAN_RUNS)
            effect = min_effect(session, key, settings.regression_min_effect)
            found = detector.scan(runs, effect)
            findings += len(found)
            position = {r.result_id: i for i, r in enumerate(runs)}
            medians = [r.median_us for r in runs]
            existing = session.scalars(
                select(Regression).where(*_series_where(key), Regression.status != RegressionStatus.dismissed)
            ).all()
            taken = [(position[r.result_id], r) for r in existing if r.result_id in position]
            placed_at = {r.id: r.result_id for _, r in taken}  # where each stood before this scan
            for f in found:
                levels = (f.baseline_median_us, f.new_median_us)
                same = [
                    (i, r)
                    for i, r in taken
                    if base.same_change(
                        i, (r.baseline_median_us, r.new_median_us), f.index, levels, medians, effect
                    )
                ]
                if same:
                    i, covering = same[0]
                    if covering.status == RegressionStatus.open and base.relocates(i, f, effect):
                        _relocate(covering, key, runs, f.index)
                        # where it stands now: the re-placement below starts (and compares) from here
                        taken[taken.index((i, covering))] = (f.index, covering)
                    continue
                new_run = runs[f.index]
                cause = attribute(runs[f.index - 1], new_run)
                regression = Regression(
                    group_key=group_key(key.kernel, key.as_tuple(), cause),
                    kernel=key.kernel,
                    shape=key.shape,
                    dtype=key.dtype,
                    chip=key.chip,
                    config_key=new_run.attrs.get("config_key"),
                    status=RegressionStatus.open,
                    detector=f.detector,
                    baseline_median_us=f.baseline_median_us,
                    new_median_us=f.new_median_us,
                    effect=f.effect,
                    p_value=f.p_value,
                    cause=cause,
                    baseline_result_id=runs[f.index - 1].result_id,
                    result_id=new_run.result_id,
                )
                session.add(regression)
                session.flush()
                created.append(regression.id)
                taken.append((f.index, regression))
            _relocate_all(taken, key, runs)
            moved += [r.id for _, r in taken if r.id in placed_at and r.result_id != placed_at[r.id]]
    return ScanReport(series=len(keys), findings=findings, created=created, moved=moved)


def _relocate_all(
    taken: list[tuple[int, Regression]], key: SeriesKey, runs: list[base.RunPoint]
) -> list[int]:
    """Every open regression of the series re-placed where its change most likely is
    (:func:`.locate.locate`, between its neighbours), from where it stands now (``taken``: each
    regression at its current index into ``runs``); the ids of those this moved."""
    taken = sorted(taken, key=lambda ir: ir[0])
    placed = locate(runs, [i for i, _ in taken])
    moved: list[int] = []
    for (i, regression), j in zip(taken, placed, strict=True):
        if j != i and i > 0 and regression.status == RegressionStatus.open:
            _relocate(regression, key, runs, j)
            moved.append(regression.id)
    return moved


def _relocate(regression: Regression, key: SeriesKey, runs: list[base.RunPoint], index: int) -> None:
    """Move an open regression to the run pair the scan found around its change (and so its cause
    and group, unless a person grouped it by hand: ``group_note``)."""
    before, first_slow = runs[index - 1], runs[index]
    cause = attribute(before, first_slow)
    regression.result_id, regression.baseline_result_id = first_slow.result_id, before.result_id
    regression.cause = cause
    if regression.group_note is None:
        regression.group_key = group_key(key.kernel, key.as_tuple(), cause)
    logger.info("regression %s moved by the scan to result %s", regression.id, first_slow.result_id)


on_result_stored(on_result)
