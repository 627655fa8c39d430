"""The history database's first version: conversations, their turns, and media by content hash.

Revision ID: 0001
Revises: none (the first version)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("browser_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_conversations_browser_id"), ["browser_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_conversations_updated_at"), ["updated_at"], unique=False)

    op.create_table(
        "media",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("suffix", sa.String(length=16), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("thumbnail", sa.LargeBinary(), nullable=False),
        sa.Column("stored_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("hash"),
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=32), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("media", sa.JSON(), nullable=False),
        sa.Column("replies", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_turns_conversation_id"), ["conversation_id"], unique=False)

    op.create_table(
        "media_links",
        sa.Column("turn_id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["hash"],
            ["media.hash"],
        ),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("turn_id", "hash"),
    )
    with op.batch_alter_table("media_links", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_media_links_hash"), ["hash"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("media_links", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_media_links_hash"))

    op.drop_table("media_links")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_turns_conversation_id"))

    op.drop_table("turns")
    op.drop_table("media")
    with op.batch_alter_table("conversations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_conversations_updated_at"))
        batch_op.drop_index(batch_op.f("ix_conversations_browser_id"))

    op.drop_table("conversations")
