"""Edit and branch, after a reload: which version a chat showed before its newest was added, so
that undoing the newest shows that one again, as it did before the reload (`Versions.before`).
Existing turns showed the first: 0.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A column added in place, as in 0005 (the media links that point at the rows stay).
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shown_before", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    # In place too (SQLite 3.35+ drops a column itself): a copy of the table would be dropped
    # with foreign keys on, and the drop would cascade through the media links.
    with op.batch_alter_table("turns", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("shown_before")
