"""One user's conversation: turns with their files, checked before sending, turned into the
engine's messages.

Nothing here knows about Gradio: the UI hands over the text and file paths of a message, and
gets back a `Turn` or a `ConversationError` whose message is meant for the user. A refused
message leaves the conversation as it was.
"""

from __future__ import annotations

import asyncio
import filecmp
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from app.catalog.adapters import PromptError, get_adapter, to_turns
from app.catalog.cards import ModelCard
from app.domain.replies import Reply
from app.engines.base import EngineError, first_line
from app.engines.tokens import context_length, counter_for, media_tokens
from app.media.loading import MediaError, VideoClip, VideoDecoderPool, load_image

if TYPE_CHECKING:  # the history's record type only: this module stays free of the database
    from app.storage.history import MediaRecord

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = {".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".mpeg", ".mpg"}
THUMBNAIL_SIDE = 160
# Where no tokenizer is at hand and only the model's chat template renders the prompt: tokens
# per turn for role markers and template text, and for a default system prompt the template adds.
TOKENS_PER_TURN = 16
TEMPLATE_ALLOWANCE = 64
# Every session folder's name starts with the root, then the id of the process that made it:
# app processes sharing a temporary folder sweep only their own and dead processes' folders.
SESSION_FOLDER_ROOT = "vlm-playground-session-"
SESSION_FOLDER_PREFIX = f"{SESSION_FOLDER_ROOT}{os.getpid()}-"


# Versions of one place in a chat (edits and regenerated answers): every save stores them all.
MAX_VERSIONS = 20
# Versions within versions (an edit in a branch that an edit made): as deep as an import may
# be (`app.storage.history.ImportLimits.version_depth`), so that every chat stored loads back.
MAX_VERSION_DEPTH = 64


# The longest text a message or a system prompt may have. A stranger's 4 MiB message was tokenized
# twice before the context check refused it, seconds of work a call; this many characters count in
# about a tenth of a second (the seeing model's tokenizer, 2 cores), and are more than most
# catalog models' contexts hold (a token is three to four characters of English).
MAX_MESSAGE_CHARS = 100_000


class ConversationError(ValueError):
    """A message the app refuses before it reaches the engine; the text is meant for the user."""


# Errors whose message is written for the user; anything else is a bug, logged, not shown.
USER_ERRORS = (ConversationError, MediaError, PromptError, EngineError)
INTERNAL_ERROR = "Something went wrong on the server (it has been logged); please try again."


def user_message(error: Exception) -> str:
    """What the user is told about `error`: its own message when it is one of ours, else a
    generic line (the details, which may hold paths, go to the log only)."""
    if isinstance(error, USER_ERRORS):
        return str(error)
    log.error("unexpected error", exc_info=error)
    return INTERNAL_ERROR


@dataclass(frozen=True)
class GoneFile:
    """A file of a reopened conversation that the server no longer keeps (past the history's
    retention): shown from its stored thumbnail, never sent to the model, and stored again as it
    was when the conversation goes on (so its record and thumbnail outlive the follow-up)."""

    medium: MediaRecord  # as the history stored it
    thumbnail: Path | None  # None where none could be made


@dataclass
class Turn:
    """One exchange: the user's message (files linked into the session's folder) and the answer."""

    text: str
    images: list[Path] = field(default_factory=list)
    video: Path | None = None
    # Thumbnails of the frames the model sees, with each frame's time in seconds.
    frames: list[tuple[Path, float]] = field(default_factory=list)
    # Each file as the user sent it: its name (never a server path), kind and size.
    media: list[str] = field(default_factory=list)
    # The name the user gave each kept file (the history stores it, never the server path).
    names: dict[Path, str] = field(default_factory=dict)
    # The model's answer and how it went; None until one is asked for.
    reply: Reply | None = None
    # A comparison's answers, one per model (the compare tab's turn has these, not `reply`).
    columns: list[Reply] = field(default_factory=list)
    # Files of a reopened conversation no longer kept: shown, never sent (see GoneFile).
    gone: list[GoneFile] = field(default_factory=list)
    # The versions of this exchange when the chat was edited or regenerated here (see
    # `Versions`), shared by every version's turn; None while it has only one.
    versions: Versions | None = field(default=None, repr=False, compare=False)

    def again(self) -> Turn:
        """The same message, unanswered: a new version of this exchange (a regenerated answer)."""
        return Turn(
            text=self.text,
            images=list(self.images),
            video=self.video,
            frames=list(self.frames),
            media=list(self.media),
            names=dict(self.names),
            gone=list(self.gone),
        )

    @property
    def files(self) -> list[Path]:
        """The turn's images, then its video: the order they were sent in."""
        return [*self.images, *([self.video] if self.video else [])]

    @property
    def answer(self) -> str:
        return self.reply.answer if self.reply is not None else ""


@dataclass(eq=False)
class Versions:
    """The versions of one exchange in a chat: the message edited and sent again, or the answer
    regenerated. Each version is a tail: its turn, then the turns that followed it. The shown
    version's tail is the session's `turns` from that place on, and is read from there (its copy
    here is brought up to date whenever the chat leaves it), so nested versions need no upkeep.
    """

    tails: list[list[Turn]]
    # The version shown before the newest one was added: shown again if that one is dropped.
    before: int = 0

    def place(self, turn: Turn) -> int:
        """Which version `turn` begins (0 for the first)."""
        return next(k for k, tail in enumerate(self.tails) if tail[0] is turn)

    def keep(self, tail: Sequence[Turn]) -> None:
        """Brings the copy of the shown version (`tail`, from the session) up to date."""
        self.tails[self.place(tail[0])] = list(tail)


@dataclass
class Session:
    """One browser session's conversation and files. `close()` deletes the files; the UI calls it
    when the session ends, so one user's uploads are never served to another."""

    turns: list[Turn] = field(default_factory=list)
    # The conversation's id in the history (`app.storage.history`); a cleared chat starts a new one.
    conversation_id: str = field(default_factory=lambda: secrets.token_hex(16))
    # The version of it this tab last stored or reopened (0: never stored): a save from a tab
    # that missed another tab's save is refused rather than overwriting it.
    stored_version: int = 0
    # What that store held (a digest, `HistoryView.keep_chat`): a chat stored as it is is not
    # stored again.
    stored_digest: str = ""
    # One store of it at a time: two at once would both start from `stored_version`, and the
    # later would be refused as another tab's.
    saving: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)
    # Set by the stop button; the streaming handler checks it at every event.
    stop_requested: bool = False
    # The system prompt a comparison's run was asked with (stored with it, whatever the page's
    # box says by the time the run is stored).
    system_prompt: str = ""
    # The place of the message being edited: the next one sent becomes its new version.
    editing: int | None = None
    # The content hash of each kept file, once worked out (the history stores files by it).
    file_hashes: dict[Path, str] = field(default_factory=dict)
    _folder: Path | None = None

    @property
    def folder(self) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix=SESSION_FOLDER_PREFIX))
        return self._folder

    def keep(self, path: str | Path) -> Path:
        """A copy of an uploaded file that lives as long as this session (a hard link when the
        upload is on the same file system)."""
        source = Path(path)
        gone = ConversationError(
            f"{source.name} is no longer on the server (unsent uploads are kept for a while); "
            "attach it again."
        )
        if not source.is_file():  # gone, or never a file (a folder, through the API)
            raise gone
        target = self.folder / f"{len(list(self.folder.iterdir())):04d}{source.suffix.lower()}"
        try:
            os.link(source, target)
        except FileNotFoundError:
            raise gone from None
        except OSError:
            shutil.copyfile(source, target)
        return target

    def branch(self, position: int, turn: Turn) -> None:
        """Shows `turn` as a new version of the exchange at `position` (an edited message, a
        regenerated answer): the chat goes on from it, and the version shown until now, with
        the turns that followed it, stays reachable (`switch`)."""
        shown = self.turns[position]
        versions = shown.versions or Versions(tails=[[shown]])
        # Each earlier place with versions holds this one inside one of its versions.
        depth = 1 + sum(1 for earlier in self.turns[:position] if earlier.versions is not None)
        if shown.versions is None and depth > MAX_VERSION_DEPTH:
            raise ConversationError(
                f"This chat has versions within versions {MAX_VERSION_DEPTH} deep: edit an earlier "
                "message, or start a new chat."
            )
        if len(versions.tails) >= MAX_VERSIONS:
            raise ConversationError(
                f"Message {position + 1} has {MAX_VERSIONS} versions already: pick one under "
                "Versions and go on from it, or start a new chat."
            )
        shown.versions = turn.versions = versions
        versions.keep(self.turns[position:])
        versions.before = versions.place(shown)
        versions.tails.append([turn])
        self.turns[position:] = [turn]

    def switch(self, position: int, version: int) -> None:
        """Shows the `version`-th version of the exchange at `position` (and what followed it)."""
        versions = self.turns[position].versions if 0 <= position < len(self.turns) else None
        if versions is None or not 0 <= version < len(versions.tails):
            raise ConversationError("That version of the chat is no longer here; pick another.")
        versions.keep(self.turns[position:])
        self.turns[position:] = versions.tails[version]

    def drop_last(self) -> Turn:
        """Takes the last turn out of the chat (undo, a failed answer). Where it was one of
        several versions, the one shown before it comes back in its place (with what followed
        it); the others stay."""
        turn = self.turns.pop()
        versions = turn.versions
        if versions is None:
            return turn
        place = versions.place(turn)
        newest = place == len(versions.tails) - 1
        del versions.tails[place]
        back = versions.before if newest else max(place - 1, 0)
        versions.before = 0
        self.turns.extend(versions.tails[back])
        if len(versions.tails) == 1:  # one version left: no longer a choice
            versions.tails[0][0].versions = None
        return turn

    def discard(self, turn: Turn) -> None:
        """Takes a failed answer's turn out of the chat if it is still the last one shown (as
        `drop_last`). Where Undo or another version picked took it out of sight while it streamed,
        nothing else is touched: undone, it is gone already; in a version not shown, it stays
        there with its failed answer, to regenerate or edit."""
        if self.turns and self.turns[-1] is turn:
            self.drop_last()

    def starts_with(self, turns: Sequence[Turn]) -> bool:
        """Whether the chat still begins with these very turns (nothing undone or switched)."""
        return same_turns(self.turns[: len(turns)], turns)

    def given_name(self, path: str | Path) -> str:
        """The name the user gave a file this session keeps, put back in the message box by an
        edit or an undo (Gradio hands it back as a copy in its cache, under the kept file's own
        name: found by that name and its bytes), else the path's own name."""
        path = Path(path)
        for turn in self.every_turn():
            for kept, name in turn.names.items():
                if kept == path or (kept.name == path.name and same_file(kept, path)):
                    return name
        return path.name

    def every_turn(self) -> list[Turn]:
        """Every turn of every version, the shown ones first (each version read as `Versions`
        says: the shown one from the session)."""
        found: list[Turn] = []

        def walk(turns: Sequence[Turn], version_of: Versions | None = None) -> None:
            found.extend(turns)
            for turn in turns:
                if turn.versions is not None and turn.versions is not version_of:
                    for tail in turn.versions.tails:
                        if tail[0] is not turn:
                            walk(tail, turn.versions)

        walk(self.turns)
        return found

    def stop_unended(self) -> None:
        """Every answer still streaming, in any version, marked stopped, and its stream asked to
        stop: the chat is being let go of (or stored as the app stops), and is stored with what
        came so far (where that store fails and the chat stays, its answer stops all the same)."""
        self.stop_requested = True
        for turn in self.every_turn():
            for reply in [*turn.columns, *([turn.reply] if turn.reply is not None else [])]:
                if not reply.ended:
                    reply.state = "stopped"

    def close(self) -> None:
        """Deletes the conversation and its folder: the session's own copies of what it sent.
        The uploads themselves are not the session's to delete: Gradio keeps identical uploads of
        every tab at one path (a folder named by the content's hash), and the examples' files are
        shared by everyone; Gradio's own sweep (`delete_cache`) removes old uploads."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        self.turns.clear()
        self.editing = None
        self.file_hashes.clear()
        self.conversation_id = secrets.token_hex(16)
        self.stored_version = 0
        self.stored_digest = ""


def same_turns(a: Sequence[Turn], b: Sequence[Turn]) -> bool:
    """Whether two lists hold the very same turns in order (the objects, not equal copies)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def same_file(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (False if either is gone)."""
    try:
        return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def is_video(path: str | Path) -> bool:
    return Path(path).suffix.lower() in VIDEO_SUFFIXES


def check_media(card: ModelCard, files: Sequence[str]) -> None:
    """Refuses a message's media this model cannot take. Only the message's own files count:
    earlier turns' pictures past the model's limit are left out of the prompt instead
    (`over_the_limits`), so a follow-up picture never needs a new chat."""
    videos = [f for f in files if is_video(f)]
    images = [f for f in files if not is_video(f)]
    limits = card.media_limits
    for kind, new in (("image", images), ("video", videos)):
        if not new:
            continue
        if kind not in card.modalities:
            raise ConversationError(f"{card.display_name} does not take {kind}s; it takes {_takes(card)}.")
        limit = limits.get(kind, 0)
        if len(new) > limit:
            raise ConversationError(
                f"{card.display_name} takes at most {_count(limit, kind)} in one message: "
                f"remove {_count(len(new) - limit, kind)} and send again."
            )


def _count(number: int, kind: str) -> str:
    return f"{number} {kind}{'s' if number != 1 else ''}"


def over_the_limits(card: ModelCard, turns: Sequence[Turn]) -> list[Path]:
    """The conversation's files past the model's limits per prompt (vLLM counts every image and
    video of the prompt, earlier turns' too): the oldest, so that the newest are what it sees.
    The last turn's own files are within the limits (`check_media`)."""
    room = dict(card.media_limits)
    left_out = []
    for turn in reversed(turns):
        for path in reversed(turn.files):
            kind = "video" if is_video(path) else "image"
            if room.get(kind, 0) > 0:
                room[kind] -= 1
            else:
                left_out.append(path)
    return left_out[::-1]


def left_out_marker(path: Path) -> str:
    """What the prompt says where a file was left out (the turn's text stays)."""
    return f"[an earlier {'video' if is_video(path) else 'picture'} was here; it is no longer shown]"


@dataclass
class Prompt:
    """The engine's messages for a conversation, their size in tokens, and the earlier files left
    out of them (oldest first) to keep within the model's media limits and context."""

    messages: list[dict[str, Any]]
    size: int
    left_out: list[Path] = field(default_factory=list)


async def fitted_prompt(
    card: ModelCard,
    turns: Sequence[Turn],
    system: str | None,
    decoder: VideoDecoderPool,
    clips: dict[Path, VideoClip] | None = None,
) -> Prompt:
    """The conversation as the model can take it: earlier files past its media limits left out,
    then, while the prompt would not fit its context, the oldest file still in it (never the last
    turn's). Refuses, in one line, only what leaving files out cannot fix."""
    check_length(system or "", "The system prompt")
    for turn in turns[:-1]:  # a conversation reopened from an imported history holds any text
        check_length(turn.text, "An earlier message", "start a new chat")
    if turns:
        check_length(turns[-1].text, "This message")
    left_out = over_the_limits(card, turns)
    clips = dict(clips or {})  # each video decoded once, however many tries
    while True:
        messages = await engine_messages(turns, system, decoder, card.video_frames, clips, left_out)
        # In a thread: the tokenizer releases the GIL, and the loop serves every other visitor.
        size = await asyncio.to_thread(estimate_prompt_tokens, card, messages)
        limit = context_length(card)
        if limit is None or size < limit:
            return Prompt(messages, size, left_out)
        earlier = [path for turn in turns[:-1] for path in turn.files if path not in left_out]
        if not earlier:
            # Raises: the text, or the last turn's own files, are too long.
            await asyncio.to_thread(check_fits, card, messages)
            return Prompt(messages, size, left_out)
        left_out = sorted([*left_out, earlier[0]], key=[p for t in turns for p in t.files].index)


def check_length(text: str, what: str, remedy: str = "shorten it") -> None:
    """Refuses `text` past `MAX_MESSAGE_CHARS`, in a line that says what to change (`what`: the
    sentence's subject, "This message" or "The system prompt")."""
    if len(text) > MAX_MESSAGE_CHARS:
        raise ConversationError(
            f"{what} is {len(text):,} characters; the playground takes at most {MAX_MESSAGE_CHARS:,}: "
            f"{remedy}."
        )


def sent_media(turns: Sequence[Turn], left_out: Collection[Path]) -> list[str]:
    """What the turns sent, as users are told (name, kind, size), the files left out marked."""
    lines = []
    for turn in turns:
        gone = {turn.names.get(path, path.name) for path in turn.files if path in left_out}
        for line in turn.media:
            lines.append(f"{line} (left out of this prompt)" if line.split(": ", 1)[0] in gone else line)
    return lines


def left_out_notice(card: ModelCard, turns: Sequence[Turn], left_out: Sequence[Path]) -> str:
    """The line that tells the user which earlier files the model no longer sees, and why."""
    if not left_out:
        return ""
    names = {path: name for turn in turns for path, name in turn.names.items()}
    listed = ", ".join(names.get(path, path.name) for path in left_out)
    limits = " and ".join(_count(limit, kind) for kind, limit in card.media_limits.items())
    return (
        f"{card.display_name} no longer sees {listed}: it takes {limits} per prompt, within "
        f"{context_length(card) or 'its'} tokens, so the oldest files are left out (their turns' text stays)."
    )


def _takes(card: ModelCard) -> str:
    return " and ".join(f"{m}s" for m in card.modalities)


async def make_turn(
    session: Session, text: str, files: Sequence[str], decoder: VideoDecoderPool, video_frames: int
) -> tuple[Turn, VideoClip | None]:
    """Keeps and loads a new message's files (after `check_media`); raises `MediaError` for a
    file that cannot be used, or `ConversationError` for an empty message."""
    if not text.strip() and not files:
        raise ConversationError("Write a message or add a file first.")
    check_length(text, "This message")
    turn = Turn(text=text)
    clip = None
    for upload in files:
        name = session.given_name(upload)
        kept = session.keep(upload)
        turn.names[kept] = name
        size = f"{kept.stat().st_size / 1024:,.0f} KB"
        if is_video(kept):
            clip = await asyncio.to_thread(decoder.decode, kept, video_frames)
            turn.video = kept
            turn.frames = save_thumbnails(clip, session.folder / f"{kept.stem}-frames")
            count, height, width = clip.frames.shape[:3]
            span = f" from {clip.timestamps[0]:.1f} s to {clip.timestamps[-1]:.1f} s" if count else ""
            resized = clip.metadata.get("frames_resized_from")
            source = f" (scaled from {resized[1]}×{resized[0]})" if resized else ""
            turn.media.append(f"{name}: video, {size}, {count} frames of {width}×{height} px{source}{span}")
        else:
            # Loaded now to refuse a bad image before the answer starts, not during it.
            image = await asyncio.to_thread(load_image, kept)
            turn.images.append(kept)
            turn.media.append(f"{name}: image, {size}, {image.width}×{image.height} px")
    return turn, clip


def save_thumbnails(clip: VideoClip, folder: Path) -> list[tuple[Path, float]]:
    folder.mkdir(parents=True, exist_ok=True)
    thumbnails = []
    for index, (frame, seconds) in enumerate(zip(clip.frames, clip.timestamps, strict=True)):
        image = Image.fromarray(frame)
        image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
        path = folder / f"{index:02d}.jpg"
        image.save(path, quality=80)
        thumbnails.append((path, float(seconds)))
    return thumbnails


async def engine_messages(
    turns: Sequence[Turn],
    system: str | None,
    decoder: VideoDecoderPool,
    video_frames: int,
    clips: dict[Path, VideoClip] | None = None,
    left_out: Collection[Path] = (),
) -> list[dict[str, Any]]:
    """The conversation in the engine's message shape; the last turn is the one to answer.
    `clips` holds videos already decoded for this send (it keeps those decoded here too); the
    files in `left_out` are a marker in their turn's text instead."""
    clips = clips if clips is not None else {}
    system = (system or "").strip()
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for position, turn in enumerate(turns):
        parts: list[dict[str, Any]] = []
        markers = [left_out_marker(path) for path in turn.files if path in left_out]
        for path in turn.images:
            if path not in left_out:
                parts.append({"type": "image", "image": await asyncio.to_thread(load_image, path)})
        if turn.video is not None and turn.video not in left_out:
            if turn.video not in clips:
                clips[turn.video] = await asyncio.to_thread(decoder.decode, turn.video, video_frames)
            parts.append({"type": "video", "video": clips[turn.video]})
        parts.append({"type": "text", "text": "\n".join([*markers, turn.text]) if markers else turn.text})
        messages.append({"role": "user", "content": parts})
        if position < len(turns) - 1:
            messages.append({"role": "assistant", "content": turn.answer})
    return messages


def estimate_prompt_tokens(card: ModelCard, messages: Sequence[dict[str, Any]]) -> int:
    """The prompt's size in tokens: counted with the model's tokenizer where it is on this
    machine (the prompt rendered as the engine renders it, plus the card's visual-token rule for
    images and video frames), else a bound the prompt never exceeds in text tokens."""
    counter = counter_for(card)
    if counter is not None:
        try:
            return counter.count(messages)
        except PromptError:
            raise
        except Exception as error:
            log.warning("counting %s's prompt failed (%s); estimating it", card.key, first_line(error)[:200])
    return upper_bound_tokens(card, messages)


def upper_bound_tokens(card: ModelCard, messages: Sequence[dict[str, Any]]) -> int:
    """A prompt size no tokenizer exceeds for the text: one token per byte of UTF-8 (byte-level
    tokenizers never make more; the others fall back to bytes) of the prompt as the card's format
    renders it, plus a start token; the card's visual-token rule for media. A prompt that only
    the model's own chat template renders gets its messages' bytes and an allowance per turn."""
    turns = to_turns(messages)
    if card.adapter == "format":
        try:
            prompt, images, videos = get_adapter(card.adapter).render(card.prompt_spec, turns, None)
            return len(prompt.encode("utf-8")) + 1 + media_tokens(card, images, videos)
        except PromptError:
            pass  # the engine says why (a system prompt the format has not, ...)
    total = TEMPLATE_ALLOWANCE
    for turn in turns:
        total += TOKENS_PER_TURN + len(turn.text.encode("utf-8"))
    images = [image for turn in turns for image in turn.images]
    videos = [video for turn in turns for video in turn.videos]
    return total + media_tokens(card, images, videos)


def check_fits(card: ModelCard, messages: Sequence[dict[str, Any]]) -> int:
    """The prompt's size (see `estimate_prompt_tokens`); refuses a prompt that will not fit the
    model's context, with a line that says what to change."""
    estimate = estimate_prompt_tokens(card, messages)
    limit = context_length(card)
    if limit is not None and estimate >= limit:
        exact = counter_for(card) is not None
        raise ConversationError(
            f"This message would make a prompt of {'' if exact else 'up to '}{estimate:,} tokens; "
            f"{card.display_name} takes at most {limit:,} (prompt plus answer): shorten the text, "
            "send fewer or smaller files, or start a new chat."
        )
    return estimate
