"""Conversations that outlive the page: stored server-side as they happen, listed per browser.

A browser is known by a random id it keeps (no accounts). Each conversation (a chat or a
comparison) is saved whole after every answer: its turns, each reply's model, sampling, prompt
size and timings, and its media by content hash (a small thumbnail in the database, the file
itself in the data folder while `media_retention_days` allows). Deleting a conversation deletes
its rows and the media no other conversation holds.

SQLAlchemy over SQLite (the embedded default, WAL mode) or PostgreSQL (a database URL, for
several app processes); the schema's versions are Alembic migrations (`app/migrations/`), run
to the newest at start, so an upgrade keeps old data. Everything here is synchronous: the
views call it in a worker thread once an answer has ended, never while it streams.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from app.config import Settings, SettingsError
from app.leaderboard import Outcome, Vote, pair_of
from app.replies import Reply

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
THUMBNAIL_SIDE = 160
TITLE_LENGTH = 60
Kind = Literal["chat", "compare", "grid"]


class HistoryError(ValueError):
    """A user's request about their history that cannot be done, in words for the user."""


# --- the records: what a conversation is, as the views, the export and the import see it ---


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MediaRecord(Record):
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    name: str = Field(max_length=255)  # as the user sent it, never a server path
    kind: Literal["image", "video"]
    description: str = ""  # kind, size and pixels, as the answer's label shows them


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


# What an answer (`app.replies.Reply`) and its stored record share, copied both ways.
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


def reply_record(reply: Reply, **changes: Any) -> ReplyRecord:
    """An answer as the history stores it (`changes` replace some of its fields)."""
    return ReplyRecord(model=reply.key, **{name: getattr(reply, name) for name in REPLY_FIELDS} | changes)


def stored_reply(stored: ReplyRecord, source: str, **details: Any) -> Reply:
    """A stored answer back in the views' shape; `source` is where its model comes from, as
    users are told, and `details` set the fields the record does not keep (or replace some)."""
    fields = {name: getattr(stored, name) for name in REPLY_FIELDS}
    fields["display_name"] = stored.display_name or stored.model
    return Reply(key=stored.model, source=source, **fields | details)


class TurnRecord(Record):
    text: str
    # A grid run's turn is one item of its prompt set: the item's id and expected answer.
    item_id: str = Field(default="", max_length=80)
    expected: str = ""
    media: list[MediaRecord] = Field(default_factory=list)
    replies: list[ReplyRecord] = Field(default_factory=list)


class ConversationRecord(Record):
    id: str = Field(pattern=r"^[0-9a-f]{32}$")
    kind: Kind = "chat"
    title: str = Field(default="", max_length=200)
    model: str = ""  # the chat's model key, or a comparison's keys joined by commas
    system_prompt: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
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
    version: Literal[1] = 1
    conversation: ConversationRecord
    thumbnails: dict[str, str] = Field(default_factory=dict)


def new_id() -> str:
    return secrets.token_hex(16)


def title_of(text: str) -> str:
    """A conversation's first title: its first message's first words."""
    words = " ".join(text.split())
    return (words[: TITLE_LENGTH - 1] + "…") if len(words) > TITLE_LENGTH else words or "Pictures"


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
    """Brings the database's schema to the newest version (Alembic, `app/migrations/`)."""
    # Alembic announces each of its plugins at INFO when imported: noise in the app's log.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


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

    def _keep_media(self, session: Session, medium: MediaRecord, path: Path | None) -> None:
        """The row of a medium a turn holds (its thumbnail made from `path`, the user's file),
        and its file while media is stored; the same file sent twice is kept once."""
        row = session.get(MediaRow, medium.hash)
        if row is None:
            suffix = path.suffix.lower() if path else ""
            size = path.stat().st_size if path else 0
            image = thumbnail(path, medium.kind) if path else b""
            row = MediaRow(hash=medium.hash, kind=medium.kind, suffix=suffix, size=size, thumbnail=image)
            session.add(row)
        if self.store_media and path is not None:
            target = self.media_path(medium.hash, row.suffix)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(target.name + ".part")
                shutil.copyfile(path, partial)
                partial.replace(target)
            row.stored_at = self.clock()

    def media_path(self, digest: str, suffix: str) -> Path:
        return self.media_dir / digest[:2] / f"{digest}{suffix.lower()}"

    def media_file(self, digest: str) -> Path | None:
        """The kept file of a medium, or None where it is no longer kept."""
        with self.session() as session:
            row = session.get(MediaRow, digest)
            if row is None or row.stored_at is None:
                return None
            path = self.media_path(digest, row.suffix)
            return path if path.exists() else None

    def thumbnail(self, digest: str) -> bytes | None:
        with self.session() as session:
            row = session.get(MediaRow, digest)
            return row.thumbnail if row is not None else None

    def expire_media(self) -> int:
        """Deletes the media files kept longer than the retention (thumbnails stay); their count."""
        cutoff = self.clock() - self.retention_s
        with self.session() as session:
            rows = session.scalars(select(MediaRow).where(MediaRow.stored_at < cutoff)).all()
            for row in rows:
                self.media_path(row.hash, row.suffix).unlink(missing_ok=True)
                row.stored_at = None
            return len(rows)

    # --- conversations ---

    def save(self, browser_id: str, record: ConversationRecord, files: dict[str, Path] | None = None) -> None:
        """Stores `record` whole for `browser_id` (its turns replace those stored before); `files`
        are the user's files by content hash (`describe_media`), kept in the same transaction."""
        files = files or {}
        now = self.clock()
        with self.session() as session:
            row = session.get(ConversationRow, record.id)
            if row is not None and row.browser_id != browser_id:
                raise HistoryError("That conversation is not yours.")
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
            held_before = {link.hash for turn in row.turns for link in turn.links}
            row.turns.clear()
            session.flush()
            for medium in {m.hash: m for t in record.turns for m in t.media}.values():
                self._keep_media(session, medium, files.get(medium.hash))
            for position, turn in enumerate(record.turns):
                row.turns.append(
                    TurnRow(
                        position=position,
                        text=turn.text,
                        item_id=turn.item_id,
                        expected=turn.expected,
                        media=[m.model_dump() for m in turn.media],
                        replies=[r.model_dump() for r in turn.replies],
                        links=[MediaLink(hash=h) for h in dict.fromkeys(m.hash for m in turn.media)],
                    )
                )
            session.flush()
            self._delete_unlinked_media(session, held_before)

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
                turns=[
                    TurnRecord(
                        text=t.text,
                        item_id=t.item_id,
                        expected=t.expected,
                        media=[MediaRecord.model_validate(m) for m in t.media],
                        replies=[ReplyRecord.model_validate(r) for r in t.replies],
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
            self._delete_unlinked_media(session, held)

    def export(self, browser_id: str, conversation_id: str) -> str:
        """The conversation as JSON, with its media's thumbnails."""
        record = self.load(browser_id, conversation_id)
        thumbnails = {}
        for medium in (m for t in record.turns for m in t.media):
            data = self.thumbnail(medium.hash)
            if data is not None:
                thumbnails[medium.hash] = base64.b64encode(data).decode()
        return Export(conversation=record, thumbnails=thumbnails).model_dump_json(indent=1)

    def import_json(self, browser_id: str, text: str | bytes) -> ConversationRecord:
        """A conversation exported here or elsewhere, stored for `browser_id` under a new id.
        Media whose files this server does not keep come back as thumbnails only."""
        try:
            exported = Export.model_validate_json(text)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise HistoryError(
                f"That file is not a conversation exported from VLM Playground ({where}: {first['msg']})."
            ) from None
        record = exported.conversation.model_copy(update={"id": new_id(), "created_at": 0.0})
        self.save(browser_id, record)
        with self.session() as session:  # thumbnails for media this server had not seen
            for digest, encoded in exported.thumbnails.items():
                row = session.get(MediaRow, digest)
                if row is not None and not row.thumbnail:
                    with contextlib.suppress(ValueError):
                        row.thumbnail = base64.b64decode(encoded, validate=True)
        return self.load(browser_id, record.id)

    # --- votes ---

    def add_votes(self, votes: Sequence[VoteRecord]) -> None:
        """Stores arena votes (one transaction for all of them)."""
        now = self.clock()
        with self.session() as session:
            session.add_all(VoteRow(**vote.model_dump(), created_at=now) for vote in votes)

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

    def _delete_unlinked_media(self, session: Session, candidates: set[str]) -> None:
        """Deletes those of `candidates` (media a deleted or rewritten conversation held) that no
        turn holds now. Only those: a medium being saved by another request is left alone."""
        if not candidates:
            return
        linked = select(MediaLink.hash).where(MediaLink.hash.in_(candidates))
        gone = session.scalars(
            select(MediaRow).where(MediaRow.hash.in_(candidates), MediaRow.hash.not_in(linked))
        ).all()
        for row in gone:
            self.media_path(row.hash, row.suffix).unlink(missing_ok=True)
            session.delete(row)


def describe_media(path: Path, name: str, kind: Literal["image", "video"], description: str) -> MediaRecord:
    """A user's file as a turn records it: by content hash, under the name the user gave it."""
    return MediaRecord(hash=hash_file(path), name=Path(name).name[:255], kind=kind, description=description)


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def thumbnail(path: Path, kind: str) -> bytes:
    """A small JPEG of an image, or of a video's first frame (empty if it cannot be read)."""
    try:
        if kind == "video":
            import av

            with av.open(str(path)) as container:
                image = next(container.decode(video=0)).to_image()
        else:
            with Image.open(path) as opened:
                from PIL import ImageOps

                image = ImageOps.exif_transpose(opened).convert("RGB")
        image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, "JPEG", quality=80)
        return buffer.getvalue()
    except Exception:  # a thumbnail is a nicety: the record is kept without one
        log.warning("no thumbnail for a %s", kind)
        return b""
