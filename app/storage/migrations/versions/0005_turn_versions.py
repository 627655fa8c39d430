"""Edit and branch: a chat's earlier message can be edited and sent again, and the chat goes on
from there as a new branch while the earlier branches stay reachable. A turn keeps its exchange's
other versions (each that version's turn and the turns that followed it, as JSON like its media
and replies: read and written whole, never queried inside) and where the shown one stands among
them. Existing turns have no other versions, and are the only one: `[]` and 0.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Adding columns only: SQLite adds them in place (no copy of the table, so the media links
    # that point at its rows are left as they are).
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("versions", sa.JSON(), server_default="[]", nullable=False))
        batch_op.add_column(sa.Column("shown_at", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    # In place too (SQLite 3.35+ drops a column itself): a copy of the table would be dropped
    # with foreign keys on, and the drop would cascade through the media links.
    with op.batch_alter_table("turns", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("shown_at")
        batch_op.drop_column("versions")
