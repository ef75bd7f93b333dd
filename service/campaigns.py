"""Campaigns: each kernel x its shapes x dtypes, expanded into one job each, and a model's runtime
settings, one job per chip and quantization (:func:`runtime_targets`; a chip whose first worker
enrolls later gets its own: :func:`runtime_jobs_for_chip`); progress counts per state;
the warning at creation when no enrolled worker can run them. Cancel, delete and retry live in
:mod:`kernelfleet.service.campaign_control`.

A campaign's ``spec`` JSON holds ``kernel_shapes`` (kernel -> its own shapes: a model's calls differ
per kernel), plus ``kernels``, ``shapes`` (every shape, in order) and ``dtypes``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from kernelfleet.runtime_settings_file import JOB_KERNEL, dtype_label, shape_key
from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import Backend, Campaign, Job, JobKind, JobState, Worker
from kernelfleet.service.schemas import CampaignIn, CampaignOut, Progress
from kernelfleet.service.targets import exact_chip_pattern, target_id, target_matches


def create_campaign(session: Session, body: CampaignIn, default_max_attempts: int) -> int:
    max_attempts = body.max_attempts or default_max_attempts
    backend = Backend(body.target_backend) if body.target_backend else None
    kernel_shapes = body.shape_sets()
    spec = campaign_spec(kernel_shapes, body.dtypes)
    own = (backend, body.target_chip)
    jobs = [(JobKind.tune, k, s, d, own)
            for k, shapes in kernel_shapes.items() for s in shapes for d in body.dtypes]
    with immediate(session):
        if body.runtime_settings is not None:
            plan = body.runtime_settings
            spec["runtime_settings"] = plan.model_dump(mode="json", exclude={"layers"})
            model = shape_key(plan.config)
            jobs += [(JobKind.runtime_settings, JOB_KERNEL, model, d, where)
                     for where in runtime_targets(session, backend, body.target_chip)
                     for d in plan.job_dtypes()]
        campaign = Campaign(name=body.name, target_backend=backend, target_chip=body.target_chip,
                            max_attempts=max_attempts, spec=spec)
        session.add(campaign)
        session.flush()
        targets = {where: target_id(session, *where) for where in {j[4] for j in jobs}}
        session.execute(insert(Job), [
            _queued(campaign.id, kind, k, s, d, where, targets[where], max_attempts)
            for kind, k, s, d, where in jobs
        ])
        campaign_id = campaign.id
    return campaign_id


def runtime_targets(session: Session, backend: Backend | None, chip: str | None
                    ) -> list[tuple[Backend | None, str | None]]:
    """Where a campaign's runtime-settings jobs go (each chip has its own settings): one target per
    chip of the enrolled, unrevoked workers that the campaign's target matches, that chip exactly on
    its backend; the campaign's own target while none is enrolled."""
    rows = session.execute(select(Worker.backend, Worker.chip).distinct()
                           .where(Worker.revoked_at.is_(None))).all()
    chips = sorted({(Backend(b), c) for b, c in rows if target_matches(backend, chip, b, c)})
    return [(b, exact_chip_pattern(c)) for b, c in chips] or [(backend, chip)]


def _queued(campaign_id: int, kind: JobKind, kernel: str, shape: str, dtype: str,
            where: tuple[Backend | None, str | None], target: int, max_attempts: int) -> dict[str, Any]:
    """One new job's row, queued on the target ``where`` (its id ``target``)."""
    return {"campaign_id": campaign_id, "kind": kind, "kernel": kernel, "shape": shape, "dtype": dtype,
            "target_backend": where[0], "target_chip": where[1], "target_id": target,
            "state": JobState.queued, "attempts": 0, "max_attempts": max_attempts}


def runtime_jobs_for_chip(session: Session, backend: Backend, chip: str) -> None:
    """A worker of ``chip`` enrolled (called in its enrollment's transaction): every campaign with
    runtime-settings jobs, not cancelled, whose target matches the chip and that holds none of its
    runtime jobs for that chip exactly, gets them, as if the chip had been enrolled when the campaign
    was made: its queued jobs on the campaign's own target (made while no worker was enrolled) move to
    the chip, and one job is added per (model, quantization) the campaign searches that none of those
    covers."""
    exact = exact_chip_pattern(chip)
    campaigns = session.scalars(select(Campaign).where(Campaign.cancelled_at.is_(None),
                                                       Campaign.deleted_at.is_(None))).all()
    for campaign in campaigns:
        if "runtime_settings" not in (campaign.spec or {}):
            continue
        if not target_matches(campaign.target_backend, campaign.target_chip, backend, chip):
            continue
        jobs = session.scalars(select(Job).where(Job.campaign_id == campaign.id,
                                                 Job.kind == JobKind.runtime_settings)).all()
        if any(j.target_backend == backend and j.target_chip == exact for j in jobs):
            continue
        target = target_id(session, backend, exact)
        fallback = [j for j in jobs if j.state == JobState.queued
                    and (j.target_backend, j.target_chip) == (campaign.target_backend, campaign.target_chip)]
        for job in fallback:
            job.target_backend, job.target_chip, job.target_id = backend, exact, target
        # every (model, quantization) the campaign searches that no moved job covers
        searched = sorted({(j.shape, j.dtype) for j in jobs} - {(j.shape, j.dtype) for j in fallback})
        if searched:
            session.execute(insert(Job), [
                _queued(campaign.id, JobKind.runtime_settings, JOB_KERNEL, shape, dtype, (backend, exact),
                        target, campaign.max_attempts)
                for shape, dtype in searched])


def campaign_spec(kernel_shapes: dict[str, list[str]], dtypes: list[str]) -> dict[str, Any]:
    """The stored ``spec`` of a campaign (migration 0005 writes the same for older campaigns); a campaign
    with runtime-settings jobs adds ``runtime_settings`` (its
    :class:`~kernelfleet.service.schemas.RuntimeSettingsPlan` as given, the config cut to its ``layers``)."""
    every = list(dict.fromkeys(s for shapes in kernel_shapes.values() for s in shapes))
    return {"kernels": list(kernel_shapes), "shapes": every, "dtypes": list(dtypes),
            "kernel_shapes": {k: list(v) for k, v in kernel_shapes.items()}}


def runtime_settings_request(spec: dict[str, Any], dtype: str) -> dict[str, Any] | None:
    """What a leased runtime_settings job searches: its campaign's ``runtime_settings`` with the
    quantization of the job's ``dtype`` (None when the campaign has none)."""
    plan = spec.get("runtime_settings")
    if not plan:
        return None
    quant = next((q for q in plan["quantizations"] if dtype_label(q, plan["compute_dtype"]) == dtype), None)
    request = {k: v for k, v in plan.items() if k != "quantizations"}
    return {**request, "quantization": quant}


def _progress(session: Session, ids: list[int]) -> dict[int, Progress]:
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    if ids:
        rows = session.execute(
            select(Job.campaign_id, Job.state, func.count()).where(Job.campaign_id.in_(ids))
            .group_by(Job.campaign_id, Job.state)
        ).all()
        for cid, state, n in rows:
            counts[cid][JobState(state).value] = n
    return {cid: Progress(total=sum(counts[cid].values()), **counts[cid]) for cid in ids}


def target_warnings(session: Session, backend: Backend | None, chip: str | None,
                    offline_after_seconds: float) -> list[str]:
    """Why the jobs of a campaign aimed at ``(backend, chip glob)`` may never run: no enrolled (not
    revoked) worker matches it, or none of those that match has been seen lately."""
    target = " ".join(x for x in (backend.value if backend else None, repr(chip) if chip else None) if x)
    rows = session.execute(
        select(Worker.backend, Worker.chip, Worker.last_heartbeat_at >= db_now(-offline_after_seconds))
        .where(Worker.revoked_at.is_(None))
    ).all()
    matching = [r for r in rows if target_matches(backend, chip, r[0], r[1])]
    if not matching:
        have = sorted({f"{r[1]} ({Backend(r[0]).value})" for r in rows})
        enrolled = f"enrolled: {', '.join(have[:10])}" if have else "no worker is enrolled yet"
        return [f"no enrolled worker matches {target or 'this campaign'} ({enrolled}); its jobs wait "
                f"until one enrolls"]
    if not any(r[2] for r in matching):
        return [f"{len(matching)} enrolled worker(s) match {target or 'this campaign'}, but none has been "
                f"seen in the last {offline_after_seconds:g} s"]
    return []


def _out(c: Campaign, progress: Progress) -> CampaignOut:
    return CampaignOut(id=c.id, name=c.name, kernels=list(c.spec.get("kernels", [])),
                       shapes=list(c.spec.get("shapes", [])), dtypes=list(c.spec.get("dtypes", [])),
                       kernel_shapes=dict(c.spec.get("kernel_shapes", {})),
                       target_backend=c.target_backend.value if c.target_backend else None,
                       target_chip=c.target_chip, max_attempts=c.max_attempts, created_at=c.created_at,
                       progress=progress, cancelled_at=c.cancelled_at)


def live_campaign(session: Session, campaign_id: int) -> Campaign:
    """The campaign row, unless it does not exist or was deleted (404)."""
    c = session.get(Campaign, campaign_id)
    if c is None or c.deleted_at is not None:
        raise NotFound(f"campaign {campaign_id} does not exist"
                       + (" (it was deleted)" if c is not None else ""))
    return c


def get_campaign(session: Session, campaign_id: int) -> CampaignOut:
    c = live_campaign(session, campaign_id)
    return _out(c, _progress(session, [c.id])[c.id])


def list_campaigns(session: Session, limit: int, offset: int) -> list[CampaignOut]:
    rows = session.scalars(select(Campaign).where(Campaign.deleted_at.is_(None))
                           .order_by(Campaign.id.desc()).limit(limit).offset(offset)).all()
    progress = _progress(session, [c.id for c in rows])
    return [_out(c, progress[c.id]) for c in rows]
