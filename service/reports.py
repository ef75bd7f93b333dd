"""Storing tuning reports: the one function both job completion and admin import use.

:func:`store_report` inserts a ``results`` row and its ``trials``, folds the trials into the
incremental ``config_stats`` (O(its trials)), asks for the chip's profile to be rebuilt (an insert
into ``profile_requests``; the background builder coalesces them) and queues the result's reactions
(an insert into ``result_events``; :mod:`kernelfleet.service.reactions` runs the result hooks in
the background), all in the caller's transaction (it does not commit), so a completion stores its
result in the same transaction as the job's transition and no reaction is lost.

Round trips (each statement is one to a database that may be milliseconds away): on PostgreSQL a
result of a new series is four statements, the ``results`` insert (``RETURNING`` its id), the trials
and the stats rows (:func:`~kernelfleet.service.db.insert_rows`: one statement each, its rows one JSON
parameter, so its text is the same for any number of rows and parsed once, where a ``VALUES`` list of
every row cost 9 times the CPU; it replaced psycopg's executemany, a statement a row, and took a
report's storing from 16.2-17.0 to 9.9-10.4 ms of CPU, PostgreSQL's own from 8.5-9.0 to 4.5-5.1 ms:
``results/coordinator_result_cpu_profile.txt``), and the profile request carrying the event and the
stored response (``respond``) as data-modifying CTEs; a result of a known series adds the read and the
update of its stats rows (:func:`kernelfleet.service.aggregates.record`). SQLite, in-process, runs each
write on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from kernelfleet.service import aggregates
from kernelfleet.service.db import insert_rows, is_sqlite
from kernelfleet.service.models import ProfileRequest, Result, ResultEvent, Trial, TrialStatus
from kernelfleet.service.schemas import TuningReport


def store_report(
    session: Session,
    report: TuningReport,
    *,
    source: str = "import",
    job_id: int | None = None,
    worker_id: int | None = None,
    lease_token: str | None = None,
    respond: Callable[[int], dict[str, Any]] | None = None,
    payload_digest: str | None = None,
) -> Result:
    """Insert one validated report (result + trials) and return the flushed ``Result`` row.
    ``respond(result_id)``: what the call that stored it answers (kept in ``results.response``, for
    replays), written with the result's other rows. ``payload_digest``: the report's
    :meth:`~TuningReport.digest` when the caller has it already."""
    ok = [t for t in report.trials if t.status == "ok"]
    best = next((t for t in ok if t.config_key == report.best_config_key), None)
    builtin = next((t for t in ok if t.is_builtin), None)
    env = report.env
    result = Result(
        job_id=job_id,
        worker_id=worker_id,
        lease_token=lease_token,
        payload_digest=payload_digest or report.digest(),
        response={},
        source=source,
        kernel=report.kernel,
        shape=report.shape,
        dtype=report.dtype,
        chip=env.chip,
        backend=env.backend,
        mlx_version=env.mlx_version,
        revision=report.revision,
        os=env.os,
        driver=env.driver,
        kernel_hash=env.kernel_hash,
        strategy=report.strategy,
        best_config_key=report.best_config_key,
        best_is_builtin=bool(best and best.is_builtin),
        best_median_us=best.median_us if best else None,
        best_p10_us=best.p10_us if best else None,
        best_p90_us=best.p90_us if best else None,
        builtin_median_us=builtin.median_us if builtin else None,
        golden={**report.golden.model_dump(mode="json"), "seed": report.seed},
        measured_at=report.measured_at,
    )
    session.add(result)
    session.flush()
    rows = [
        {
            "result_id": result.id,
            "config_key": t.config_key,
            "config": t.config,
            "is_builtin": t.is_builtin,
            "status": TrialStatus(t.status),
            "error": t.error,
            "median_us": t.median_us,
            "p10_us": t.p10_us,
            "p90_us": t.p90_us,
            "n": t.n,
            "samples_us": t.samples_us,
            "max_abs_err": t.max_abs_err,
            "max_rel_err": t.max_rel_err,
            "shares_measurement_with": t.shares_measurement_with,
        }
        for t in report.trials
    ]
    insert_rows(session, Trial.__table__, rows)  # one statement on PostgreSQL, no ORM bookkeeping per trial
    aggregates.record(session, result, [{**r, "status": r["status"].value} for r in rows],
                      report.measured_at)
    response = respond(result.id) if respond is not None else {}
    writes = [_request(env.chip), _event(result.id)]
    if response:
        writes.append(_set_response(result.id, response))
    if is_sqlite(session.get_bind().engine):
        for write in writes:
            session.execute(write)
    else:  # one statement: the others as data-modifying CTEs of the first
        session.execute(writes[0].add_cte(*(w.cte(f"kf_write_{i}") for i, w in enumerate(writes[1:]))))
    set_committed_value(result, "response", response)  # as stored: nothing left to flush
    return result


def _set_response(result_id: int, response: dict[str, Any]) -> Any:
    table = Result.__table__
    return update(table).where(table.c.id == result_id).values(response=response)


def _request(chip: str) -> Any:
    """Ask for the chip's profile build."""
    return insert(ProfileRequest.__table__).values(chip=chip, allow_predicted=False)


def _event(result_id: int) -> Any:
    """Queue the result's reactions."""
    return insert(ResultEvent.__table__).values(result_id=result_id)
