"""per-kernel shape sets in campaigns

A campaign's ``spec`` JSON gains ``kernel_shapes`` (kernel -> its own shapes), so one campaign can hold
a model's calls, whose shapes differ per kernel (rope's ``heads x positions x head_dim`` beside
rmsnorm's ``rows x cols``). No table changes.

Data steps: every existing campaign was kernels x shapes, so its ``kernel_shapes`` gives each of its
kernels all of its shapes. Downgrade removes ``kernel_shapes``; ``kernels``, ``shapes`` (every shape
of the campaign) and ``dtypes`` stay, and the jobs themselves are untouched.

Revision ID: 0005_campaign_shapes
Revises: 0004_revisions_webhooks
Create Date: 2026-11-26 16:00:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005_campaign_shapes"
down_revision: str | None = "0004_revisions_webhooks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

campaigns = sa.table("campaigns", sa.column("id", sa.Integer), sa.column("spec", sa.JSON))


def _rewrite(change: Any) -> None:
    conn = op.get_bind()
    for cid, spec in conn.execute(sa.select(campaigns.c.id, campaigns.c.spec)).all():
        new = change(dict(spec or {}))
        if new != spec:
            conn.execute(campaigns.update().where(campaigns.c.id == cid).values(spec=new))


def _with_sets(spec: dict[str, Any]) -> dict[str, Any]:
    if "kernel_shapes" not in spec:
        spec["kernel_shapes"] = {k: list(spec.get("shapes", [])) for k in spec.get("kernels", [])}
    return spec


def _without_sets(spec: dict[str, Any]) -> dict[str, Any]:
    spec.pop("kernel_shapes", None)
    return spec


def upgrade() -> None:
    _rewrite(_with_sets)


def downgrade() -> None:
    _rewrite(_without_sets)
