"""which config a trial's measurement was made for

``trials.shares_measurement_with``: the config key whose measurement stands for this trial, when a
worker found the two kernels identical on its backend (same rendered source, template arguments and
launch geometry: the Metal ``hint`` axis renders one source) and measured them once
(``worker/measure.py``). Null for a trial measured itself, and for every report stored before.

Revision ID: 0010_trial_shared_measurement
Revises: 0009_regression_confirmation
Create Date: 2026-11-28 08:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_trial_shared_measurement"
down_revision: str | None = "0009_regression_confirmation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("shares_measurement_with", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("shares_measurement_with")
