"""runtime settings pushed by workers

``runtime_settings``: MLX's runtime settings (command-buffer / CUDA-graph size, eval width) a worker
chose for its chip with ``kernelfleet settings tune`` and pushed with ``kernelfleet settings push``,
one row per (chip, MLX version, model shape, dtype, workload), the newest push replacing the row;
``kernelfleet pull`` writes them beside the chip's profile.

Revision ID: 0011_runtime_settings
Revises: 0010_trial_shared_measurement
Create Date: 2026-11-28 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_runtime_settings"
down_revision: str | None = "0010_trial_shared_measurement"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runtime_settings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("chip", sa.String(length=128), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=64), nullable=True),
        sa.Column("mlx_version", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("workload", sa.String(length=32), nullable=False),
        sa.Column("entry", sa.JSON(), nullable=False),
        sa.Column("worker_id", sa.Integer(), sa.ForeignKey("workers.id", ondelete="SET NULL"), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("chip", "mlx_version", "model", "dtype", "workload", name="uq_runtime_settings_key"),
    )
    op.create_index("ix_runtime_settings_chip", "runtime_settings", ["chip"])


def downgrade() -> None:
    op.drop_index("ix_runtime_settings_chip", table_name="runtime_settings")
    op.drop_table("runtime_settings")
