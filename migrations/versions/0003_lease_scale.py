"""leasing at fleet scale

- ``job_targets``: the distinct (backend, chip glob) pairs jobs are created for; ``jobs.target_id``
  points at one, and the partial index ``ix_jobs_queued_target (target_id, available_at, id) WHERE
  state = 'queued'`` lets the lease pick per target in O(log n) (no scan over queued jobs).
- ``jobs.lease_confirmed``: a fresh lease is unconfirmed until the worker's first heartbeat.
- Lease tokens at rest become SHA-256 digests (``jobs.lease_token``, ``results.lease_token``), like
  worker tokens. Workers keep their clear tokens, so leases held during the upgrade stay valid.

Data steps: one target per distinct (target_backend, target_chip) of existing jobs; leases held now
count as confirmed; every stored lease token is replaced by its digest. Downgrade drops the new
table and columns; stored digests stay digests (leases held across a downgrade then get 409).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 13:05:00
"""

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = sa.text("state = 'queued'")
BACKEND = sa.Enum("metal", "cuda", "cpu", name="backend", native_enum=False, length=24)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def upgrade() -> None:
    op.create_table(
        "job_targets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=320), nullable=False),
        sa.Column("target_backend", BACKEND, nullable=True),
        sa.Column("target_chip", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("(CURRENT_TIMESTAMP)"),
                  nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_targets")),
        sa.UniqueConstraint("key", name=op.f("uq_job_targets_key")),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("target_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("lease_confirmed", sa.Boolean(), server_default=sa.text("false"),
                                   nullable=False))

    conn = op.get_bind()
    jobs = sa.table("jobs", sa.column("id"), sa.column("target_backend"), sa.column("target_chip"),
                    sa.column("target_id"), sa.column("state"), sa.column("lease_token"),
                    sa.column("lease_confirmed"))
    targets = sa.table("job_targets", sa.column("id"), sa.column("key"), sa.column("target_backend"),
                       sa.column("target_chip"))
    results = sa.table("results", sa.column("id"), sa.column("lease_token"))
    pairs = conn.execute(sa.select(jobs.c.target_backend, jobs.c.target_chip).distinct()).all()
    for backend, chip in pairs:
        key = json.dumps([backend, chip], separators=(",", ":"))
        target = conn.execute(sa.insert(targets).values(key=key, target_backend=backend, target_chip=chip)
                              .returning(targets.c.id)).scalar_one()
        conn.execute(sa.update(jobs).where(jobs.c.target_backend.is_(None) if backend is None
                                           else jobs.c.target_backend == backend,
                                           jobs.c.target_chip.is_(None) if chip is None
                                           else jobs.c.target_chip == chip)
                     .values(target_id=target))
    conn.execute(sa.update(jobs).where(jobs.c.state == "leased").values(lease_confirmed=True))
    for table in (jobs, results):
        rows = conn.execute(sa.select(table.c.id, table.c.lease_token)
                            .where(table.c.lease_token.is_not(None))).all()
        for row_id, token in rows:
            conn.execute(sa.update(table).where(table.c.id == row_id).values(lease_token=_digest(token)))

    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("target_id", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(op.f("fk_jobs_target_id_job_targets"), "job_targets", ["target_id"], ["id"])
        batch.create_index("ix_jobs_queued_target", ["target_id", "available_at", "id"], unique=False,
                           postgresql_where=QUEUED, sqlite_where=QUEUED)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_queued_target")
        batch.drop_constraint(op.f("fk_jobs_target_id_job_targets"), type_="foreignkey")
        batch.drop_column("lease_confirmed")
        batch.drop_column("target_id")
    op.drop_table("job_targets")
