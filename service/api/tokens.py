"""API tokens (admin): ``POST /tokens``, ``GET /tokens``, ``POST /tokens/{id}/revoke``."""

from __future__ import annotations

from fastapi import APIRouter, status

from kernelfleet.service.deps import AdminDep, DbDep
from kernelfleet.service.models import TokenScope
from kernelfleet.service.params import RowId
from kernelfleet.service.schemas import TokenCreatedOut, TokenIn, TokenOut
from kernelfleet.service.tokens import create_token, list_tokens, revoke_token

router = APIRouter(tags=["tokens"])


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create(body: TokenIn, _: AdminDep, db: DbDep) -> TokenCreatedOut:
    """A new token of a scope: ``admin``, ``read`` (the dashboard, its JSON, /metrics and `kernelfleet
    pull`) or ``enroll`` (minting enrollment tokens). The answer is the only time the token is shown."""
    with db() as session:
        row, token = create_token(session, body.name, TokenScope(body.scope))
        return TokenCreatedOut(id=row.id, name=row.name, scope=row.scope.value, created_at=row.created_at,
                               token=token)


@router.get("/tokens")
def index(_: AdminDep, db: DbDep) -> list[TokenOut]:
    with db() as session:
        return [TokenOut.model_validate(r) for r in list_tokens(session)]


@router.post("/tokens/{token_id}/revoke")
def revoke(token_id: RowId, _: AdminDep, db: DbDep) -> TokenOut:
    with db() as session:
        return TokenOut.model_validate(revoke_token(session, token_id))
