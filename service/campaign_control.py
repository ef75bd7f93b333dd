"""Campaign control: cancel, delete and retry a campaign; cancel the confirmation jobs of settled
regressions; and the background sweep that keeps those true.

- Cancel: the campaign's queued jobs become ``cancelled``; leased ones run to the end and their
  results are kept. A leased job that comes back to the queue later (its lease expired, its worker
  released it) is cancelled by :func:`sweep`.
- Delete: cancel, hide the campaign, and remove its row (and its jobs: results stay, their ``job_id``
  cleared) as soon as none of its jobs is leased, at once or in a later :func:`sweep`.
- Retry: dead jobs go back to the queue with their attempts reset; done jobs whose run had no
  successful trial get a fresh job each (a done job keeps its result).
- A regression acknowledged, dismissed or triaged (invalid, ignored, fixed) needs no confirmation: its
  queued confirm job is cancelled (at once by the acknowledge and triage routes, and by :func:`sweep`
  whatever settled it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pydantic import BaseModel
from sqlalchemy import delete as sql_delete
from sqlalchemy import exists, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.campaigns import live_campaign
from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import Conflict
from kernelfleet.service.models import Campaign, Job, JobKind, JobState, Regression, RegressionStatus, Result

logger = logging.getLogger(__name__)

# a regression in any of these needs no confirmation (acknowledged, dismissed, or triaged by a person)
SETTLED = (RegressionStatus.acknowledged, RegressionStatus.dismissed, RegressionStatus.invalid,
           RegressionStatus.ignored, RegressionStatus.fixed)


class ControlOut(BaseModel):
    campaign_id: int
    cancelled: int = 0  # queued jobs cancelled now
    running: int = 0  # leased jobs left to finish (their results are kept)
    requeued: int = 0  # dead jobs back in the queue (retry)
    recreated: int = 0  # new jobs for done jobs whose run had no successful trial (retry)
    deleted: bool = False  # the campaign row is gone (delete; False while jobs still run)
    detail: str


def _cancel_queued(session: Session, *where: object) -> list[int]:
    return list(session.scalars(
        update(Job).where(Job.state == JobState.queued, *where)  # type: ignore[arg-type]
        .values(state=JobState.cancelled, finished_at=db_now(), updated_at=db_now())
        .returning(Job.id).execution_options(synchronize_session=False)
    ).all())


def _running(session: Session, campaign_id: int) -> int:
    return len(session.scalars(select(Job.id).where(Job.campaign_id == campaign_id,
                                                    Job.state == JobState.leased)).all())


def cancel(session: Session, campaign_id: int) -> ControlOut:
    with immediate(session):
        campaign = live_campaign(session, campaign_id)
        if campaign.cancelled_at is None:
            campaign.cancelled_at = db_now()
        cancelled = _cancel_queued(session, Job.campaign_id == campaign_id)
        running = _running(session, campaign_id)
    return ControlOut(campaign_id=campaign_id, cancelled=len(cancelled), running=running,
                      detail=f"campaign {campaign_id} cancelled: {len(cancelled)} queued job(s) cancelled, "
                             f"{running} running job(s) finish and keep their results")


def delete(session: Session, campaign_id: int) -> ControlOut:
    with immediate(session):
        campaign = live_campaign(session, campaign_id)
        campaign.cancelled_at = campaign.cancelled_at or db_now()
        campaign.deleted_at = db_now()
        cancelled = _cancel_queued(session, Job.campaign_id == campaign_id)
        running = _running(session, campaign_id)
        gone = running == 0 and _purge(session, [campaign_id]) == 1
    later = "" if gone else f"; its row goes once its {running} running job(s) finish (results are kept)"
    return ControlOut(campaign_id=campaign_id, cancelled=len(cancelled), running=running, deleted=gone,
                      detail=f"campaign {campaign_id} deleted: {len(cancelled)} queued job(s) cancelled"
                      + later)


def retry(session: Session, campaign_id: int) -> ControlOut:
    with immediate(session):
        campaign = live_campaign(session, campaign_id)
        if campaign.cancelled_at is not None:
            raise Conflict(f"campaign {campaign_id} is cancelled; create a new campaign to run its jobs "
                           f"again")
        requeued = session.scalars(
            update(Job).where(Job.campaign_id == campaign_id, Job.state == JobState.dead)
            .values(state=JobState.queued, attempts=0, available_at=db_now(), finished_at=None,
                    lease_token=None, leased_by=None, lease_expires_at=None, lease_confirmed=False,
                    updated_at=db_now())
            .returning(Job.id).execution_options(synchronize_session=False)
        ).all()
        failed = session.scalars(
            select(Job).join(Result, Result.job_id == Job.id)
            .where(Job.campaign_id == campaign_id, Job.state == JobState.done,
                   Result.best_config_key.is_(None))
        ).all()
        if failed:
            session.execute(insert(Job), [
                {"campaign_id": campaign_id, "kind": JobKind.tune, "kernel": j.kernel, "shape": j.shape,
                 "dtype": j.dtype, "target_backend": j.target_backend, "target_chip": j.target_chip,
                 "target_id": j.target_id, "state": JobState.queued, "attempts": 0,
                 "max_attempts": campaign.max_attempts}
                for j in failed
            ])
    return ControlOut(campaign_id=campaign_id, requeued=len(requeued), recreated=len(failed),
                      detail=f"campaign {campaign_id}: {len(requeued)} dead job(s) requeued, {len(failed)} "
                             f"failed run(s) queued again")


def _purge(session: Session, campaign_ids: Sequence[int]) -> int:
    """Delete these deleted campaigns that have no leased or queued job left (jobs cascade; results
    keep their rows with ``job_id`` cleared). Returns how many went."""
    busy = exists().where(Job.campaign_id == Campaign.id, Job.state.in_([JobState.leased, JobState.queued]))
    gone = session.scalars(
        sql_delete(Campaign)
        .where(Campaign.id.in_(list(campaign_ids)), Campaign.deleted_at.is_not(None), ~busy)
        .returning(Campaign.id).execution_options(synchronize_session=False)
    ).all()
    return len(gone)


def _unneeded_confirmations() -> object:
    return Job.id.in_(select(Regression.confirm_job_id).where(
        Regression.status.in_(SETTLED), Regression.confirm_job_id.is_not(None)))


def cancel_confirmations(session: Session, regression_ids: Sequence[int]) -> list[int]:
    """Cancel the queued confirm jobs of these regressions if they are settled (:data:`SETTLED`)."""
    if not regression_ids:
        return []
    with immediate(session):
        jobs = select(Regression.confirm_job_id).where(Regression.id.in_(list(regression_ids)),
                                                       Regression.status.in_(SETTLED))
        return _cancel_queued(session, Job.kind == JobKind.confirm, Job.id.in_(jobs))


def sweep(factory: sessionmaker[Session]) -> int:
    """Background: cancel queued jobs of cancelled campaigns and queued confirmations of settled
    regressions, and remove deleted campaigns whose jobs have all finished. Looks first and writes
    only when there is something to do (one cheap read per pass)."""
    stray_campaign_jobs = (Job.state == JobState.queued,
                           Job.campaign_id.in_(select(Campaign.id).where(Campaign.cancelled_at.is_not(None))))
    stray_confirms = (Job.state == JobState.queued, Job.kind == JobKind.confirm, _unneeded_confirmations())
    with factory() as session:
        todo = session.execute(select(
            exists().where(*stray_campaign_jobs),
            exists().where(*stray_confirms),  # type: ignore[arg-type]
            exists().where(Campaign.deleted_at.is_not(None)),
        )).one()
        session.rollback()  # end the read: the write below takes SQLite's write lock up front
        if not any(todo):
            return 0
        with immediate(session):
            done = len(_cancel_queued(session, *stray_campaign_jobs[1:]))
            done += len(_cancel_queued(session, *stray_confirms[1:]))
            deleted = session.scalars(select(Campaign.id).where(Campaign.deleted_at.is_not(None))).all()
            done += _purge(session, deleted) if deleted else 0
    if done:
        logger.info("campaign sweep: %s job(s) cancelled or campaign(s) removed", done)
    return done
