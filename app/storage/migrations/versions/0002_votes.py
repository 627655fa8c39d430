"""The arena's votes, for the leaderboard (a new table: the data of version 0001 is kept).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "votes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("battle_id", sa.String(length=32), nullable=False),
        sa.Column("browser_id", sa.String(length=64), nullable=False),
        sa.Column("model_a", sa.String(length=200), nullable=False),
        sa.Column("model_b", sa.String(length=200), nullable=False),
        sa.Column("outcome", sa.String(length=8), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("modality", sa.String(length=16), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("votes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_votes_battle_id"), ["battle_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_votes_browser_id"), ["browser_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_votes_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_votes_modality"), ["modality"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("votes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_votes_modality"))
        batch_op.drop_index(batch_op.f("ix_votes_created_at"))
        batch_op.drop_index(batch_op.f("ix_votes_browser_id"))
        batch_op.drop_index(batch_op.f("ix_votes_battle_id"))

    op.drop_table("votes")
