"""The history sidebar: a browser's stored conversations, to reopen, rename, delete, export and
import. The chat is stored here (`keep_chat`, the database in a worker thread) when an answer
ends, before the page is shown its end, and before the tab drops it (New chat, Clear, another
conversation opened), so a tab closed or a click made the moment an answer ends loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr

from app.domain.compare import Comparison
from app.domain.conversation import (
    SESSION_FOLDER_PREFIX,
    GoneFile,
    Session,
    Turn,
    Versions,
    is_video,
    save_thumbnails,
)
from app.domain.grid import GridWork, from_record, thumbnails
from app.domain.promptsets import PromptSet, check_set
from app.domain.replies import Reply, reply_record, stored_reply
from app.domain.sessions import Visit
from app.engines.base import SamplingSettings
from app.media.loading import MediaError
from app.storage.history import (
    ConversationRecord,
    History,
    HistoryError,
    Kind,
    MediaRecord,
    ReplyRecord,
    Summary,
    TurnRecord,
    describe_media,
    hash_file,
)
from app.views.chat import KEPT_OPEN, PRIVATE, SAVE_FAILED, ChatView, conversation
from app.views.compare import CompareView, columns_view, sent_view
from app.views.grid import GridView
from app.views.services import Playground, refusal

log = logging.getLogger(__name__)

NO_HISTORY = "History is off on this server (APP_HISTORY=0): conversations are not stored."
# The export of an open chat whose latest turns could not be stored: the file is what is stored.
EXPORTED_STORED = (
    "Your latest turns could not be stored just now, so the file is the conversation as stored "
    "before them: export again in a moment for all of it."
)
# Deleting is for good: the first click asks, a second one within this long deletes.
CONFIRM_S = 30.0
CONFIRM_DELETE = "Delete it for good? Click Delete again to confirm (or pick something else to keep it)."
GONE_FILES = (
    "Some files of this conversation are no longer kept on the server (they are deleted after "
    "{days:g} days): the model no longer sees them. Attach them again to ask about them."
)


def record_of(
    session: Session, kind: Kind, model: str, system: str
) -> tuple[ConversationRecord, dict[str, Path], dict[str, Path]]:
    """A chat or a comparison as the history stores it, its kept files by content hash, and a
    still of each video (the first frame the decoding worker gave) for its thumbnail."""
    files: dict[str, Path] = {}
    stills: dict[str, Path] = {}

    def records(turns: list[Turn], version_of: Versions | None = None) -> list[TurnRecord]:
        """`turns` as records; `version_of`: the versions `turns` is one of (its first turn's
        record holds none of them: the enclosing record does)."""
        kept = []
        for turn in turns:
            media = []
            for path, line in zip(turn.files, media_lines(turn), strict=True):
                # Each kept file is hashed once in the session's life, however many saves and
                # versions hold it (this runs on the event loop, as a save must see the chat as
                # it is at that moment, before another event changes it).
                if path not in session.file_hashes:
                    session.file_hashes[path] = hash_file(path)
                name = turn.names.get(path, path.name)
                medium = describe_media(path, name, kind_of(path), line, session.file_hashes[path])
                files[medium.hash] = path
                if path == turn.video and turn.frames:
                    stills[medium.hash] = turn.frames[0][0]
                media.append(medium)
            # Files no longer kept stay in the record (with their thumbnails) as they were stored.
            media += [gone.medium for gone in turn.gone]
            replies = turn.columns or ([turn.reply] if turn.reply is not None else [])
            # The other versions of this place, each read from its own copy; this one's tail is
            # the rest of `turns` (see `Versions`).
            versions, shown_at, shown_before = [], 0, 0
            if turn.versions is not None and turn.versions is not version_of:
                shown_at, shown_before = turn.versions.place(turn), turn.versions.before
                versions = [
                    records(tail, turn.versions) for tail in turn.versions.tails if tail[0] is not turn
                ]
            kept.append(
                TurnRecord(
                    text=turn.text,
                    media=media,
                    replies=[reply_record(r) for r in replies if r.ended],
                    versions=versions,
                    shown_at=shown_at,
                    shown_before=shown_before,
                )
            )
        return kept

    record = ConversationRecord(
        id=session.conversation_id, kind=kind, model=model, system_prompt=system, turns=records(session.turns)
    )
    return record, files, stills


def turns_digest(record: ConversationRecord) -> str:
    """What a record's turns hold, in a few bytes: a chat whose turns are stored as they are is
    not stored again (a model or system prompt picked but not sent is no change to store)."""
    return hashlib.sha256(record.model_dump_json(include={"turns"}).encode()).hexdigest()


def media_lines(turn: Turn) -> list[str]:
    """Each file's description ("name: image, 12 KB, 64×48 px") in the order of `turn.files`."""
    lines = {line.split(": ", 1)[0]: line for line in turn.media}
    return [lines.get(turn.names.get(path, path.name), "") for path in turn.files]


def kind_of(path: Path) -> Any:
    return "video" if is_video(path) else "image"


def summary_label(summary: Summary, names: Mapping[str, str]) -> str:
    """A line of the list that tells alike titles apart: the model (by its name where this page
    offers it), the turns and the time."""
    when = time.strftime("%d %b %H:%M", time.localtime(summary.updated_at))
    if summary.kind in ("compare", "grid"):
        models = len(summary.model.split(","))
        title = summary.title if summary.kind == "grid" else f"Compare: {summary.title}"
        return f"{title} · {models} models · {when}"
    turns = f"{summary.turns} turn{'s' if summary.turns != 1 else ''}"
    return f"{summary.title} · {names.get(summary.model, summary.model)} · {turns} · {when}"


class HistoryView:
    def __init__(self, playground: Playground, chat: ChatView, compare: CompareView, grid: GridView) -> None:
        self.playground = playground
        self.chat = chat
        self.compare = compare
        self.grid = grid
        self.reopened: list[Any] = []  # what reopening a conversation updates (set by `layout`)
        playground.on_close.append(self.store_at_exit)
        chat.keeper, compare.keeper = self.keep_chat, self.keep_compare

    @property
    def history(self) -> History | None:
        """The stored conversations; None when the operator keeps none (APP_HISTORY=0)."""
        history = self.playground.history
        return history if history is not None and history.keep_conversations else None

    # --- what the chat calls -----------------------------------------------------------------

    async def keep_chat(self, visit: Visit, session: Session, model: str, system: str) -> str:
        """Stores a chat of the tab (`session`) as it is now, unless its turns are stored so
        already: "" once stored, else the line that says why not (another tab stored it
        meanwhile: `HistoryError`'s line; the database failed: `SAVE_FAILED`). A chat the tab
        dropped meanwhile (New chat, another opened) is left as it was stored then."""
        return await self._keep(visit, session, "chat", model, system)

    async def keep_compare(self, visit: Visit, session: Session, keys: list[str] | None, system: str) -> str:
        """Stores a comparison run of the tab as `keep_chat` stores a chat."""
        if not any(turn.columns for turn in session.turns):
            return ""
        return await self._keep(visit, session, "compare", ",".join(keys or []), system)

    async def _keep(self, visit: Visit, session: Session, kind: Kind, model: str, system: str) -> str:
        history = self.history
        if history is None:
            return ""
        async with session.saving:
            try:
                # Read on the event loop, as the chat is at this moment (the save runs in a thread).
                record, files, stills = record_of(session, kind, model, system)
                digest = turns_digest(record)
                if session.stored_version and digest == session.stored_digest:
                    return ""  # (an empty conversation opened, too: it stays)
                if not session.turns:  # every turn undone: nothing of it stays stored
                    if session.stored_version:
                        with contextlib.suppress(HistoryError):
                            await asyncio.to_thread(history.delete, visit.browser_id, session.conversation_id)
                    session.stored_version, session.stored_digest = 0, ""
                    return ""
                session.stored_version = await asyncio.to_thread(
                    partial(history.save, changes=session.stored_version, stills=stills),
                    visit.browser_id,
                    record,
                    files,
                )
                session.stored_digest = digest
            except HistoryError as error:  # another tab stored it meanwhile
                return str(error)
            except Exception:
                log.exception("storing a conversation failed")
                return SAVE_FAILED
        return ""

    async def save_chat(self, visit: Visit | None, model: str, system: str) -> Any:
        """Stores the tab's chat where it changed (an undo, another version picked; an answer
        is stored before it is shown ended); a notice if that failed, else the chat's notice as
        it was."""
        if visit is None:
            return gr.skip()
        return await self.keep_chat(visit, visit.chat, model, system) or gr.skip()

    async def save_compare(self, visit: Visit | None, keys: list[str] | None, system: str) -> Any:
        """Stores the comparison that just ended (each run is a conversation of one turn),
        unless it is stored so already (`CompareView` stores it before it shows its end)."""
        if visit is None:
            return gr.skip()
        return await self.keep_compare(visit, visit.compare, keys, system) or gr.skip()

    def store_at_exit(self, visit: Visit) -> None:
        """The app is stopping: the tab's chat and comparison stored as they are, an answer the
        stop cut short kept as stopped (the events that store after an answer may not run)."""
        history = self.history
        if history is None:
            return
        for session, kind, model in (
            (visit.chat, "chat", visit.chat_model or ""),
            (visit.compare, "compare", ""),
        ):
            if not session.turns or (kind == "compare" and not any(t.columns for t in session.turns)):
                continue
            session.stop_unended()  # every version's: an answer may stream in one not shown
            # The page's system prompt is not the server's to read: a stored one stays as it was.
            system = ""
            if session.stored_version:
                stored = history.load(visit.browser_id, session.conversation_id)
                model, system = stored.model or model, stored.system_prompt
            record, files, stills = record_of(session, kind, model, system)
            with contextlib.suppress(HistoryError):  # another tab stored it since: theirs stays
                session.stored_version = history.save(
                    visit.browser_id, record, files, session.stored_version, stills=stills
                )

    # --- handlers ----------------------------------------------------------------------------

    async def listing(self, visit: Visit | None) -> Any:
        """The sidebar's list, the open conversation selected."""
        if self.history is None or visit is None:
            return gr.Radio(choices=[], value=None)
        summaries = await asyncio.to_thread(self.history.list, visit.browser_id)
        names = {key: choice.card.display_name for key, choice in self.playground.choices.items()}
        choices = [(summary_label(s, names), s.id) for s in summaries]
        current = visit.chat.conversation_id
        return gr.Radio(choices=choices, value=current if any(c[1] == current for c in choices) else None)

    async def listing_unless_asked(self, visit: Visit | None) -> Any:
        """The list after a click on Delete: as it was while the click only asked (the pick
        stays, for the second click)."""
        if visit is not None and visit.delete_asked is not None:
            return gr.skip()
        return await self.listing(visit)

    async def reopen(
        self, conversation_id: str | None, visit: Visit | None, model: str | None = None, system: str = ""
    ) -> tuple[Any, ...]:
        """Opens a stored conversation: a chat in the chat tab (its turns, files, answers and
        model, to go on with), a comparison in the compare tab (its columns). The chat or the
        comparison it takes the place of is stored first (a chat with the page's `model` and
        `system` prompt, a comparison with its run's)."""
        unchanged = (gr.skip(),) * len(self.reopened)
        self.playground.active(visit)
        history = self.history
        if history is None or visit is None or not conversation_id:
            return unchanged
        if conversation_id == visit.chat.conversation_id:
            return unchanged
        try:
            record = await asyncio.to_thread(history.load, visit.browser_id, conversation_id)
        except HistoryError as error:
            return (*unchanged[:-1], str(error))
        if record.kind == "grid":
            notice = await self.grid_reopened(history, record, visit)
            return (*unchanged[:3], gr.Tabs(selected="grid-tab"), *unchanged[4:-1], notice)
        # A comparison opens in its own tab, in place of the one there, which is stored first;
        # the chat stays, streaming if it was.
        if record.kind == "compare" and await self.compare.kept_before_dropping(visit) == SAVE_FAILED:
            return (*unchanged[:-1], KEPT_OPEN)
        session = Session()
        session.conversation_id, session.stored_version = record.id, record.version
        # Only the chat shows a video's frames (for its model, if still in the catalog).
        choice = self.playground.choices.get(record.model) if record.kind == "chat" else None
        video_frames = choice.card.video_frames if choice is not None else None
        missing = await asyncio.to_thread(
            self._restore, history, visit.browser_id, record, session, video_frames
        )
        gone_files = GONE_FILES.format(days=self.playground.settings.media_retention_days) if missing else ""
        # As restored, it is stored: opening it and moving on stores nothing.
        session.stored_digest = turns_digest(
            record_of(session, record.kind, record.model, record.system_prompt)[0]
        )
        if record.kind == "compare":
            async with visit.compare.saving:  # not while it is being stored: its files go
                visit.compare.close()
            visit.compare = session
            return self.compare_shown(record, session, gone_files)
        # The chat opened takes the open chat's place at once; that one is stored (a message
        # sent while the record was read and restored went into it) and closed.
        kept = await self.chat.replaced_by_a_new_chat(visit, model, system, session)
        if kept == SAVE_FAILED:
            return (*unchanged[:-1], KEPT_OPEN)
        notice = " ".join(line for line in (kept, gone_files) if line)
        picked: Any = record.model if choice is not None and not choice.reason else gr.skip()
        if choice is not None and not choice.reason:
            visit.chat_model = record.model
        skip_compare = (gr.skip(),) * (len(self.reopened) - 5)
        return (
            conversation(session),
            picked,
            record.system_prompt,
            gr.Tabs(selected="chat-tab"),
            *skip_compare,
            notice,
        )

    async def grid_reopened(self, history: History, record: ConversationRecord, visit: Visit) -> str:
        """A stored grid run back in the grid tab (its files from the history's store), to read,
        export, or finish: Run answers its cells not done."""
        if visit.grid is not None and visit.grid.running:
            return "A set is running in the grid tab: stop it first, then reopen this one."
        folder = Path(tempfile.mkdtemp(prefix=SESSION_FOLDER_PREFIX))
        missing = False
        # Each file is copied under its hash: a stored name is display text and never a path.
        files: dict[str, Path] = {}
        for medium in {m.name: m for turn in record.turns for m in turn.media}.values():
            path = history.media_file(visit.browser_id, medium.hash)
            if path is None:
                missing = True
            else:
                files[medium.name] = folder / f"{medium.hash}{path.suffix}"
                shutil.copyfile(path, files[medium.name])
        keys = [key for key in record.model.split(",") if key in self.playground.choices]
        cards = [self.playground.choices[key].card for key in keys]
        run = from_record(record, {card.key: card for card in cards}, SamplingSettings())
        prompt_set = PromptSet(run.set_name, run.items, folder, unpacked=folder, files=files)
        checked = await check_set(prompt_set, cards, self.playground.decoder)
        if visit.grid is not None:
            visit.grid.close()
        visit.grid = GridWork(prompt_set, checked, run)
        visit.grid.pictures = await asyncio.to_thread(thumbnails, run, prompt_set, self.playground.decoder)
        gone = GONE_FILES.format(days=self.playground.settings.media_retention_days) if missing else ""
        return f"Reopened {run.set_name}: {run.summary()}. {gone}".strip()

    def compare_shown(self, record: ConversationRecord, session: Session, notice: str) -> tuple[Any, ...]:
        turn = session.turns[0] if session.turns else Turn(text="")
        comparison = Comparison(turn.text, [], record.system_prompt, SamplingSettings(), turn.columns)
        keys = [key for key in record.model.split(",") if key in self.playground.choices]
        return (
            gr.skip(),
            gr.skip(),
            gr.skip(),
            gr.Tabs(selected="compare-tab"),
            *columns_view(comparison),
            sent_view(comparison, turn.media),
            keys,
            record.system_prompt,
            notice,
        )

    @staticmethod
    def _gone(history: History, browser_id: str, medium: MediaRecord, session: Session) -> GoneFile:
        """A file no longer kept, with its stored thumbnail in the session's folder to show."""
        data = history.thumbnail(browser_id, medium.hash)
        picture = None
        if data:
            picture = session.folder / f"gone-{medium.hash[:16]}.jpg"
            picture.write_bytes(data)
        return GoneFile(medium, picture)

    def _frames(self, video: Path, video_frames: int, session: Session) -> list[tuple[Path, float]]:
        """The strip of frames the model sees, as the chat showed it when the video was sent;
        none if the video cannot be decoded here."""
        try:
            clip = self.playground.decoder.decode(video, video_frames)
        except MediaError:
            return []
        return save_thumbnails(clip, session.folder / f"{video.stem}-frames")

    def _restore(
        self,
        history: History,
        browser_id: str,
        record: ConversationRecord,
        session: Session,
        video_frames: int | None,
    ) -> bool:
        """Fills `session` with `record`'s turns; True if some files are no longer kept. With
        `video_frames` (the chat's model's), each video gets its strip of frames again."""
        missing = False

        def turns(stored_turns: list[TurnRecord], a_version: bool = False) -> list[Turn]:
            """`stored_turns` back as turns; `a_version`: they are one version of a place, whose
            first turn's versions are its enclosing record's (any it holds itself are ignored:
            an export here never writes them)."""
            nonlocal missing
            restored = []
            for stored in stored_turns:
                turn, gone = self._turn(history, browser_id, record.kind, stored, session, video_frames)
                missing = missing or gone
                restored.append(turn)
            # Each place's versions share one `Versions`; the shown one's tail is the rest here.
            for position, stored in enumerate(stored_turns):
                if stored.versions and not (a_version and position == 0):
                    others = [turns(version, a_version=True) for version in stored.versions]
                    tails = [*others[: stored.shown_at], restored[position:], *others[stored.shown_at :]]
                    versions = Versions(tails=tails, before=stored.shown_before)
                    for tail in tails:
                        tail[0].versions = versions
            return restored

        session.turns.extend(turns(record.turns))
        return missing

    def _turn(
        self,
        history: History,
        browser_id: str,
        kind: Kind,
        stored: TurnRecord,
        session: Session,
        video_frames: int | None,
    ) -> tuple[Turn, bool]:
        """One stored turn back in `session`; True if some of its files are no longer kept."""
        missing = False
        turn = Turn(text=stored.text)
        for medium in stored.media:
            path = history.media_file(browser_id, medium.hash)
            if path is None:  # past the retention, stored without media, or imported
                missing = True
                turn.media.append(f"{medium.name}: no longer kept on the server")
                turn.gone.append(self._gone(history, browser_id, medium, session))
                continue
            kept = session.keep(path)
            session.file_hashes[kept] = medium.hash  # the store keeps files under their content's hash
            turn.names[kept] = medium.name
            turn.media.append(medium.description or medium.name)
            if medium.kind == "video":
                turn.video = kept
                if video_frames:
                    turn.frames = self._frames(kept, video_frames, session)
            else:
                turn.images.append(kept)
        replies = [self._reply(reply, turn) for reply in stored.replies]
        if kind == "compare":
            turn.columns = replies
        elif replies:
            turn.reply = replies[0]
        return turn, missing

    def _reply(self, stored: ReplyRecord, turn: Turn) -> Reply:
        choice = self.playground.choices.get(stored.model)
        source = choice.card.source if choice is not None else stored.model
        return stored_reply(stored, source, media=list(turn.media))

    async def new_chat(
        self, visit: Visit | None, model: str | None = None, system: str = ""
    ) -> tuple[Any, ...]:
        """A new conversation; the one open is stored first (where that fails, it stays open)."""
        if visit is None:
            return [], gr.Radio(value=None), ""
        notice = await self.chat.replaced_by_a_new_chat(visit, model, system)
        if notice == SAVE_FAILED:
            return gr.skip(), gr.skip(), KEPT_OPEN
        return conversation(visit.chat), gr.Radio(value=None), notice

    async def _on_picked(
        self, conversation_id: str | None, visit: Visit | None, action: Callable[[History, str, str], Any]
    ) -> tuple[Any, str]:
        """Runs `action(history, browser id, conversation id)` on the conversation picked in the
        list, in a worker thread: (its result, "") or (None, the line that says why not)."""
        if self.history is None or visit is None:
            return None, NO_HISTORY
        if not conversation_id:
            return None, "Pick a conversation in the list first."
        try:
            return await asyncio.to_thread(action, self.history, visit.browser_id, conversation_id), ""
        except HistoryError as error:
            return None, str(error)

    async def rename(self, conversation_id: str | None, title: str, visit: Visit | None) -> tuple[Any, ...]:
        _, notice = await self._on_picked(conversation_id, visit, lambda h, b, c: h.rename(b, c, title))
        return (gr.skip(), notice) if notice else (gr.Textbox(value=""), "")

    async def delete(self, conversation_id: str | None, visit: Visit | None) -> tuple[Any, ...]:
        """Deletes the conversation for good once asked twice (the first click asks); if it is
        the open one, the chat is cleared."""
        if visit is not None and conversation_id and self.history is not None:
            asked, visit.delete_asked = visit.delete_asked, None
            if asked is None or asked[0] != conversation_id or time.monotonic() - asked[1] > CONFIRM_S:
                visit.delete_asked = (conversation_id, time.monotonic())
                return gr.skip(), CONFIRM_DELETE
        shown = visit.chat if visit is not None else None  # (the tab may open another meanwhile)
        _, notice = await self._on_picked(conversation_id, visit, History.delete)
        if notice or visit is None or shown is None:
            return gr.skip(), notice
        if conversation_id == shown.conversation_id:
            if visit.chat is shown:
                visit.chat = Session()
            async with shown.saving:
                shown.close()
            return conversation(visit.chat), ""
        return gr.skip(), ""

    async def export(
        self, conversation_id: str | None, visit: Visit | None, model: str | None = None, system: str = ""
    ) -> tuple[Any, ...]:
        """The conversation as a JSON file to download; the open chat as the page shows it
        (stored first)."""
        kept = ""  # where the open chat could not be stored: the stored one, and the line why
        if visit is not None and model is not None and conversation_id == visit.chat.conversation_id:
            kept = await self.keep_chat(visit, visit.chat, model, system)
        text, notice = await self._on_picked(conversation_id, visit, History.export)
        if notice or visit is None or conversation_id is None:
            return gr.skip(), notice
        if kept == SAVE_FAILED:
            kept = EXPORTED_STORED
        folder = Path(tempfile.mkdtemp(prefix="vlm-export-", dir=visit.chat.folder))
        path = folder / f"conversation-{conversation_id[:8]}.json"
        path.write_text(text)
        return gr.DownloadButton(value=str(path), visible=True), kept

    async def import_file(self, upload: str | None, visit: Visit | None) -> tuple[Any, ...]:
        if self.history is None or visit is None:
            return gr.skip(), NO_HISTORY
        if not upload:
            return gr.skip(), ""
        try:
            data = Path(upload).read_bytes()
            record = await asyncio.to_thread(self.history.import_json, visit.browser_id, data)
        except HistoryError as error:
            return gr.skip(), str(error)
        except Exception as error:
            return gr.skip(), refusal(error)
        finally:
            Path(upload).unlink(missing_ok=True)
        return gr.skip(), f"Imported “{record.title}”: it is in the list."

    # --- layout ------------------------------------------------------------------------------

    def layout(self, visit: gr.State, chatbot: gr.Chatbot, tabs: gr.Tabs) -> gr.Radio:
        """The sidebar; returns its list (the page refreshes it when a page loads)."""
        with gr.Sidebar(label="History", open=False, elem_id="history"):
            if self.history is None:
                gr.Markdown(NO_HISTORY)
                self.list = gr.Radio(choices=[], visible=False)
                return self.list
            new = gr.Button("New chat", elem_id="history-new", size="sm", variant="primary")
            self.list = listed = gr.Radio(
                choices=[], label="Your conversations", elem_id="history-list", interactive=True
            )
            notice = gr.Markdown(elem_id="history-notice")
            with gr.Row():
                title = gr.Textbox(
                    show_label=False, placeholder="A new name", elem_id="history-title", scale=3
                )
                rename = gr.Button("Rename", elem_id="history-rename", size="sm", scale=1)
            with gr.Row():
                delete = gr.Button("Delete", elem_id="history-delete", size="sm", variant="stop")
                export = gr.Button("Export", elem_id="history-export", size="sm")
                load = gr.UploadButton(
                    "Import", file_types=[".json"], elem_id="history-import", size="sm", type="filepath"
                )
            download = gr.DownloadButton(
                "Download JSON", visible=False, elem_id="history-download", size="sm"
            )
            gr.Markdown(
                "Stored on this server for this browser (no account), deleted for good when you delete them.",
                elem_id="history-about",
            )
        chat, compare = self.chat, self.compare
        self.reopened = [
            chatbot,
            chat.model,
            chat.system,
            tabs,
            *compare.columns,
            compare.sent,
            compare.keys,
            compare.system,
            notice,
        ]
        saved_compare = compare.asked.then(
            self.save_compare, [visit, compare.keys, compare.system], [compare.notice], **PRIVATE
        )
        saved_compare.then(self.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
        for changed in chat.changed:
            inputs = [visit, chat.model, chat.system]
            saved = changed.then(self.save_chat, inputs, [chat.notice], show_progress="hidden", **PRIVATE)
            saved.then(self.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
        chat.cleared.then(self.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
        here = [visit, chat.model, chat.system]  # the open chat, stored before it is dropped
        opened = listed.input(self.reopen, [listed, *here], self.reopened, **PRIVATE)
        # A grid run reopens in the grid tab, which shows what the tab's grid now holds.
        opened.then(self.grid.shown, [visit], self.grid.restored, show_progress="hidden", **PRIVATE)
        opened.then(self.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
        renewed = new.click(self.new_chat, here, [chatbot, listed, notice], **PRIVATE)
        renewed.then(self.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
        rename.click(self.rename, [listed, title, visit], [title, notice], **PRIVATE).then(
            self.listing, [visit], [listed], show_progress="hidden", **PRIVATE
        )
        deleted = delete.click(self.delete, [listed, visit], [chatbot, notice], **PRIVATE)
        deleted.then(self.listing_unless_asked, [visit], [listed], show_progress="hidden", **PRIVATE)
        for event in (opened, renewed, deleted):  # the chat's edit controls, for its new chat
            chat.refreshes_after(event, visit)
        export.click(self.export, [listed, *here], [download, notice], **PRIVATE)
        imported = load.upload(self.import_file, [load, visit], [listed, notice], **PRIVATE)
        imported.then(self.listing, [visit], [listed], show_progress="hidden", **PRIVATE)
        return listed
