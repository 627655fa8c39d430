"""What outlives a process: the history database (`history`: SQLAlchemy on SQLite or
PostgreSQL, Alembic migrations in `migrations/`), the arena's vote record (`votes`).

May import: the engines, media, catalog and config layers; never the domain or the views.
Checked by `make lint` (import-linter, `pyproject.toml`)."""
