"""The arena tab: a blind battle. Two models drawn from the operator's pool answer each message
side by side as A and B; the user talks with both for as many turns as they like, votes, and
only then sees the names. Votes go to the database (`app.storage.history`) for the leaderboard.

Every handler takes the tab's `Visit` and changes only its `arena` session and `battle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr

from app.catalog.cards import ModelCard
from app.domain import compare
from app.domain.arena import (
    BLIND_FAILURE,
    BLIND_REFUSAL,
    SIDES,
    VERDICTS,
    VOTE_WINDOW_S,
    ArenaError,
    Battle,
    blind,
    blind_state,
    check_rate,
    draw_pair,
    finished,
    modality_of,
)
from app.domain.compare import Comparison
from app.domain.conversation import ConversationError, Session, Turn, check_media, make_turn, user_message
from app.domain.replies import Reply
from app.domain.sessions import Visit
from app.engines.base import SamplingSettings
from app.storage.history import History, VoteRecord
from app.storage.votes import OUTCOMES, Outcome
from app.views.chat import NO_VISIT, PRIVATE
from app.views.services import WARNING, Playground
from app.views.widgets import ExampleShelves, box_idle, box_streaming, forget_sent, message_box, settled_box

INTRO = (
    "Two anonymous models answer your message side by side. Go on for as many turns as you like, "
    "then vote: the names are shown after your vote. Each model uses its own default sampling."
)
NEXT = "Send a message to start the next battle, with two models drawn again."
UNFINISHED = f"A battle takes a vote only when both answers finish. {NEXT}"


def answers(session: Session) -> list[Reply]:
    """Both sides' answers of every turn of a battle."""
    return [column for turn in session.turns for column in turn.columns]


class ArenaView:
    def __init__(self, playground: Playground, history: History, rng: random.Random | None = None) -> None:
        self.playground = playground
        self.history = history
        self.rng = rng or random.SystemRandom()

    @property
    def pool(self) -> list[str]:
        """The models battles are drawn from: the operator's list, else every model served here
        but those with random weights (a battle between noise tells a voter nothing), unless
        fewer than two others are left."""
        chosen = self.playground.settings.arena_models
        served = self.playground.served_models()
        if chosen:
            return [key for key in served if key in chosen]
        meaningful = [key for key in served if not self.playground.random_weights(key)]
        return meaningful if len(meaningful) >= 2 else served

    # --- handlers ----------------------------------------------------------------------------

    async def ask(self, message: dict[str, Any], visit: Visit | None) -> AsyncIterator[tuple[Any, ...]]:
        """A message for both sides: a new battle when none is on (or the last one had its vote),
        then the two answers streamed side by side (the scheduler may make one side wait)."""
        text, files = message.get("text") or "", list(message.get("files") or [])
        forget_sent(visit, "arena")  # an earlier message's, whose end never came
        session = visit.arena if visit is not None else Session()
        names: dict[str, str] = {}
        held = contextlib.ExitStack()  # the visitor's allowance, while the answers run
        try:
            if visit is None:
                raise ConversationError(NO_VISIT)
            held.enter_context(self.playground.allowance.held(visit))
            if visit.battle is None or visit.battle.revealed or not finished(answers(session)):
                session.close()
                visit.battle = None
                visit.battle = await self.draw(files)
            battle = visit.battle
            names = self.names(battle)
            cards = [self.playground.servable(key) for key in battle.keys]
            for card in cards:
                try:
                    check_media(card, files)
                except ConversationError:
                    raise ArenaError(BLIND_REFUSAL) from None
            turn, clip = await make_turn(session, text, files, self.playground.decoder, cards[0].video_frames)
        except Exception as error:
            held.close()
            yield (
                *self.view(visit),
                box_idle(value=message),
                blind_refusal(error, names),
                gr.skip(),
                gr.skip(),
            )
            return
        except BaseException:  # cancelled while it was prepared: the place back now
            held.close()
            raise
        earlier = list(session.turns)

        async def messages_for(card: ModelCard) -> list[dict[str, Any]]:
            side = battle.keys.index(card.key)
            # Each side's own earlier answers are replayed to it, never the other side's.
            turns = [replace(t, reply=t.columns[side]) for t in earlier] + [turn]
            same_frames = clip is not None and card.video_frames == cards[0].video_frames
            # Earlier pictures a side can no longer see are left out silently: a notice would
            # tell its limits, and so the model, before the vote.
            prompt = await self.playground.prompt_for(
                card, turns, "", {turn.video: clip} if same_frames else None
            )
            return prompt.messages

        comparison = Comparison(text, [Path(f).name for f in files], "", SamplingSettings())
        session.turns.append(turn)
        visit.sent["arena"] = message
        session.stop_requested = False
        # The first update hides the vote (until both answers end) and the last battle's names.
        first: tuple[Any, ...] = (box_streaming(value=None), "", gr.Column(visible=False), "")
        with held:
            async with contextlib.aclosing(
                compare.run(self.playground.manager, comparison, cards, messages_for, media=turn.media)
            ) as run:
                async for update in run:
                    turn.columns = update.columns
                    yield *self.view(visit), *first
                    first = (gr.skip(), "", gr.skip(), gr.skip())
                    if session.stop_requested:
                        break
        turn.columns = comparison.columns
        if visit.battle is not battle or not any(t is turn for t in session.turns):
            # "New battle" or a trash icon ended this one meanwhile: the page shows the next.
            yield *(gr.skip(),) * 4, box_idle(), gr.skip(), gr.skip(), gr.skip()
            return
        box, notice = box_idle(), ""
        both_failed = all(column.state == "failed" for column in turn.columns)
        if both_failed:
            session.turns.remove(turn)  # nothing to vote on: the message goes back to the box
            forget_sent(visit, "arena")
            box, notice = box_idle(value=message), WARNING + BLIND_FAILURE
        # (After a turn both sides failed, an earlier turn's vote buttons come back.)
        votable = bool(session.turns) and finished(answers(session))
        if not both_failed and not votable:  # stopped, or one side failed: no buttons that would refuse
            notice = UNFINISHED
        votes = gr.Column(visible=votable)
        yield *self.view(visit), box, notice, votes, gr.skip()

    def voter(self, outcome: Outcome) -> Callable[[str, Visit | None], Awaitable[tuple[Any, ...]]]:
        async def vote(reason: str, visit: Visit | None) -> tuple[Any, ...]:
            return await self.vote(outcome, reason, visit)

        return vote

    async def vote(self, outcome: Outcome, reason: str, visit: Visit | None) -> tuple[Any, ...]:
        """Stores the vote (within the browser's hourly limit), then shows the names."""
        battle = visit.battle if visit is not None else None
        try:
            if visit is None:
                raise ConversationError(NO_VISIT)
            if self.playground.settings.arena_signed_in_only and visit.account is None:
                # An anonymous id is free to make; an account is not.
                raise ArenaError("Sign in to vote: this arena counts votes from signed-in visitors only.")
            if battle is None or not visit.arena.turns:
                raise ArenaError("Send a message first: both models answer it, then you vote.")
            if battle.revealed:
                raise ArenaError(f"This battle has had its vote. {NEXT}")
            if not all(column.ended for column in answers(visit.arena)):
                raise ArenaError("Wait for both answers to end, then vote.")
            if not finished(answers(visit.arena)):
                raise ArenaError(UNFINISHED)
            battle.outcome = outcome  # before any await: a second click finds the vote cast
            try:
                await self.store(visit, battle, outcome, reason)
            except Exception:
                battle.outcome = None
                raise
        except Exception as error:
            return *self.heads(visit), WARNING + user_message(error), gr.skip(), gr.skip(), gr.skip()
        return *self.heads(visit), "", gr.Column(visible=False), reveal(battle, self.playground), ""

    async def store(self, visit: Visit, battle: Battle, outcome: Outcome, reason: str) -> None:
        """Stores the vote within the limits of its visitor (the server-issued id) and of its
        client address, checked and stored in one step."""
        history, settings = self.history, self.playground.settings
        now = history.clock()

        def within_limits(by_browser: list[float], by_client: list[float]) -> None:
            check_rate(by_browser, settings.arena_votes_per_hour, now)
            check_rate(
                by_client, settings.arena_votes_per_address_per_hour, now, "Visitors at your address have"
            )

        turns = visit.arena.turns
        record = VoteRecord(
            battle_id=battle.id,
            browser_id=visit.browser_id,
            model_a=battle.keys[0],
            model_b=battle.keys[1],
            outcome=outcome,
            reason=reason.strip()[:500],
            modality=modality_of(sum(len(t.images) for t in turns), sum(t.video is not None for t in turns)),
            prompt_tokens=max(column.prompt_tokens for column in turns[-1].columns),
            client=self.playground.identity.address_key(visit.address) if visit.address else "",
        )
        await asyncio.to_thread(history.add_vote_checked, record, now - VOTE_WINDOW_S, within_limits)

    def new_battle(self, visit: Visit | None) -> tuple[Any, ...]:
        if visit is not None:
            visit.arena.stop_requested = True  # an answer still streaming ends with its battle
            visit.arena.close()
            visit.battle = None
        return *self.view(visit), box_idle(value=None), "", gr.Column(visible=False), ""

    def stop(self, visit: Visit | None) -> None:
        if visit is not None:
            visit.arena.stop_requested = True

    def resumed(self, visit: Visit | None) -> tuple[Any, ...]:
        """After a (re)load: the battle as it was, and the vote buttons if it awaits a vote, else
        the line saying why not where an answer was stopped or failed (a reload mid-answer stops
        it: Gradio ends the handler of a page that goes)."""
        battle = visit.battle if visit is not None else None
        session = visit.arena if visit is not None else Session()
        open_battle = battle is not None and not battle.revealed and bool(session.turns)
        awaiting = open_battle and finished(answers(session))
        notice = UNFINISHED if open_battle and not awaiting else ""
        shown = reveal(battle, self.playground) if battle is not None and battle.revealed else ""
        return *self.view(visit), notice, gr.Column(visible=awaiting), shown

    # --- what the handlers share ----------------------------------------------------------------

    async def draw(self, files: list[str]) -> Battle:
        """A new battle between two models of the pool that both take `files`."""
        takers = []
        for key in self.pool:
            card = self.playground.choices[key].card
            with contextlib.suppress(ConversationError):
                check_media(card, files)
                takers.append(key)
        if len(takers) < 2:
            what = "this message's files" if files else "a message"
            raise ArenaError(f"The arena needs two models that take {what}; this server has {len(takers)}.")
        pairs = await asyncio.to_thread(self.history.pair_votes)
        return Battle(draw_pair(takers, pairs, self.rng))

    def names(self, battle: Battle) -> dict[str, str]:
        """Every way a battle's models could be named in a line the user sees -> its side."""
        named: dict[str, str] = {}
        for side, key in zip(SIDES, battle.keys, strict=True):
            card = self.playground.choices[key].card
            named.update({key: side, card.display_name: side, card.source: side})
        return named

    def view(self, visit: Visit | None) -> tuple[Any, ...]:
        """Both sides' conversations and their heads."""
        battle = visit.battle if visit is not None else None
        turns = visit.arena.turns if visit is not None else []
        names = self.names(battle) if battle is not None else {}
        chats = [side_conversation(turns, index, battle, names) for index in range(2)]
        return *chats, *self.heads(visit)

    def heads(self, visit: Visit | None) -> tuple[str, str]:
        battle = visit.battle if visit is not None else None
        turns = visit.arena.turns if visit is not None else []
        heads = []
        for index, side in enumerate(SIDES):
            title = f"### Model {side}"
            if battle is not None and battle.revealed:
                title += f": {self.playground.choices[battle.keys[index]].card.display_name}"
            last = turns[-1].columns[index] if turns and turns[-1].columns else None
            revealed = battle is not None and battle.revealed
            heads.append(f"{title}\n{blind_state(last, revealed)}" if last is not None else title)
        return heads[0], heads[1]

    # --- layout ------------------------------------------------------------------------------

    def layout(self, visit: gr.State) -> list[Any]:
        """The tab; returns what a page load restores. `self.voted` holds the vote events' `then`
        (the page chains the leaderboard's refresh to them)."""
        gr.Markdown(INTRO)
        notice = gr.Markdown(elem_id="arena-notice")
        chats, heads = [], []
        with gr.Row():
            for side in SIDES:
                with gr.Column(min_width=260):
                    heads.append(gr.Markdown(f"### Model {side}", elem_id=f"arena-head-{side.lower()}"))
                    chats.append(
                        gr.Chatbot(
                            elem_id=f"arena-{side.lower()}",
                            height=380,
                            label=f"Model {side}",
                            show_label=False,
                            buttons=["copy"],
                        )
                    )
        with gr.Column(visible=False, elem_id="arena-votes") as votes:
            with gr.Row():
                buttons = {o: gr.Button(VERDICTS[o], elem_id=f"arena-vote-{o}", size="sm") for o in OUTCOMES}
            reason = gr.Textbox(
                label="Why? (optional; stored with your vote)", max_length=500, elem_id="arena-reason"
            )
        shown = gr.Markdown(elem_id="arena-reveal")
        self.box = box = message_box("arena-input", "A message for both models (text, images or a clip)")
        # The examples two models a battle may draw can answer (a battle draws two that take the
        # message's files; on a GPU box some models take no pictures at all).
        pool = [self.playground.choices[key].card for key in self.pool]
        ExampleShelves(box, [pool], pool, "arena-examples", enough=2)
        new = gr.Button("New battle", elem_id="arena-new", size="sm")
        asked = box.submit(
            self.ask,
            [box, visit],
            [*chats, *heads, box, notice, votes, shown],
            show_progress="hidden",
            **PRIVATE,
        )
        asked.then(settled_box("arena"), [box, visit], [box], show_progress="hidden", queue=False, **PRIVATE)
        box.stop(self.stop, [visit], None, concurrency_limit=None, **PRIVATE)
        self.voted = [
            button.click(
                self.voter(outcome), [reason, visit], [*heads, notice, votes, shown, reason], **PRIVATE
            ).then
            for outcome, button in buttons.items()
        ]
        # Each side's own trash icon ends the battle too: an emptied side must not hide one that
        # still runs on (and would reappear with the next answer).
        triggers = [new.click, *(chat.clear for chat in chats)]
        gr.on(triggers, self.new_battle, [visit], [*chats, *heads, box, notice, votes, shown], **PRIVATE)
        self.restored = [*chats, *heads, notice, votes, shown]
        return self.restored


def side_conversation(
    turns: list[Turn], index: int, battle: Battle | None, names: dict[str, str]
) -> list[dict[str, Any]]:
    """One side's conversation as its Chatbot shows it; no model's name until the vote."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        messages += [{"role": "user", "content": {"path": str(path)}} for path in turn.files]
        if turn.text:
            messages.append({"role": "user", "content": turn.text})
        if index >= len(turn.columns):
            continue
        reply: Reply = turn.columns[index]
        if reply.answer:
            messages.append({"role": "assistant", "content": reply.answer})
        elif reply.state == "failed":
            shown = blind(reply.error, names) if battle is not None and battle.revealed else BLIND_FAILURE
            messages.append({"role": "assistant", "content": WARNING + shown})
        elif not reply.ended:
            messages.append({"role": "assistant", "content": f"Model {SIDES[index]}: {blind_state(reply)}"})
    return messages


def blind_refusal(error: Exception, names: dict[str, str]) -> str:
    return WARNING + blind(user_message(error), names)


def reveal(battle: Battle | None, playground: Playground) -> str:
    if battle is None or battle.outcome is None:
        return ""
    a, b = (playground.choices[key].card.display_name for key in battle.keys)
    return (
        f"**Model A** was **{a}**; **Model B** was **{b}**. Your vote: *{VERDICTS[battle.outcome]}*, "
        f"counted on the leaderboard. {NEXT}"
    )
