"""Media belong to the browsers that stored them: knowing a file's content hash gives nothing;
each conversation has a version, so that two tabs saving one conversation cannot silently
overwrite each other's turns; and a vote keeps its client's address (a keyed hash), so that the
arena can limit the votes of one address as well as of one browser.

A browser owns a medium when it sent the file itself (`has_file`), or when it imported a record
naming it (then it sees only the thumbnail its import carried, never the file or another
browser's thumbnail). Existing media are owned by the browsers whose conversations link them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("votes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client", sa.String(length=64), server_default="", nullable=False))
        batch_op.create_index("ix_votes_client", ["client"])
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("version", sa.Integer(), server_default="1", nullable=False))
    op.create_table(
        "media_owners",
        sa.Column(
            "hash", sa.String(length=64), sa.ForeignKey("media.hash", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("browser_id", sa.String(length=64), nullable=False),
        sa.Column("has_file", sa.Boolean(), nullable=False),
        sa.Column("thumbnail", sa.LargeBinary(), nullable=False, server_default=sa.text("''")),
        sa.PrimaryKeyConstraint("hash", "browser_id"),
    )
    op.create_index("ix_media_owners_browser_id", "media_owners", ["browser_id"])
    # Before this revision every link came from the browser's own upload or import; both kept
    # the file shared, so the browsers that link a medium keep seeing it.
    op.execute(
        "INSERT INTO media_owners (hash, browser_id, has_file) "
        "SELECT DISTINCT media_links.hash, conversations.browser_id, true "
        "FROM media_links JOIN turns ON turns.id = media_links.turn_id "
        "JOIN conversations ON conversations.id = turns.conversation_id"
    )


def downgrade() -> None:
    with op.batch_alter_table("votes", schema=None) as batch_op:
        batch_op.drop_index("ix_votes_client")
        batch_op.drop_column("client")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_column("version")
    op.drop_index("ix_media_owners_browser_id", table_name="media_owners")
    op.drop_table("media_owners")
