"""Alembic's entry point for the history database (`app.storage.history.migrate` runs it to the newest
version at start). A new version: `.venv/bin/alembic -c app/storage/migrations/alembic.ini revision
--autogenerate -m "what changes"` with `APP_DATABASE_URL` pointing at a database at the current
version, then read and edit what it wrote."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from app.storage.history import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # the alembic command line
    url = os.environ.get("APP_DATABASE_URL", "sqlite:///playground.db")
    with create_engine(url).begin() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    # SQLite alters tables by copying them (batch mode); PostgreSQL alters them in place.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
