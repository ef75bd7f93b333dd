"""Triage: what a person does with an alert, each change recorded with who made it and when.

- :func:`acknowledge` (``open``/``confirming`` -> ``acknowledged``, one alert or its whole group) and
  :func:`mark`: ``invalid`` (noise: the baseline does not restart at it), ``ignored`` (expected: the
  slower level is the new normal), ``fixed`` (undone later: linked to a later alert of the series or
  to the run that shows the fix), or ``open`` again (undoing a mark). Marking one still
  ``confirming`` ends its confirmation (its queued job is cancelled by the caller).
- :func:`regroup`: an alert moved into another alert's group, or out of its group into one of its
  own (``manual=ID``); ``group_note`` keeps what was done, and the scan's re-placement then leaves
  its group alone.
- :func:`min_effect`: a series' own minimum effect (:class:`SeriesThreshold`), which the detectors use
  instead of the settings' ``regression_min_effect`` for that series; :func:`set_threshold` and
  :func:`delete_threshold` change it.

Every status or group change appends a :class:`RegressionEvent` (who, when, old, new, note): an
append-only table rather than a JSON list on the regression, so two concurrent changes never
rewrite one another's entries and the history is a plain indexed query.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, exists, select, update
from sqlalchemy.orm import Session

from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import Conflict, Invalid, NotFound
from kernelfleet.service.models import Regression, RegressionEvent, RegressionStatus, Result, SeriesThreshold
from kernelfleet.service.regressions.series import SeriesKey

S = RegressionStatus
ACTIVE = (S.open, S.confirming)
MARKS = (S.invalid, S.ignored, S.fixed)  # what a person may mark an alert
# the statuses each mark may come from (dismissed: the detector's own verdict, nothing to triage)
MARKABLE: dict[RegressionStatus, tuple[RegressionStatus, ...]] = {
    **{m: (S.confirming, S.open, S.acknowledged, *MARKS) for m in MARKS},
    S.open: (S.acknowledged, *MARKS),  # reopening undoes a person's mark; a confirming one waits
}
MISSING = "no regression {}; list them with GET /api/v1/regressions"


def _get(session: Session, regression_id: int, what: str = "regression") -> Regression:
    row = session.get(Regression, regression_id)
    if row is None:
        raise NotFound(MISSING.format(regression_id).replace("regression", what, 1))
    return row


def record(session: Session, regression_id: int, actor: str, action: str, old: str | None, new: str,
           note: str | None, detail: dict[str, Any] | None = None) -> None:
    """Append one change to a regression's history."""
    session.add(RegressionEvent(regression_id=regression_id, actor=actor, action=action, old=old, new=new,
                                note=note, detail=detail))


def _set_status(session: Session, rows: list[Regression], status: RegressionStatus, actor: str,
                note: str | None, **values: Any) -> None:
    """Move ``rows`` to ``status`` (one UPDATE, guarded by each row's old status) and record it."""
    for row in rows:
        session.execute(update(Regression).where(Regression.id == row.id, Regression.status == row.status)
                        .values(status=status, status_changed_by=actor, status_changed_at=db_now(),
                                status_note=note, **values)
                        .execution_options(synchronize_session=False))
        detail = {k: v for k, v in values.items() if k.startswith("fixed_by") and v is not None}
        record(session, row.id, actor, "status", row.status.value, status.value, note, detail or None)


def acknowledge(session: Session, regression_id: int, note: str | None, whole_group: bool = False,
                actor: str = "admin") -> list[int]:
    """Acknowledge one regression (or every open/confirming one of its group); returns the ids."""
    with immediate(session):
        regression = _get(session, regression_id)
        if regression.status == S.acknowledged:
            raise Conflict(f"regression {regression_id} is already acknowledged")
        if regression.status == S.dismissed:
            raise Conflict(
                f"regression {regression_id} was dismissed (its confirmation run did not reproduce "
                f"it); there is nothing to acknowledge"
            )
        if regression.status not in ACTIVE:
            raise Conflict(f"regression {regression_id} is {regression.status.value}; only an open or "
                           f"confirming one can be acknowledged")
        target = (Regression.group_key == regression.group_key) if whole_group else (
            Regression.id == regression_id)
        rows = list(session.scalars(select(Regression).where(target, Regression.status.in_(ACTIVE))
                                    .with_for_update()))
        _set_status(session, rows, S.acknowledged, actor, note, acknowledged_at=db_now(),
                    acknowledged_note=note)
    return sorted(r.id for r in rows)


def mark(session: Session, regression_id: int, status: RegressionStatus, actor: str, note: str | None,
         fixed_by_regression_id: int | None = None, fixed_by_result_id: int | None = None,
         whole_group: bool = False) -> list[int]:
    """Mark a regression ``invalid``, ``ignored`` or ``fixed`` (with what fixed it), or ``open`` again;
    with ``whole_group`` also every other regression of its group whose status can move there (not
    ``fixed``: a fix belongs to one series). 404 for an unknown regression or link; 422 for a link
    that cannot have fixed it; 409 when its status cannot move there. Returns the ids changed."""
    fixing = fixed_by_regression_id is not None or fixed_by_result_id is not None
    if whole_group and status == S.fixed:
        raise Invalid("whole_group does not go with fixed: mark each regression fixed by its own series' run")
    if status not in MARKABLE:
        raise Invalid(f"status must be one of {', '.join(s.value for s in MARKABLE)}; acknowledge with "
                      f"POST /api/v1/regressions/{{id}}/acknowledge")
    if (status == S.fixed) != fixing:
        raise Invalid("fixed needs fixed_by_regression_id or fixed_by_result_id (the later alert or run "
                      "that shows the fix)" if status == S.fixed else
                      "fixed_by_regression_id and fixed_by_result_id go with status fixed only")
    with immediate(session):
        regression = _get(session, regression_id)
        if fixing:
            _check_fix(session, regression, fixed_by_regression_id, fixed_by_result_id)
        if regression.status == status:
            raise Conflict(f"regression {regression_id} is already {status.value}")
        if regression.status not in MARKABLE[status]:
            why = {S.dismissed: "its confirmation did not reproduce it: there is nothing to triage",
                   S.confirming: "it is still being confirmed: acknowledge it or mark it instead"}
            raise Conflict(f"regression {regression_id} is {regression.status.value} and cannot be marked "
                           f"{status.value}: " + why.get(regression.status, "it is not triaged"))
        rows = [regression]
        if whole_group:
            rows += session.scalars(select(Regression).where(
                Regression.group_key == regression.group_key, Regression.id != regression_id,
                Regression.status.in_([s for s in MARKABLE[status] if s != status])).with_for_update())
        _set_status(session, rows, status, actor, note, fixed_by_regression_id=fixed_by_regression_id,
                    fixed_by_result_id=fixed_by_result_id)
    return sorted(r.id for r in rows)


def _check_fix(session: Session, regression: Regression, by_regression: int | None,
               by_result: int | None) -> None:
    """A fix is later than the alert's first slower run, on the same series."""
    series = f"({regression.chip}, {regression.kernel} {regression.shape} {regression.dtype})"
    first_slow = regression.result_id or 0
    if by_regression is not None:
        other = _get(session, by_regression)
        if other.id == regression.id:
            raise Invalid(f"regression {regression.id} cannot be fixed by itself")
        if SeriesKey.of(other) != SeriesKey.of(regression) or (other.result_id or 0) <= first_slow:
            raise Invalid(f"regression {by_regression} is not a later change of the same series {series}")
    if by_result is not None:
        run = session.get(Result, by_result)
        if run is None:
            raise NotFound(f"no run {by_result}; runs are listed by GET /api/v1/results")
        if SeriesKey.of(run) != SeriesKey.of(regression) or run.id <= first_slow:
            raise Invalid(f"run {by_result} is not a later run of the same series {series}")


def own_group(regression_id: int) -> str:
    return f"manual={regression_id}"


def regroup(session: Session, regression_id: int, into: int | None, actor: str, note: str | None) -> None:
    """Move a regression into the group of regression ``into``, or (``into`` None) out of its group
    into one of its own. 404 for an unknown id, 409 when it is in that group already."""
    with immediate(session):
        regression = _get(session, regression_id)
        if into is None:
            key, what = own_group(regression_id), "moved out of its group"
            alone = not session.scalar(select(exists().where(Regression.group_key == regression.group_key,
                                                             Regression.id != regression_id)))
            if alone:
                raise Conflict(f"regression {regression_id} is alone in its group already")
        else:
            if into == regression_id:
                raise Invalid("into must be another regression's id (into: null moves it out of its group)")
            key = _get(session, into).group_key
            what = f"moved into the group of regression {into}"
            if key == regression.group_key:
                raise Conflict(f"regression {regression_id} is in the group of regression {into} already")
        group_note = f"{what} by {actor}" + (f": {note}" if note else "")
        session.execute(update(Regression).where(Regression.id == regression_id)
                        .values(group_key=key, group_note=group_note)
                        .execution_options(synchronize_session=False))
        record(session, regression_id, actor, "group", regression.group_key, key, note,
               {"into": into} if into is not None else None)


def history(session: Session, regression_id: int) -> list[RegressionEvent]:
    """Every change a person made to a regression, oldest first (404 for an unknown one)."""
    _get(session, regression_id)
    return list(session.scalars(select(RegressionEvent).where(RegressionEvent.regression_id == regression_id)
                                .order_by(RegressionEvent.id)))


def _series(key: SeriesKey) -> tuple[ColumnElement[bool], ...]:
    return (SeriesThreshold.chip == key.chip, SeriesThreshold.kernel == key.kernel,
            SeriesThreshold.shape == key.shape, SeriesThreshold.dtype == key.dtype)


def min_effect(session: Session, key: SeriesKey, default: float) -> float:
    """The series' own minimum effect where one is set, else ``default`` (one lookup by its unique key)."""
    own = session.scalar(select(SeriesThreshold.min_effect).where(*_series(key)))
    return default if own is None else float(own)


def set_threshold(session: Session, key: SeriesKey, value: float, note: str | None,
                  actor: str) -> tuple[SeriesThreshold, bool]:
    """Set (or replace) a series' minimum effect; 404 when the series has no stored run. Returns the
    row and whether it is new."""
    with immediate(session):
        if not session.scalar(select(exists().where(
                Result.chip == key.chip, Result.kernel == key.kernel, Result.shape == key.shape,
                Result.dtype == key.dtype))):
            raise NotFound(f"no run of {key.kernel} {key.shape} {key.dtype} on {key.chip}: a threshold is "
                           f"set for a series with stored runs (GET /api/v1/results lists them)")
        row = session.scalars(select(SeriesThreshold).where(*_series(key)).with_for_update()).first()
        created = row is None
        if row is None:
            row = SeriesThreshold(chip=key.chip, kernel=key.kernel, shape=key.shape, dtype=key.dtype,
                                  min_effect=value, note=note, set_by=actor)
            session.add(row)
        else:
            row.min_effect, row.note, row.set_by, row.set_at = value, note, actor, db_now()
        session.flush()
        session.refresh(row)
    return row, created


def list_thresholds(session: Session) -> list[SeriesThreshold]:
    return list(session.scalars(select(SeriesThreshold).order_by(
        SeriesThreshold.chip, SeriesThreshold.kernel, SeriesThreshold.shape, SeriesThreshold.dtype)))


def delete_threshold(session: Session, threshold_id: int) -> SeriesThreshold:
    """Remove a series' own minimum effect (the settings' applies again); returns the removed row."""
    with immediate(session):
        row = session.get(SeriesThreshold, threshold_id)
        if row is None:
            raise NotFound(f"no threshold {threshold_id}; list them with GET /api/v1/regressions/thresholds")
        session.delete(row)
    return row
