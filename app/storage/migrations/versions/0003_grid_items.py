"""Prompt-set runs (the grid) are stored as conversations of kind "grid": each turn is one item of
the set, so a turn gains the item's id and its expected answer. Existing turns get empty ones.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("item_id", sa.String(length=80), server_default="", nullable=False))
        batch_op.add_column(sa.Column("expected", sa.Text(), server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("expected")
        batch_op.drop_column("item_id")
