"""Prompt sets: a team's own questions with their images and clips, read from a JSONL or CSV
file, checked up front against the media pipeline and each chosen model's limits.

JSONL, one item a line:

    {"id": "q1", "question": "What shape is it?", "media": ["one_shape.png"], "expected": "triangle"}

CSV, with a header: `question` (required), `media` (file names separated by `;`), `id` and
`expected` (optional). `media` may also be one name as a string. `expected`, where given, is
shown beside the answers and marks those that contain it.

The files are found by name in the set's media: a folder (by default the set file's own), or a
zip, extracted here with its paths checked (nothing outside the folder, no links, a size cap).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.catalog.cards import ModelCard, validation_problems
from app.domain.conversation import (
    SESSION_FOLDER_PREFIX,
    ConversationError,
    Turn,
    check_fits,
    check_media,
    engine_messages,
    is_video,
)
from app.media.loading import MediaError, VideoDecoderPool, load_image

MAX_ITEMS = 500
MAX_QUESTION_CHARS = 8000
# What a zip of a set's files may hold: far more than a set of 500 items asks about, far less than a
# "zip bomb" (a few hundred KB that unpack to gigabytes, or thousands of entries). Pictures and
# clips barely compress, so a high ratio is a bomb, not a set.
MAX_ZIP_BYTES = 1 * 2**30  # unpacked, all entries
MAX_ZIP_ENTRIES = 2000
# Unpacked size to packed size, for an entry over 1 MiB unpacked and for the whole zip past 1 MiB
# (entries of 1 MiB each, under the first rule, made a 1 MB zip of 0.93 GB).
MAX_ZIP_RATIO = 100
RATIO_FROM_BYTES = 2**20
# The built-in sets sit with the example files they ask about.
EXAMPLE_SETS = Path(__file__).resolve().parents[2] / "static" / "examples"


class PromptSetError(ValueError):
    """A set that cannot be read at all; the text says what to change."""


class PromptItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(default="", max_length=80)
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    media: list[str] = Field(default_factory=list, max_length=16)
    expected: str = Field(default="", max_length=500)

    @field_validator("media", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(";") if name.strip()]
        return value


@dataclass
class PromptSet:
    name: str
    items: list[PromptItem]
    folder: Path  # where the items' files are
    # A folder this set unpacked (a zip), deleted by `close`.
    unpacked: Path | None = None

    # Where a reopened run keeps each file (its name -> a path under its hash); None: by name.
    files: dict[str, Path] | None = None

    def path(self, name: str) -> Path:
        """The file an item names: never outside the set's folder, whatever the name says."""
        if self.files is not None:
            return self.files.get(name, self.folder / ".missing")
        return self.folder / ".missing" if self.outside(name) else Path(os.path.normpath(self.folder / name))

    def outside(self, name: str) -> bool:
        """Whether a name points out of the set's folder. Lexical, so that a user's own folder
        of links still works from the command line; uploaded zips never unpack links."""
        if self.files is not None:
            return False  # a reopened run's files are looked up by name, never joined
        path = Path(os.path.normpath(self.folder / name))
        return not path.is_relative_to(os.path.normpath(self.folder))

    def close(self) -> None:
        if self.unpacked is not None:
            shutil.rmtree(self.unpacked, ignore_errors=True)


def read_set(set_file: Path, media: Path | None = None, name: str | None = None) -> PromptSet:
    """The set in `set_file` (.jsonl or .csv) with its files in `media` (a folder or a .zip;
    by default the set file's folder). Raises `PromptSetError` with the line at fault."""
    set_file = Path(set_file)
    if not set_file.is_file():
        raise PromptSetError(f"{set_file.name}: no such file.")
    try:
        text = set_file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        raise PromptSetError(f"{set_file.name} could not be read as UTF-8 text.") from None
    suffix = set_file.suffix.lower()
    if suffix == ".jsonl":
        rows = _jsonl_rows(text, set_file.name)
    elif suffix == ".csv":
        rows = _csv_rows(text, set_file.name)
    else:
        raise PromptSetError(f"{set_file.name}: a prompt set is a .jsonl or a .csv file.")
    items = []
    for line, row in rows:
        try:
            item = PromptItem.model_validate(row)
        except ValidationError as error:
            problem = validation_problems(error, "item")
            raise PromptSetError(f"{set_file.name}, line {line}: {problem}") from None
        items.append(item if item.id else item.model_copy(update={"id": f"item-{len(items) + 1}"}))
    if not items:
        raise PromptSetError(f"{set_file.name} has no items: write one question a line.")
    if len(items) > MAX_ITEMS:
        raise PromptSetError(f"{set_file.name} has {len(items)} items; the most a set takes is {MAX_ITEMS}.")
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise PromptSetError(f"{set_file.name}: item ids must differ; repeated: {', '.join(twice)}.")
    unpacked = None
    if media is None:
        folder = set_file.parent
    elif Path(media).suffix.lower() == ".zip":
        folder = unpacked = unzip(Path(media))
    else:
        folder = Path(media)
    return PromptSet(name or set_file.stem, items, folder, unpacked)


def _jsonl_rows(text: str, name: str) -> list[tuple[int, object]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise PromptSetError(f"{name}, line {number}: not JSON ({error.msg}).") from None
    return rows


def _csv_rows(text: str, name: str) -> list[tuple[int, object]]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or "question" not in reader.fieldnames:
        raise PromptSetError(f"{name}: the first line must name the columns, `question` among them.")
    return [
        (number, {k: v for k, v in row.items() if k is not None and v not in (None, "")})
        for number, row in enumerate(reader, 2)
    ]


def unzip(archive: Path) -> Path:
    """The zip's files in a new folder; refuses paths that leave it, links and oversize."""
    # A session folder: if its owner (a tab's grid, the command line) dies without deleting it,
    # the app's sweeper does once it is old (app.domain.sessions).
    target = Path(tempfile.mkdtemp(prefix=SESSION_FOLDER_PREFIX))
    try:
        with zipfile.ZipFile(archive) as opened:
            entries = opened.infolist()
            check_zip(archive.name, entries)
            unpacked = 0
            for entry in entries:
                path = PurePosixPath(entry.filename)
                if path.is_absolute() or ".." in path.parts or (entry.external_attr >> 28) == 0o12:
                    raise PromptSetError(f"{archive.name} holds {entry.filename!r}, a path outside the set.")
                if not entry.is_dir():
                    unpacked += extract(opened, entry, target / path, MAX_ZIP_BYTES - unpacked, archive.name)
    except zipfile.BadZipFile:
        shutil.rmtree(target, ignore_errors=True)
        raise PromptSetError(f"{archive.name} is not a zip file the app can read.") from None
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    # A zip of one folder: its files are found by name as if zipped flat.
    inner = [p for p in target.iterdir() if not p.name.startswith("__MACOSX")]
    return inner[0] if len(inner) == 1 and inner[0].is_dir() else target


def check_zip(name: str, entries: list[zipfile.ZipInfo]) -> None:
    """Refuses, from the zip's own directory and before anything is unpacked, a zip past the
    bounds above."""
    if len(entries) > MAX_ZIP_ENTRIES:
        raise PromptSetError(
            f"{name} holds {len(entries):,} files; a set's zip takes at most {MAX_ZIP_ENTRIES:,}."
        )
    if sum(entry.file_size for entry in entries) > MAX_ZIP_BYTES:
        raise PromptSetError(
            f"{name} unpacks to more than {MAX_ZIP_BYTES // 2**30} GB; zip fewer or smaller files."
        )
    for entry in entries:
        if entry.file_size > RATIO_FROM_BYTES and entry.file_size > MAX_ZIP_RATIO * max(
            entry.compress_size, 1
        ):
            raise PromptSetError(
                f"{name}: {PurePosixPath(entry.filename).name} unpacks to over {MAX_ZIP_RATIO} times "
                "its packed size, which no picture or clip does; zip the files themselves."
            )
    unpacked = sum(entry.file_size for entry in entries)
    if unpacked > RATIO_FROM_BYTES and unpacked > MAX_ZIP_RATIO * max(
        sum(e.compress_size for e in entries), 1
    ):
        raise PromptSetError(
            f"{name} unpacks to over {MAX_ZIP_RATIO} times its packed size, which no pictures or clips "
            "do; zip the files themselves."
        )


def extract(opened: zipfile.ZipFile, entry: zipfile.ZipInfo, path: Path, budget: int, name: str) -> int:
    """Unpacks one entry to `path`, counting what really comes out (a header can lie about the
    size): past `budget` bytes, it stops and refuses. Returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with opened.open(entry) as source, path.open("wb") as out:
        while block := source.read(1 << 20):
            written += len(block)
            if written > budget or written > entry.file_size:
                raise PromptSetError(f"{name} unpacks to more than it says; zip the files again.")
            out.write(block)
    return written


def example_sets() -> dict[str, Path]:
    """The built-in sets: name -> file."""
    return {path.stem: path for path in sorted(EXAMPLE_SETS.glob("*.jsonl"))}


# --- checked up front --------------------------------------------------------------------------


@dataclass
class Checked:
    """What a set can run: per model, the ids of the items it takes; and every refusal in words."""

    runnable: dict[str, list[str]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    # (item id, model key) -> why that model cannot take that item (shown in its grid cell).
    refused_cells: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def any_runnable(self) -> bool:
        return any(self.runnable.values())


async def check_set(prompt_set: PromptSet, cards: Sequence[ModelCard], decoder: VideoDecoderPool) -> Checked:
    """Every file found inside the set and accepted by the media pipeline (images decoded,
    clips decoded in the worker), and every item within each model's media limits."""
    checked = Checked({card.key: [] for card in cards})
    for number, item in enumerate(prompt_set.items, 1):
        where = f"item {number} ({item.id})"
        problems = []
        for name in item.media:
            path = prompt_set.path(name)
            if prompt_set.outside(name):
                problems.append(f"{name} is outside the set's files")
                continue
            if not path.is_file():
                problems.append(f"{name} is not among the set's files")
                continue
            try:
                if is_video(path):
                    await asyncio.to_thread(decoder.decode, path, 2)
                else:
                    await asyncio.to_thread(load_image, path)
            except MediaError as error:
                problems.append(f"{name}: {error}")
        if problems:
            checked.refused.append(f"{where}: {'; '.join(problems)}")
            continue
        for card in cards:
            try:
                check_media(card, item.media)
                if not any(is_video(name) for name in item.media):
                    # The prompt's size, as the chat checks it (a clip's is checked when it runs).
                    images = [prompt_set.path(name) for name in item.media]
                    turn = Turn(text=item.question, images=images)
                    messages = await engine_messages([turn], None, decoder, card.video_frames)
                    await asyncio.to_thread(check_fits, card, messages)
            except ConversationError as error:
                reason = str(error).replace(" and send again.", " from the item.")
                reason = reason.replace("This message would make", "This item would make")
                checked.refused.append(f"{where}: {reason}")  # the reason names the model
                checked.refused_cells[(item.id, card.key)] = reason
            else:
                checked.runnable[card.key].append(item.id)
    return checked
