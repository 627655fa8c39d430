"""Conversations that outlive the page: stored server-side as they happen, listed per browser.

A browser is known by a random id it keeps (no accounts). Each conversation (a chat or a
comparison) is saved whole after every answer: its turns, each reply's model, sampling, prompt
size and timings, and its media by content hash (a small thumbnail in the database, the file
itself in the data folder while `media_retention_days` allows). Deleting a conversation deletes
its rows and the media no other conversation holds.

SQLAlchemy over SQLite (the embedded default, WAL mode) or PostgreSQL (a database URL, for
several app processes); the schema's versions are Alembic migrations (`app/storage/migrations/`), run
to the newest at start, so an upgrade keeps old data. Everything here is synchronous: the
views call it in a worker thread once an answer has ended, never while it streams.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import logging
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    create_engine,
    delete,
    event,
    func,
    select,
    text,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from app.config import Settings, SettingsError
from app.media.loading import load_image
from app.storage.votes import Outcome, Vote, pair_of

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
THUMBNAIL_SIDE = 160
TITLE_LENGTH = 60
Kind = Literal["chat", "compare", "grid"]


class HistoryError(ValueError):
    """A user's request about their history that cannot be done, in words for the user."""


CHANGED_ELSEWHERE = (
    "This conversation was changed in another tab since you opened it, so this answer was not "
    "stored: reopen it from the history list to go on from its newest turns."
)


# --- the records: what a conversation is, as the views, the export and the import see it ---


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MediaRecord(Record):
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    # As the user sent it: display text only. It never becomes a path (files are stored and
    # copied under their hash), and it is cut to a plain base name on the way in, so a crafted
    # import that names "../../x" or "/etc/passwd" shows "x" or "passwd" and reaches nothing.
    name: str = Field(max_length=255)
    kind: Literal["image", "video"]
    description: str = Field(default="", max_length=1000)  # kind, size and pixels, as shown

    @field_validator("name", mode="before")
    @classmethod
    def _display_name(cls, name: Any) -> Any:
        return display_name(name) if isinstance(name, str) else name


class ReplyRecord(Record):
    model: str
    display_name: str = ""
    answer: str = ""
    state: str = "done"
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    load_s: float | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)


# What an answer (`app.domain.replies.Reply`) and its stored record share, copied both ways
# (`reply_record` and `stored_reply` there).
REPLY_FIELDS = (
    "display_name",
    "answer",
    "state",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "load_s",
    "ttft_s",
    "tokens_per_s",
    "sampling",
)


class TurnRecord(Record):
    text: str
    # A grid run's turn is one item of its prompt set: the item's id and expected answer.
    item_id: str = Field(default="", max_length=80)
    expected: str = ""
    media: list[MediaRecord] = Field(default_factory=list)
    replies: list[ReplyRecord] = Field(default_factory=list)
    # A chat's other versions of this exchange (the message edited, the answer regenerated),
    # each one that version's turn and the turns that followed it; this turn is the
    # `shown_at`-th of all the versions (counting from 0), the one the chat shows.
    versions: list[list[TurnRecord]] = Field(default_factory=list)
    shown_at: int = Field(default=0, ge=0)
    # The version shown before the newest was added, counted as `shown_at`: an undo of the
    # newest shows it again (`Versions.before`), after a reload as before it.
    shown_before: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _shown_among_versions(self) -> TurnRecord:
        if self.shown_at > len(self.versions):
            raise ValueError("shown_at counts past the turn's versions")
        # Never the newest version (the last): the one shown before it was added.
        if self.shown_before >= max(len(self.versions), 1):
            raise ValueError("shown_before counts past the turn's earlier versions")
        if any(not version for version in self.versions):
            raise ValueError("a version holds at least its own turn")
        return self


class ConversationRecord(Record):
    id: str = Field(pattern=r"^[0-9a-f]{32}$")
    kind: Kind = "chat"
    title: str = Field(default="", max_length=200)
    model: str = ""  # the chat's model key, or a comparison's keys joined by commas
    system_prompt: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    # How many times it was stored: a save says which version it changes (see `History.save`).
    version: int = Field(default=0, ge=0)
    turns: list[TurnRecord] = Field(default_factory=list)


class VoteRecord(Record):
    """A vote as the arena stores it."""

    battle_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    browser_id: str = Field(max_length=64)
    model_a: str
    model_b: str
    outcome: Outcome
    reason: str = Field(default="", max_length=500)
    modality: Literal["text", "image", "images", "video"]
    prompt_tokens: int = Field(default=0, ge=0)
    # The client's address as a keyed hash (`app.views.identity`), for the per-address limit.
    client: str = Field(default="", max_length=64)


class Summary(Record):
    """One line of a browser's conversation list."""

    id: str
    kind: Kind
    title: str
    model: str
    turns: int
    updated_at: float


class Export(Record):
    """A conversation as a JSON file: the record and its media's thumbnails (JPEG, base64)."""

    format: Literal["vlm-playground-conversation"] = "vlm-playground-conversation"
    # 2: turns may hold versions (edit and branch); a version 1 file reads as one without.
    version: Literal[1, 2] = 2
    conversation: ConversationRecord
    thumbnails: dict[str, str] = Field(default_factory=dict)


def every_turn(turns: Sequence[TurnRecord]) -> Iterator[TurnRecord]:
    """Every turn of `turns` and of their versions, however deep, depth-first (each turn, then its
    versions' turns, then the next turn). Without recursion: an import's versions may nest deeper
    than Python's stack before `ImportLimits` has refused them."""
    pending = list(reversed(turns))
    while pending:
        turn = pending.pop()
        yield turn
        for version in reversed(turn.versions):
            pending.extend(reversed(version))


def new_id() -> str:
    return secrets.token_hex(16)


def safe_suffix(path: Path) -> str:
    """A stored file's suffix: the user's, lowered, where it is plain letters and digits."""
    suffix = path.suffix.lower()
    return suffix if re.fullmatch(r"\.[0-9a-z]{1,15}", suffix) else ""


def display_name(name: str) -> str:
    """A file name as display text: its last part (either slash), without control characters;
    "file" when nothing is left (".", "..", an empty name)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c for c in base if c.isprintable()).strip()[:255]
    return base if base not in ("", ".", "..") else "file"


def shortened(text: str, length: int) -> str:
    """`text` on one line, cut to at most `length` characters (an ellipsis where it was cut)."""
    words = " ".join(text.split())
    return (words[: length - 1] + "…") if len(words) > length else words


def title_of(text: str) -> str:
    """A conversation's first title: its first message's first words."""
    return shortened(text, TITLE_LENGTH) or "Pictures"


# --- the tables ---


class Base(DeclarativeBase):
    pass


class ConversationRow(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    browser_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    title: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(Text)
    system_prompt: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float, index=True)
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    turns: Mapped[list[TurnRow]] = relationship(
        cascade="all, delete-orphan", order_by="TurnRow.position", passive_deletes=True
    )


class TurnRow(Base):
    __tablename__ = "turns"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    # The record's media and replies as JSON: read and written whole, never queried inside.
    media: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    replies: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    item_id: Mapped[str] = mapped_column(String(80), default="", server_default="")
    expected: Mapped[str] = mapped_column(Text, default="", server_default="")
    # The exchange's other versions (edit and branch), as `TurnRecord.versions` dumps them, and
    # this turn's place among them: read and written whole like the media and replies.
    versions: Mapped[list[list[dict[str, Any]]]] = mapped_column(JSON, default=list, server_default="[]")
    shown_at: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    shown_before: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The media of this turn and of every turn of its versions: a medium only a hidden version
    # holds is still held.
    links: Mapped[list[MediaLink]] = relationship(cascade="all, delete-orphan", passive_deletes=True)


class MediaRow(Base):
    __tablename__ = "media"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    suffix: Mapped[str] = mapped_column(String(16))
    size: Mapped[int] = mapped_column(Integer)
    thumbnail: Mapped[bytes] = mapped_column(LargeBinary)
    # When the file was last written or used; None once it is no longer kept (thumbnail only).
    stored_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class MediaOwner(Base):
    """Which browsers may see a medium. Knowing a hash gives nothing: a browser sees the file
    only if it sent the file itself (`has_file`); a browser that imported a record naming the
    hash sees the thumbnail its own import carried (`thumbnail`), never the file."""

    __tablename__ = "media_owners"

    hash: Mapped[str] = mapped_column(ForeignKey("media.hash", ondelete="CASCADE"), primary_key=True)
    browser_id: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    has_file: Mapped[bool] = mapped_column(Boolean)
    thumbnail: Mapped[bytes] = mapped_column(LargeBinary, default=b"", server_default=text("''"))


class MediaLink(Base):
    """Which turns hold which media: a medium no turn links to is deleted."""

    __tablename__ = "media_links"

    turn_id: Mapped[int] = mapped_column(ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True)
    hash: Mapped[str] = mapped_column(ForeignKey("media.hash"), primary_key=True, index=True)


class VoteRow(Base):
    """A blind battle's vote (the arena): which two models, what the user chose, about what."""

    __tablename__ = "votes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    battle_id: Mapped[str] = mapped_column(String(32), index=True)
    browser_id: Mapped[str] = mapped_column(String(64), index=True)
    model_a: Mapped[str] = mapped_column(String(200))
    model_b: Mapped[str] = mapped_column(String(200))
    outcome: Mapped[str] = mapped_column(String(8))  # a, b, tie, bad
    reason: Mapped[str] = mapped_column(Text)
    modality: Mapped[str] = mapped_column(String(16), index=True)  # text, image, images, video
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    client: Mapped[str] = mapped_column(String(64), index=True, default="", server_default="")


# --- the store ---


def sqlite_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'playground.db'}"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        # Several writers wait for each other (up to 30 s) instead of failing at once.
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            # WAL: readers never wait for the writer; foreign keys: SQLite's are off by default.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def migrate(engine: Engine) -> None:
    """Brings the database's schema to the newest version (Alembic, `app/storage/migrations/`)."""
    # Alembic announces each of its plugins at INFO when imported: noise in the app's log.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # Several app processes starting at once on one database would each run the migrations and
    # all but one fail ("table already exists"): they take turns, the later ones finding the
    # schema already new.
    with migration_turn(engine), engine.begin() as connection:
        if connection.dialect.name == "postgresql":  # held until this transaction ends
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


# Any fixed numbers: the PostgreSQL advisory locks the app's processes take to migrate, and to
# check a vote against the limits and store it in one step.
MIGRATION_LOCK_KEY = 0x766C6D70
VOTE_LOCK_KEY = 0x766C6D76


@contextmanager
def migration_turn(engine: Engine) -> Iterator[None]:
    """For a SQLite file, an exclusive lock on a file beside it while migrating (SQLite's own
    locks do not cover Alembic's check-then-create); PostgreSQL locks in the transaction."""
    database = make_url(str(engine.url)).database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def open_history(settings: Settings) -> History | None:
    """The database the settings ask for, migrated to the newest schema: None when neither the
    history (APP_HISTORY) nor the arena's votes (APP_ARENA) need one. A database that cannot be
    opened is a `SettingsError` in one line."""
    if not settings.history and not settings.arena:
        return None
    url = settings.history_url()
    try:
        return History(
            url,
            settings.history_folder() / "media",
            store_media=settings.store_media,
            retention_s=settings.media_retention_days * 86400,
            keep_conversations=settings.history,
        )
    except (SQLAlchemyError, OSError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        shown = make_url(url).render_as_string(hide_password=True) if "://" in url else url
        raise SettingsError(f"cannot open the history database {shown}: {reason}") from None


class History:
    """The conversations of every browser, in one database and one media folder."""

    def __init__(
        self,
        url: str,
        media_dir: Path,
        store_media: bool = True,
        retention_s: float = 30 * 86400,
        clock: Any = time.time,
        keep_conversations: bool = True,
    ) -> None:
        self.engine = make_engine(url)
        self.media_dir = Path(media_dir)
        self.store_media = store_media
        # Off (APP_HISTORY=0): the database holds the arena's votes only; the views store no
        # conversation and offer no history.
        self.keep_conversations = keep_conversations
        self.retention_s = retention_s
        self.clock = clock
        migrate(self.engine)
        self.media_dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine) as session, session.begin():
            yield session

    # --- media ---

    def _keep_media(
        self, session: Session, browser_id: str, medium: MediaRecord, path: Path | None, still: Path | None
    ) -> None:
        """The row of a medium a turn holds, and `browser_id`'s claim on it. With `path` (the
        browser's own file) the row's kind, size and thumbnail are made from the file, replacing
        whatever an import of the same hash had claimed, and the file is kept while media is
        stored; without one (a record, an import) the browser sees only what it already had."""
        row = session.get(MediaRow, medium.hash)
        if row is None:
            row = MediaRow(hash=medium.hash, kind=medium.kind, suffix="", size=0, thumbnail=b"")
            session.add(row)
        if path is not None:
            if not row.size:  # never made from the file: an import's word for it is not kept
                row.kind, row.suffix = medium.kind, safe_suffix(path)
                # A video is never decoded here (in the server's process): its thumbnail is made
                # from a still the isolated decoding worker made, where there is one.
                picture = path if medium.kind == "image" else still
                row.size, row.thumbnail = path.stat().st_size, thumbnail(picture) if picture else b""
            if self.store_media:
                target = self.media_path(medium.hash, row.suffix)
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    partial = target.with_name(f"{target.name}.{secrets.token_hex(4)}.part")
                    shutil.copyfile(path, partial)
                    partial.replace(target)
                row.stored_at = self.clock()
        owner = session.get(MediaOwner, (medium.hash, browser_id))
        if owner is None:
            session.add(MediaOwner(hash=medium.hash, browser_id=browser_id, has_file=path is not None))
        elif path is not None:
            owner.has_file = True

    def media_path(self, digest: str, suffix: str) -> Path:
        """Where a medium's file is kept: under the media folder by its hash, never by a name."""
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or not re.fullmatch(r"(\.[0-9a-z]{1,15})?", suffix):
            raise ValueError("not a media hash and suffix")
        return self.media_dir / digest[:2] / f"{digest}{suffix}"

    def media_file(self, browser_id: str, digest: str) -> Path | None:
        """The kept file of a medium `browser_id` sent itself, or None (not theirs, or no longer
        kept)."""
        with self.session() as session:
            row = session.get(MediaRow, digest)
            owner = session.get(MediaOwner, (digest, browser_id))
            if row is None or row.stored_at is None or owner is None or not owner.has_file:
                return None
            path = self.media_path(digest, row.suffix)
            return path if path.exists() else None

    def thumbnail(self, browser_id: str, digest: str) -> bytes | None:
        """The medium's thumbnail as `browser_id` may see it: made from its own file, or the one
        its own import carried; None for a medium that is not theirs."""
        with self.session() as session:
            row = session.get(MediaRow, digest)
            owner = session.get(MediaOwner, (digest, browser_id))
            if row is None or owner is None:
                return None
            return row.thumbnail if owner.has_file else owner.thumbnail

    def expire_media(self) -> int:
        """Deletes the media files kept longer than the retention (thumbnails stay); their count.
        The files go only once the database no longer points at them (after the commit)."""
        cutoff = self.clock() - self.retention_s
        with self.session() as session:
            rows = session.scalars(select(MediaRow).where(MediaRow.stored_at < cutoff)).all()
            expired = {row.hash: row.suffix for row in rows}
            for row in rows:
                row.stored_at = None
        self._unlink_unkept(expired)
        return len(expired)

    def _unlink_unkept(self, candidates: dict[str, str]) -> None:
        """Deletes the files of `candidates` (hash -> suffix) that the committed database no
        longer keeps: one stored again meanwhile by another request stays."""
        if not candidates:
            return
        # After the commit: a failure here leaves files for the retention sweep, and must not
        # make the store look failed (the caller would say it is the older version that stays).
        try:
            with self.session() as session:
                kept = set(
                    session.scalars(
                        select(MediaRow.hash).where(
                            MediaRow.hash.in_(candidates), MediaRow.stored_at.is_not(None)
                        )
                    )
                )
            for digest, suffix in candidates.items():
                if digest not in kept:
                    self.media_path(digest, suffix).unlink(missing_ok=True)
        except Exception:
            log.exception("deleting files no conversation keeps failed; the retention sweep retries")

    # --- conversations ---

    def save(
        self,
        browser_id: str,
        record: ConversationRecord,
        files: dict[str, Path] | None = None,
        changes: int | None = None,
        stills: dict[str, Path] | None = None,
    ) -> int:
        """Stores `record` whole for `browser_id` (its turns replace those stored before); `files`
        are the user's files by content hash (`describe_media`), kept in the same transaction.
        With `changes`, the version the caller last stored or opened (0: a new conversation):
        if another tab stored it since, nothing is stored and a `HistoryError` says so. Returns
        the version now stored. `stills`: a picture of each video (by hash) for its thumbnail."""
        files, stills = files or {}, stills or {}
        now = self.clock()
        with self.session() as session:
            row = session.get(ConversationRow, record.id, with_for_update=changes is not None)
            if row is not None and row.browser_id != browser_id:
                raise HistoryError("That conversation is not yours.")
            if changes is not None and (row.version if row is not None else 0) != changes:
                raise HistoryError(CHANGED_ELSEWHERE)
            if row is None:
                row = ConversationRow(
                    id=record.id,
                    browser_id=browser_id,
                    kind=record.kind,
                    title=record.title or title_of(record.turns[0].text if record.turns else ""),
                    created_at=record.created_at or now,
                )
                session.add(row)
            elif record.title:
                row.title = record.title
            row.model, row.system_prompt, row.updated_at = record.model, record.system_prompt, now
            row.version = (row.version or 0) + 1
            version = row.version
            held_before = {link.hash for turn in row.turns for link in turn.links}
            row.turns.clear()
            session.flush()
            for medium in {m.hash: m for t in every_turn(record.turns) for m in t.media}.values():
                self._keep_media(session, browser_id, medium, files.get(medium.hash), stills.get(medium.hash))
            for position, turn in enumerate(record.turns):
                held = dict.fromkeys(m.hash for t in every_turn([turn]) for m in t.media)
                row.turns.append(
                    TurnRow(
                        position=position,
                        text=turn.text,
                        item_id=turn.item_id,
                        expected=turn.expected,
                        media=[m.model_dump() for m in turn.media],
                        replies=[r.model_dump() for r in turn.replies],
                        versions=[[t.model_dump() for t in version] for version in turn.versions],
                        shown_at=turn.shown_at,
                        shown_before=turn.shown_before,
                        links=[MediaLink(hash=h) for h in held],
                    )
                )
            session.flush()
            unlinked = self._delete_unlinked_media(session, browser_id, held_before)
        self._unlink_unkept(unlinked)
        return version

    def list(self, browser_id: str) -> list[Summary]:
        """A browser's conversations, the latest first."""
        with self.session() as session:
            turns = (
                select(TurnRow.conversation_id, func.count().label("turns"))
                .group_by(TurnRow.conversation_id)
                .subquery()
            )
            rows = session.execute(
                select(ConversationRow, func.coalesce(turns.c.turns, 0))
                .outerjoin(turns, turns.c.conversation_id == ConversationRow.id)
                .where(ConversationRow.browser_id == browser_id)
                .order_by(ConversationRow.updated_at.desc())
            ).all()
            return [
                Summary(id=r.id, kind=r.kind, title=r.title, model=r.model, turns=n, updated_at=r.updated_at)  # type: ignore[arg-type]
                for r, n in rows
            ]

    def load(self, browser_id: str, conversation_id: str) -> ConversationRecord:
        with self.session() as session:
            row = self._own(session, browser_id, conversation_id)
            return ConversationRecord(
                id=row.id,
                kind=row.kind,  # type: ignore[arg-type]
                title=row.title,
                model=row.model,
                system_prompt=row.system_prompt,
                created_at=row.created_at,
                updated_at=row.updated_at,
                version=row.version,
                turns=[
                    TurnRecord(
                        text=t.text,
                        item_id=t.item_id,
                        expected=t.expected,
                        media=[MediaRecord.model_validate(m) for m in t.media],
                        replies=[ReplyRecord.model_validate(r) for r in t.replies],
                        versions=[[TurnRecord.model_validate(v) for v in version] for version in t.versions],
                        shown_at=t.shown_at,
                        shown_before=t.shown_before,
                    )
                    for t in row.turns
                ],
            )

    def rename(self, browser_id: str, conversation_id: str, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise HistoryError("Write a name for the conversation first.")
        with self.session() as session:
            self._own(session, browser_id, conversation_id).title = title[:200]

    def delete(self, browser_id: str, conversation_id: str) -> None:
        """Deletes the conversation's rows, and its media that no other conversation holds."""
        with self.session() as session:
            row = self._own(session, browser_id, conversation_id)
            held = {link.hash for turn in row.turns for link in turn.links}
            session.delete(row)
            session.flush()
            unlinked = self._delete_unlinked_media(session, browser_id, held)
        self._unlink_unkept(unlinked)

    def export(self, browser_id: str, conversation_id: str) -> str:
        """The conversation as JSON, with its media's thumbnails."""
        record = self.load(browser_id, conversation_id)
        thumbnails = {}
        # Hidden versions' media too; each once (an edited message often resends its pictures).
        for digest in dict.fromkeys(m.hash for t in every_turn(record.turns) for m in t.media):
            data = self.thumbnail(browser_id, digest)
            if data:
                thumbnails[digest] = base64.b64encode(data).decode()
        return Export(conversation=record, thumbnails=thumbnails).model_dump_json(indent=1)

    def import_json(self, browser_id: str, text: str | bytes) -> ConversationRecord:
        """A conversation exported here or elsewhere, stored for `browser_id` under a new id,
        within `IMPORT_LIMITS`. Its media come back as the thumbnails the file carries, never as
        files this server keeps for someone else: a hash names a picture, it does not open it."""
        if len(text) > IMPORT_LIMITS.total_bytes:
            raise HistoryError(
                f"That file is too big to import (at most {IMPORT_LIMITS.total_bytes // 2**20} MiB)."
            )
        try:
            exported = Export.model_validate_json(text)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            # An error of the JSON itself (not JSON, nested too deep for the parser) has no place.
            place = f"{where}: " if where else ""
            raise HistoryError(
                f"That file is not a conversation exported from VLM Playground ({place}{first['msg']})."
            ) from None
        IMPORT_LIMITS.check(exported)
        record = exported.conversation.model_copy(update={"id": new_id(), "created_at": 0.0, "version": 0})
        self.save(browser_id, record)
        with self.session() as session:  # the import's own thumbnails, for this browser only
            for digest, encoded in exported.thumbnails.items():
                owner = session.get(MediaOwner, (digest, browser_id))
                if owner is not None and not owner.has_file and not owner.thumbnail:
                    owner.thumbnail = IMPORT_LIMITS.thumbnail_bytes(encoded)
        return self.load(browser_id, record.id)

    # --- votes ---

    def add_votes(self, votes: Sequence[VoteRecord]) -> None:
        """Stores arena votes (one transaction for all of them)."""
        now = self.clock()
        with self.session() as session:
            session.add_all(VoteRow(**vote.model_dump(), created_at=now) for vote in votes)

    def add_vote_checked(
        self, vote: VoteRecord, since: float, check: Callable[[list[float], list[float]], None]
    ) -> None:
        """Stores `vote` if `check(its browser's vote times, its client's vote times since
        `since`)` does not raise, in one transaction that votes cast at the same moment (in this
        process or another) wait for: two votes at once cannot both slip under a limit."""
        now = self.clock()
        with self.session() as session:
            if session.bind.dialect.name == "postgresql":  # type: ignore[union-attr]
                session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": VOTE_LOCK_KEY})
            else:  # SQLite: a write first takes the database's write lock for the transaction
                session.execute(text("DELETE FROM votes WHERE 1 = 0"))
            recent = select(VoteRow.created_at).where(VoteRow.created_at > since)
            by_browser = sorted(session.scalars(recent.where(VoteRow.browser_id == vote.browser_id)))
            by_client = (
                sorted(session.scalars(recent.where(VoteRow.client == vote.client))) if vote.client else []
            )
            check(by_browser, by_client)
            session.add(VoteRow(**vote.model_dump(), created_at=now))

    def vote_times(self, browser_id: str, since: float) -> list[float]:
        """When `browser_id` voted since `since` (the arena's rate limit, shared by every app
        process on this database)."""
        query = select(VoteRow.created_at).where(VoteRow.browser_id == browser_id, VoteRow.created_at > since)
        with self.session() as session:
            return sorted(session.scalars(query))

    def pair_votes(self) -> dict[tuple[str, str], int]:
        """Votes per pair of models, whichever side each was on (the arena draws rare pairs more)."""
        query = select(VoteRow.model_a, VoteRow.model_b, func.count()).group_by(
            VoteRow.model_a, VoteRow.model_b
        )
        counts: dict[tuple[str, str], int] = {}
        with self.session() as session:
            for a, b, count in session.execute(query):
                pair = pair_of(a, b)
                counts[pair] = counts.get(pair, 0) + count
        return counts

    def votes(self, modality: str | None = None) -> list[Vote]:
        """Every vote (of one modality, if given), for the leaderboard."""
        query = select(VoteRow.model_a, VoteRow.model_b, VoteRow.outcome)
        if modality is not None:
            query = query.where(VoteRow.modality == modality)
        with self.session() as session:
            return [Vote(a, b, outcome) for a, b, outcome in session.execute(query)]

    def _own(self, session: Session, browser_id: str, conversation_id: str) -> ConversationRow:
        row = session.get(ConversationRow, conversation_id)
        if row is None or row.browser_id != browser_id:
            raise HistoryError("That conversation is no longer stored (deleted, maybe in another tab).")
        return row

    def _delete_unlinked_media(
        self, session: Session, browser_id: str, candidates: set[str]
    ) -> dict[str, str]:
        """Forgets those of `candidates` (media a deleted or rewritten conversation held) that no
        turn holds now, and `browser_id`'s claim on those none of its turns hold. Only those: a
        medium being saved by another request is left alone. Returns the forgotten media (hash
        -> suffix), whose files the caller deletes once this is committed."""
        if not candidates:
            return {}
        linked = select(MediaLink.hash).where(MediaLink.hash.in_(candidates))
        gone = session.scalars(
            select(MediaRow).where(MediaRow.hash.in_(candidates), MediaRow.hash.not_in(linked))
        ).all()
        theirs = (
            select(MediaLink.hash)
            .join(TurnRow, TurnRow.id == MediaLink.turn_id)
            .join(ConversationRow, ConversationRow.id == TurnRow.conversation_id)
            .where(ConversationRow.browser_id == browser_id, MediaLink.hash.in_(candidates))
        )
        session.execute(
            delete(MediaOwner).where(
                MediaOwner.browser_id == browser_id,
                MediaOwner.hash.in_(candidates),
                MediaOwner.hash.not_in(theirs),
            )
        )
        forgotten = {row.hash: row.suffix for row in gone}
        if forgotten:
            session.execute(delete(MediaOwner).where(MediaOwner.hash.in_(forgotten)))
        for row in gone:
            session.delete(row)
        return forgotten


@dataclass(frozen=True)
class ImportLimits:
    """What a history import may hold: a file made by an export here fits with room to spare
    (a long chat is a few hundred turns; a thumbnail is a 160-pixel JPEG of a few KB)."""

    total_bytes: int = 16 * 2**20
    turns: int = 1000
    media_per_turn: int = 64
    replies_per_turn: int = 16
    field_chars: int = 200_000  # a message, an answer, a system prompt
    thumbnails: int = 2000
    thumbnail_bytes_each: int = 64 * 1024
    # Versions within versions (an edit in a branch made by an edit): a chat reaches a few.
    version_depth: int = 64

    def check(self, exported: Export) -> None:
        """Refuses, in one line, an import past these limits. The turns of hidden versions count
        as turns: the limit on turns is on all of them together."""
        record = exported.conversation
        turns = list(every_turn(record.turns))
        problems = [
            (
                self._version_depth(record.turns) > self.version_depth,
                f"at most {self.version_depth} levels of versions within versions",
            ),
            (len(turns) > self.turns, f"at most {self.turns} turns, their versions included"),
            (len(exported.thumbnails) > self.thumbnails, f"at most {self.thumbnails} thumbnails"),
            (
                any(len(t.media) > self.media_per_turn for t in turns),
                f"at most {self.media_per_turn} files in a turn",
            ),
            (
                any(len(t.replies) > self.replies_per_turn for t in turns),
                f"at most {self.replies_per_turn} answers in a turn",
            ),
            (
                max([len(record.system_prompt), *(self._longest(t) for t in turns)]) > self.field_chars,
                f"at most {self.field_chars:,} characters in a message or an answer",
            ),
            (
                any(len(v) > self.thumbnail_bytes_each * 4 // 3 + 4 for v in exported.thumbnails.values()),
                f"thumbnails of at most {self.thumbnail_bytes_each // 1024} KB",
            ),
        ]
        for broken, limit in problems:
            if broken:
                raise HistoryError(f"That file cannot be imported: an import holds {limit}.")

    @staticmethod
    def _version_depth(turns: Sequence[TurnRecord]) -> int:
        """How deep versions nest in `turns`: 0 without versions, 1 when no version's turn holds
        versions of its own, and so on. Without recursion, like `every_turn`."""
        deepest, pending = 0, [(turn, 0) for turn in turns]
        while pending:
            turn, depth = pending.pop()
            if turn.versions:
                deepest = max(deepest, depth + 1)
                pending.extend((t, depth + 1) for version in turn.versions for t in version)
        return deepest

    @staticmethod
    def _longest(turn: TurnRecord) -> int:
        return max([len(turn.text), len(turn.expected), *(len(r.answer) for r in turn.replies)])

    def thumbnail_bytes(self, encoded: str) -> bytes:
        """An imported thumbnail's bytes if they are a JPEG of the allowed size, else none (it is
        only ever shown to the browser that imported it, and never decoded here)."""
        try:
            data = base64.b64decode(encoded, validate=True)
        except ValueError:
            return b""
        return data if data.startswith(b"\xff\xd8\xff") and len(data) <= self.thumbnail_bytes_each else b""


IMPORT_LIMITS = ImportLimits()


def describe_media(
    path: Path, name: str, kind: Literal["image", "video"], description: str, digest: str | None = None
) -> MediaRecord:
    """A user's file as a turn records it: by content hash (`digest`, where the caller already
    has it), under the name the user gave it."""
    return MediaRecord(
        hash=digest or hash_file(path), name=Path(name).name[:255], kind=kind, description=description
    )


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def thumbnail(path: Path) -> bytes:
    """A small JPEG of a picture (empty if it cannot be read). Only pictures, and only what the
    chat would take (`load_image`: its formats, its pixel limit, upright): Pillow's own bomb limit
    lets a picture of 170 megapixels through; videos go to the isolated decoding worker."""
    try:
        image = load_image(path)
        image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=80)
        return buffer.getvalue()
    except Exception:  # a thumbnail is a nicety: the record is kept without one
        log.warning("no thumbnail for a picture")
        return b""
