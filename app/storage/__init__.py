"""What outlives a process: history, votes and media in a database (Alembic migrations)."""
