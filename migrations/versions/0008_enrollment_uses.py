"""enrollment tokens for several workers

``enrollment_tokens.max_uses`` (default 1) and ``uses``: a token minted for a multi-GPU host
(``kernelfleet admin add-worker --gpus N``, one agent per GPU) enrolls up to ``max_uses`` workers;
``used_at`` is set when the last use is taken. Tokens stored before count as single-use, used once
when ``used_at`` is set.

Revision ID: 0008_enrollment_uses
Revises: 0007_api_tokens
Create Date: 2026-11-28 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_enrollment_uses"
down_revision: str | None = "0007_api_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.add_column(sa.Column("max_uses", sa.Integer(), server_default=sa.text("1"), nullable=False))
        batch.add_column(sa.Column("uses", sa.Integer(), server_default=sa.text("0"), nullable=False))
    tokens = sa.table("enrollment_tokens", sa.column("used_at"), sa.column("uses", sa.Integer))
    op.execute(tokens.update().where(tokens.c.used_at.is_not(None)).values(uses=1))


def downgrade() -> None:
    with op.batch_alter_table("enrollment_tokens") as batch:
        batch.drop_column("uses")
        batch.drop_column("max_uses")
