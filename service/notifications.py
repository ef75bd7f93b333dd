"""Alerts: a webhook POST for each confirmed regression, delivered in the background with retries.

- :func:`enqueue_confirmed` finds regressions that became ``open`` (confirmed by their re-run, or
  found by the scan) and not yet announced, marks them announced and queues one delivery per URL in
  :attr:`Settings.webhook_urls` with the payload fixed at that moment. With no URL configured they
  are marked all the same, so configuring a URL later does not replay old alerts.
- :func:`deliver_due` claims due deliveries (one ``UPDATE ... RETURNING`` that pushes their next
  attempt past the request timeout, so replicas never POST the same one at once), POSTs them with
  httpx outside any transaction, records every attempt (``webhook_attempts``), and then marks the
  delivery ``delivered`` (a 2xx answer), retries it with exponential backoff, or gives up
  (``failed``) after :attr:`Settings.webhook_max_attempts`. A process killed mid-POST leaves the
  claim to run out: delivery is at least once (``X-KernelFleet-Delivery`` lets receivers dedupe).

Both run from the background loop (:mod:`kernelfleet.service.background`), never in a request.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
from sqlalchemy import exists, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.runtime_settings_file import JOB_KERNEL
from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.leasing import backoff_seconds
from kernelfleet.service.models import (
    DeliveryState,
    Regression,
    RegressionStatus,
    WebhookAttempt,
    WebhookDelivery,
)
from kernelfleet.service.regressions.attribution import describe
from kernelfleet.service.schemas import _utc
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)

BATCH = 20  # deliveries per pass
EVENT = "regression.confirmed"


def alert_text(r: Regression, link: str) -> str:
    if r.kernel == JOB_KERNEL:  # a runtime-settings series: its "times" are 1 / the gain over MLX's defaults
        return (f"KernelFleet: MLX's runtime settings for {r.shape} {r.dtype} on {r.chip} ({r.config_key}) "
                f"gain {1 / r.new_median_us:.2f}x over MLX's defaults, down from "
                f"{1 / r.baseline_median_us:.2f}x. Cause: {describe(r.cause)}. {link}")
    unconfirmed = f" ({r.confirmation})" if (r.confirmation or "").startswith("unconfirmed") else ""
    return (f"KernelFleet: {r.kernel} {r.shape} {r.dtype} on {r.chip} is {100 * r.effect:+.1f}% slower "
            f"({r.baseline_median_us:.1f} -> {r.new_median_us:.1f} us){unconfirmed}. "
            f"Cause: {describe(r.cause)}. {link}")


def payload(r: Regression, settings: Settings) -> dict[str, Any]:
    """The body of the POST: a generic JSON event (with a ``text`` line), or Slack's ``{"text": ...}``."""
    link = f"{settings.resolved_public_url}/regressions/{r.id}"
    text = alert_text(r, link)
    if settings.webhook_format == "slack":
        return {"text": text}
    return {
        "event": EVENT,
        "text": text,
        "url": link,
        "regression": {
            "id": r.id, "group_key": r.group_key, "kernel": r.kernel, "shape": r.shape, "dtype": r.dtype,
            "chip": r.chip, "config_key": r.config_key, "status": r.status.value, "detector": r.detector,
            "baseline_median_us": r.baseline_median_us, "new_median_us": r.new_median_us,
            "effect": r.effect, "p_value": r.p_value, "cause": r.cause, "cause_text": describe(r.cause),
            "baseline_result_id": r.baseline_result_id, "result_id": r.result_id,
            "confirmation": r.confirmation,
            "detected_at": _utc(r.detected_at),
        },
    }


def _unannounced() -> Any:
    return (Regression.status == RegressionStatus.open, Regression.alerted_at.is_(None))


def _due() -> Any:
    return (WebhookDelivery.state == DeliveryState.pending, WebhookDelivery.next_attempt_at <= db_now())


def enqueue_confirmed(session: Session, settings: Settings) -> int:
    """Queue the alerts of newly confirmed regressions; returns how many regressions were announced."""
    with immediate(session):
        ids = session.scalars(
            update(Regression).where(*_unannounced()).values(alerted_at=db_now())
            .returning(Regression.id).execution_options(synchronize_session=False)
        ).all()
        if ids and settings.webhook_urls:
            rows = session.scalars(select(Regression).where(Regression.id.in_(ids)).order_by(Regression.id))
            session.execute(insert(WebhookDelivery), [
                {"regression_id": r.id, "url": url, "payload": payload(r, settings),
                 "state": DeliveryState.pending, "attempts": 0}
                for r in rows for url in settings.webhook_urls
            ])
    if ids:
        logger.info("alerts: %s confirmed regression(s) announced to %s webhook(s)", len(ids),
                    len(settings.webhook_urls))
    return len(ids)


def _claim(session: Session, settings: Settings) -> list[tuple[int, str, dict[str, Any], int]]:
    hold = 2 * settings.webhook_timeout_seconds + 30  # nobody else tries it meanwhile
    with immediate(session):
        due = select(WebhookDelivery.id).where(*_due()).order_by(WebhookDelivery.next_attempt_at).limit(BATCH)
        rows = session.execute(
            update(WebhookDelivery).where(WebhookDelivery.id.in_(due.scalar_subquery()), *_due())
            .values(next_attempt_at=db_now(hold))
            .returning(WebhookDelivery.id, WebhookDelivery.url, WebhookDelivery.payload,
                       WebhookDelivery.attempts)
            .execution_options(synchronize_session=False)
        ).all()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _post(client: httpx.Client, delivery_id: int, url: str, body: dict[str, Any]) -> tuple[int | None,
                                                                                           str | None]:
    """POST once: ``(status code, error)``; success is a 2xx answer."""
    try:
        response = client.post(url, json=body, headers={
            "X-KernelFleet-Event": EVENT, "X-KernelFleet-Delivery": str(delivery_id)})
    except httpx.HTTPError as e:
        return None, f"{type(e).__name__}: {e}"[:2000]
    if response.is_success:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code}: {response.text[:500]}"


def deliver_due(factory: sessionmaker[Session], settings: Settings) -> int:
    """POST every due delivery once (up to :data:`BATCH`); returns how many were attempted."""
    with factory() as session:
        claimed = _claim(session, settings)
        if not claimed:
            return 0
        with httpx.Client(timeout=settings.webhook_timeout_seconds, follow_redirects=False,
                          headers={"User-Agent": "kernelfleet-webhook"}) as client:
            for delivery_id, url, body, attempts in claimed:
                started = time.perf_counter()
                status, error = _post(client, delivery_id, url, body)
                elapsed_ms = 1000 * (time.perf_counter() - started)
                _record(session, settings, delivery_id, attempts + 1, status, error, elapsed_ms)
    return len(claimed)


def _record(session: Session, settings: Settings, delivery_id: int, attempt: int, status: int | None,
            error: str | None, elapsed_ms: float) -> None:
    with immediate(session):
        session.execute(insert(WebhookAttempt).values(delivery_id=delivery_id, status_code=status,
                                                      error=error, duration_ms=elapsed_ms))
        if error is None:
            values: dict[str, Any] = {"state": DeliveryState.delivered, "delivered_at": db_now()}
        elif attempt >= settings.webhook_max_attempts:
            values = {"state": DeliveryState.failed}
        else:
            delay = backoff_seconds(attempt, settings.webhook_backoff_seconds,
                                    settings.webhook_backoff_max_seconds)
            values = {"next_attempt_at": db_now(delay)}
        session.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id)
                        .values(attempts=attempt, **values))
    if error is not None:
        logger.warning("webhook delivery %s attempt %s failed: %s", delivery_id, attempt, error)


def run_pending(factory: sessionmaker[Session], settings: Settings) -> int:
    """One pass: announce new confirmations, then deliver what is due. Reads first and writes only
    when there is work (one cheap query per pass otherwise)."""
    with factory() as session:
        todo = session.execute(select(exists().where(*_unannounced()), exists().where(*_due()))).one()
        session.rollback()
        if todo[0]:
            enqueue_confirmed(session, settings)
    return deliver_due(factory, settings) if any(todo) else 0
