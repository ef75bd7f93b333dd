"""scoped API tokens

``api_tokens``: named bearer tokens with a scope (``admin``, ``read``: the dashboard and `kernelfleet
pull`, ``enroll``: mint enrollment tokens), stored only as their SHA-256 digest, revocable. The
settings' ``KERNELFLEET_ADMIN_TOKEN`` stays the bootstrap admin token.

Revision ID: 0007_api_tokens
Revises: 0006_regression_scans
Create Date: 2026-11-28 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_api_tokens"
down_revision: str | None = "0006_regression_scans"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
NOW = sa.text("(CURRENT_TIMESTAMP)")


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.Enum("admin", "read", "enroll", name="tokenscope", native_enum=False,
                                   length=24), nullable=False),
        sa.Column("token_digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", TZ, server_default=NOW, nullable=False),
        sa.Column("revoked_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_digest", name=op.f("uq_api_tokens_token_digest")),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
