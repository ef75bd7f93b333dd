"""Scoped API tokens: created (shown once), listed and revoked by an admin; stored only as SHA-256
digests (:mod:`kernelfleet.service.auth` checks them)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelfleet.service.auth import SCOPE_PREFIX, digest, new_token, revoke
from kernelfleet.service.db import immediate
from kernelfleet.service.models import ApiToken, TokenScope


def create_token(session: Session, name: str, scope: TokenScope) -> tuple[ApiToken, str]:
    """A new token of ``scope``; returns its row and the token (the only time it is known)."""
    token = new_token(SCOPE_PREFIX[scope])
    with immediate(session):
        row = ApiToken(name=name, scope=scope, token_digest=digest(token))
        session.add(row)
        session.flush()
        session.refresh(row)
    return row, token


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int) -> ApiToken:
    return revoke(session, ApiToken, token_id,
                  f"token {token_id} does not exist; list them with `kernelfleet admin tokens list`")
