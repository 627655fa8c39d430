"""The arena: its rules as properties (which pairs are drawn, the vote limit, nothing named
before the vote), then whole battles through the arena's handlers on the real engine with the
demo twins and a real SQLite database. The page itself is tested in Chromium
(`test_ui_views.py`)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image
from ui_pages import poll

from app.catalog.cards import ModelCard, load_cards
from app.config import Settings
from app.demo.models import DEMO_TWINS, SEEING_MODELS, with_demo_models
from app.domain.arena import (
    BLIND_FAILURE,
    BLIND_REFUSAL,
    VOTE_WINDOW_S,
    ArenaError,
    Battle,
    blind,
    check_rate,
    draw_pair,
    modality_of,
    pair_weights,
    retry_after_s,
)
from app.domain.conversation import Turn
from app.domain.replies import Reply
from app.domain.sessions import Visit
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory
from app.media.loading import VideoDecoderPool
from app.storage.history import History, VoteRecord, new_id, sqlite_url
from app.storage.votes import Vote, pair_of
from app.views import Playground
from app.views.arena import UNFINISHED, ArenaView
from app.views.leaderboard import LeaderboardView
from app.views.services import WARNING

MODELS = st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=2, max_size=8, unique=True)


# --- the rules -------------------------------------------------------------------------------


@given(models=MODELS, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_a_draw_is_two_different_models_of_the_pool_and_every_pair_can_be_drawn(models, data, seed):
    pairs = [pair_of(a, b) for i, a in enumerate(models) for b in models[i + 1 :]]
    votes = {pair: data.draw(st.integers(0, 1000)) for pair in pairs}
    a, b = draw_pair(models, votes, random.Random(seed))
    assert a != b and {a, b} <= set(models)
    weights = pair_weights(models, votes)
    assert set(weights) == set(pairs)
    # Fewer votes, more weight: the order of the weights is the reverse order of the votes.
    for p in pairs:
        for q in pairs:
            if votes[p] < votes[q]:
                assert weights[p] > weights[q]


def test_pairs_with_fewer_votes_are_drawn_more_often_and_sides_are_random():
    votes = {("m0", "m1"): 0, ("m0", "m2"): 9, ("m1", "m2"): 9}
    rng = random.Random(7)
    drawn = [draw_pair(["m0", "m1", "m2"], votes, rng) for _ in range(4000)]
    pairs = Counter(pair_of(*d) for d in drawn)
    # Weights 1, 0.1 and 0.1: the unvoted pair is drawn 1 / 1.2 of the time.
    assert pairs[("m0", "m1")] / len(drawn) == pytest.approx(1 / 1.2, abs=0.03)
    first = Counter(d[0] for d in drawn if pair_of(*d) == ("m0", "m1"))
    assert first["m0"] / sum(first.values()) == pytest.approx(0.5, abs=0.04)


def test_fewer_than_two_models_is_a_line_not_a_crash():
    with pytest.raises(ArenaError, match="needs two models"):
        draw_pair(["m0"], {}, random.Random(0))


@pytest.fixture(scope="module")
def cpu_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """What a machine without a GPU offers: the catalog and the demo models, as `python -m app` has."""

    def playground(**overrides: Any) -> Playground:
        settings = Settings(**{"gpu_count": 0, **overrides})
        cards = with_demo_models(load_cards(), settings)
        return Playground(EngineManager(cards, settings, VllmEngineFactory(settings)), settings, decoder)

    decoder = VideoDecoderPool(workers=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield playground
    decoder.close()


def test_on_a_cpu_box_the_arena_and_compare_offer_the_two_trained_models_not_the_twins(cpu_box):
    """The arena pitted the seeing model against a twin answering in noise: nothing to judge."""
    playground = cpu_box()
    assert set(DEMO_TWINS) <= set(playground.served_models())
    assert ArenaView(playground, None).pool == list(SEEING_MODELS)
    assert playground.compare_picks() == list(SEEING_MODELS)
    # Named by the operator, twins battle; where every model has random weights, all do.
    named = cpu_box(arena_models=("demo_qwen2_vl", "demo_llava"))
    assert set(ArenaView(named, None).pool) == {"demo_qwen2_vl", "demo_llava"}
    noise = cpu_box(load_format="dummy")
    assert ArenaView(noise, None).pool == noise.served_models()
    # A GPU box, even with the demo models asked for, picks nothing for the visitor.
    gpu_box = cpu_box(gpu_count=1, demo_models=True)
    assert set(SEEING_MODELS) <= set(gpu_box.served_models()) and gpu_box.compare_picks() == []


@pytest.mark.parametrize(
    ("images", "videos", "modality"),
    [(0, 0, "text"), (1, 0, "image"), (3, 0, "images"), (2, 1, "video"), (0, 1, "video")],
)
def test_a_battles_modality_counts_every_file_of_every_turn(images, videos, modality):
    assert modality_of(images, videos) == modality


@given(
    times=st.lists(st.floats(0, 2 * VOTE_WINDOW_S, allow_nan=False), max_size=12),
    limit=st.integers(1, 6),
)
def test_a_browser_votes_at_most_the_limit_in_any_hour(times, limit):
    now = 2 * VOTE_WINDOW_S
    recent = [t for t in times if t > now - VOTE_WINDOW_S]
    wait = retry_after_s(times, limit, now)
    if len(recent) < limit:
        assert wait == 0
        check_rate(times, limit, now)
    else:
        assert wait > 0
        with pytest.raises(ArenaError, match=f"cast {limit} votes in the last hour"):
            check_rate(times, limit, now)
        # Once that long has passed, the window holds one vote fewer than the limit.
        later = now + wait + 1e-6
        assert retry_after_s(times, limit, later) == 0
        assert len([t for t in times if t > later - VOTE_WINDOW_S]) < limit


@given(
    names=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4, unique=True),
    filler=st.text(max_size=20),
)
def test_blind_lines_name_no_model(names, filler):
    line = filler.join([*names, *reversed(names)])
    hidden = blind(line, {name: "A" for name in names})
    # Every name, even one inside another, is gone: only what "Model A" is made of can remain.
    for name in names:
        assert name not in hidden or name in "Model A"


# --- battles on the real engine ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def arena(
    loop, tiny_cards: dict[str, ModelCard], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ArenaView, LeaderboardView, History, Clock]]:
    settings = Settings(
        gpu_count=0,
        arena_models=("tiny-a", "tiny-b"),
        arena_votes_per_hour=3,
        arena_votes_per_address_per_hour=5,
    )
    manager = EngineManager(tiny_cards, settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool(workers=1)
    folder, clock = tmp_path_factory.mktemp("arena"), Clock()
    history = History(sqlite_url(folder), folder / "media", clock=clock)
    playground = Playground(manager, settings, decoder, history)
    yield (
        ArenaView(playground, history, random.Random(3)),
        LeaderboardView(playground, history),
        history,
        clock,
    )
    loop.run(manager.close())
    history.close()
    decoder.close()


async def collect(updates: AsyncIterator[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [update async for update in updates]


def every_name(view: ArenaView) -> set[str]:
    cards = [view.playground.choices[key].card for key in ("tiny-a", "tiny-b")]
    return {name for card in cards for name in (card.key, card.display_name, card.source)}


def shown(update: tuple[Any, ...]) -> str:
    """What a handler's update puts on the page, as text (chat messages, heads, notices)."""
    return " ".join(str(getattr(part, "value", part)) for part in update)


def test_a_battle_of_two_turns_is_blind_until_the_vote_then_named_and_counted(loop, arena, tmp_path: Path):
    view, board, history, _ = arena
    visit = Visit(browser_id="browser-1")
    picture = tmp_path / "red.png"
    Image.new("RGB", (64, 48), "red").save(picture)
    first = loop.run(collect(view.ask({"text": "What colour is it?", "files": [str(picture)]}, visit)))
    second = loop.run(collect(view.ask({"text": "Say it again.", "files": []}, visit)))
    battle = visit.battle
    assert battle is not None and set(battle.keys) == {"tiny-a", "tiny-b"}
    names = every_name(view)
    for update in first + second:
        assert not any(name in shown(update) for name in names), shown(update)
    turns = visit.arena.turns
    assert len(turns) == 2 and all(column.state == "done" for turn in turns for column in turn.columns)
    # Each side's second prompt replays its own first answer, never the other side's.
    for side, other in ((0, 1), (1, 0)):
        mine, theirs = turns[0].columns[side].answer.strip(), turns[0].columns[other].answer.strip()
        assert turns[1].columns[side].key == battle.keys[side]
        assert mine in turns[1].columns[side].prompt
        if theirs and theirs not in mine:
            assert theirs not in turns[1].columns[side].prompt
    restored = view.resumed(visit)  # a reload shows the vote buttons, and no line
    assert restored[4] == "" and restored[5].visible
    # The vote stores the battle and shows the names; a second vote on it is refused.
    heads_a, heads_b, notice, _, revealed, reason = loop.run(view.vote("a", "  clearer  ", visit))
    display = {key: view.playground.choices[key].card.display_name for key in battle.keys}
    assert notice == "" and display[battle.keys[0]] in heads_a and display[battle.keys[1]] in heads_b
    assert f"**Model A** was **{display[battle.keys[0]]}**" in revealed and reason == ""
    assert history.votes() == [Vote(*battle.keys, "a")]
    assert history.votes("image") == [Vote(*battle.keys, "a")] and history.votes("text") == []
    again = loop.run(view.vote("b", "", visit))
    assert "has had its vote" in again[2] and history.votes() == [Vote(*battle.keys, "a")]
    # The leaderboard counts it: the winner first, one vote each.
    table = loop.run(board.board("all"))
    assert table["votes"] == 1 and [row["model"] for row in table["rows"]] == list(battle.keys)
    assert [row["votes"] for row in table["rows"]] == [1, 1] and table["rows"][0]["win_rate"] == 1.0
    assert loop.run(board.board("video"))["rows"] == []


def test_a_battle_past_the_models_picture_limit_leaves_the_oldest_out_and_goes_on_blind(
    loop, arena, tmp_path: Path
):
    """Five pictures over three turns, where both models take four per prompt: the battle does
    not dead-end; each side's prompt leaves the oldest out with a marker in its place, and the
    page is told nothing of it (which pictures a model sees would tell the models apart)."""
    view, _, _, _ = arena
    visit = Visit(browser_id="browser-many-pictures")
    colours = ["red", "green", "blue", "yellow", "purple"]
    pictures = []
    for colour in colours:
        pictures.append(tmp_path / f"{colour}-picture.png")
        Image.new("RGB", (64, 48), colour).save(pictures[-1])
    updates = []
    turns = (("These two?", pictures[:2]), ("And these?", pictures[2:4]), ("This one?", pictures[4:]))
    for text, files in turns:
        updates += loop.run(collect(view.ask({"text": text, "files": [str(f) for f in files]}, visit)))
    last = visit.arena.turns[-1].columns
    assert len(visit.arena.turns) == 3 and [column.state for column in last] == ["done", "done"]
    for column in last:
        assert column.prompt.count("[an earlier picture was here") == 1, column.prompt
    for update in updates:
        assert "was here" not in shown(update) and "red-picture" not in shown(update)


def test_votes_beyond_the_hourly_limit_are_refused_in_one_line_until_the_hour_has_passed(loop, arena):
    view, _, history, clock = arena
    visit = Visit(browser_id="browser-2")
    earlier = [
        VoteRecord(
            battle_id=new_id(),
            browser_id="browser-2",
            model_a="tiny-a",
            model_b="tiny-b",
            outcome="tie",
            modality="text",
        )
        for _ in range(3)
    ]
    history.add_votes(earlier)  # the limit is 3 an hour
    loop.run(collect(view.ask({"text": "Hello.", "files": []}, visit)))
    before = len(history.votes())
    notice = loop.run(view.vote("tie", "", visit))[2]
    assert "cast 3 votes in the last hour" in notice and "vote again in about 60 minutes" in notice
    assert len(history.votes()) == before and not visit.battle.revealed
    clock.now += VOTE_WINDOW_S + 1
    assert loop.run(view.vote("tie", "", visit))[2] == ""
    assert len(history.votes()) == before + 1 and visit.battle.revealed


def test_a_message_only_one_model_takes_starts_no_battle_and_says_why_without_names(loop, arena):
    view, *_ = arena
    visit = Visit(browser_id="browser-3")
    clip = Path(__file__).resolve().parent.parent / "static" / "examples" / "colour_change.mp4"
    (update,) = loop.run(collect(view.ask({"text": "What happens?", "files": [str(clip)]}, visit)))
    notice = update[5]
    # The LLaVA twin takes no video: the pool of two has one model for it.
    assert "needs two models that take this message's files; this server has 1" in notice
    assert not any(name in shown(update) for name in every_name(view)) and visit.battle is None
    # The message stays in the box to change.
    assert update[4].value["text"] == "What happens?"


def test_voting_before_any_answer_or_mid_battle_is_refused(loop, arena):
    view, *_ = arena
    visit = Visit(browser_id="browser-4")
    assert "Send a message first" in loop.run(view.vote("a", "", visit))[2]


def test_until_the_vote_both_sides_refuse_in_the_same_words_and_show_no_timings(loop, arena, tmp_path: Path):
    """What a side takes, its context, its token counts and speed fingerprint its model: none of
    it shows before the vote; the names, counts and speeds show after it."""
    view, *_ = arena
    visit = Visit(browser_id="browser-5")
    picture = tmp_path / "blue.png"
    Image.new("RGB", (64, 48), "blue").save(picture)
    updates = loop.run(collect(view.ask({"text": "What colour is it?", "files": [str(picture)]}, visit)))
    heads = updates[-1][2:4]
    assert all("done" in head for head in heads), heads
    assert not any("tok/s" in head or "tokens" in head for update in updates for head in update[2:4])
    # A clip: the LLaVA twin takes none, and the Qwen2-VL twin does; the line names neither side.
    clip = Path(__file__).resolve().parent.parent / "static" / "examples" / "colour_change.mp4"
    (refused,) = loop.run(collect(view.ask({"text": "And this?", "files": [str(clip)]}, visit)))
    assert refused[5] == WARNING + BLIND_REFUSAL
    for words in ("video", "image", "Model A", "Model B"):
        assert words not in refused[5]
    heads_a, heads_b, notice, *_ = loop.run(view.vote("tie", "", visit))
    assert notice == "" and "tok/s" in heads_a and "tok/s" in heads_b


def test_a_battle_whose_answer_was_stopped_or_failed_takes_no_vote_and_the_next_message_starts_another(
    loop, arena
):
    """The refusal says the next message starts the next battle, and it does (it went on with
    the unfinished battle, which refused every later vote too)."""
    view, _, history, _ = arena
    for ending in ("stopped", "failed"):
        visit = Visit(browser_id=f"browser-{ending}")
        loop.run(collect(view.ask({"text": "Hello.", "files": []}, visit)))
        visit.arena.turns[-1].columns[1].state = ending  # as the stop button, or a failure, leaves it
        before, unfinished = len(history.votes()), visit.battle
        notice = loop.run(view.vote("a", "", visit))[2]
        assert "only when both answers finish" in notice and "start the next battle" in notice
        assert len(history.votes()) == before and unfinished is not None and not unfinished.revealed
        restored = view.resumed(visit)  # after a reload: no vote buttons, and the line says why
        assert restored[4] == UNFINISHED and not restored[5].visible
        loop.run(collect(view.ask({"text": "Hello again.", "files": []}, visit)))
        assert visit.battle is not unfinished and len(visit.arena.turns) == 1
        assert loop.run(view.vote("a", "", visit))[2] == "" and len(history.votes()) == before + 1


def test_a_message_both_models_fail_on_goes_back_to_the_box_with_a_blind_line(loop, arena):
    """Both sides fail (a text past either model's context): nothing is left to vote on, so the
    turn is taken back, the message goes back to the box to change, and the line names no model."""
    view, _, history, _ = arena
    visit = Visit(browser_id="browser-both-fail")
    text = "A long question. " * 5_000  # past both contexts, within the length a message takes
    updates = loop.run(collect(view.ask({"text": text, "files": []}, visit)))
    last = updates[-1]
    assert last[5] == WARNING + BLIND_FAILURE
    assert last[4].value["text"] == text
    assert visit.arena.turns == [] and "arena" not in visit.sent
    for update in updates:
        assert not any(name in shown(update) for name in every_name(view)), shown(update)
    before = len(history.votes())
    assert "Send a message first" in loop.run(view.vote("a", "", visit))[2]
    assert len(history.votes()) == before
    # The battle goes on: the next message is answered by both, and takes a vote.
    loop.run(collect(view.ask({"text": "Hello.", "files": []}, visit)))
    assert [column.state for column in visit.arena.turns[-1].columns] == ["done", "done"]
    # Both fail on a later turn: the line, and the earlier turn's vote buttons back (the first
    # update hid them, and they stayed hidden).
    again = loop.run(collect(view.ask({"text": text, "files": []}, visit)))[-1]
    assert again[5] == WARNING + BLIND_FAILURE and again[6].visible and len(visit.arena.turns) == 1


def test_new_battle_pressed_mid_answer_ends_the_answers_and_offers_no_vote(loop, arena):
    """ "New battle" (or a side's trash icon) while both answer: the answers end, and the asking
    handler's last update leaves the emptied page alone (it showed vote buttons for the battle
    that was no more)."""
    view, *_ = arena
    visit = Visit(browser_id="browser-new-battle-mid-answer")

    async def new_battle_after_the_first_update() -> list[tuple[Any, ...]]:
        updates = []
        async for update in view.ask({"text": "Tell me a story.", "files": []}, visit):
            if not updates:
                view.new_battle(visit)
            updates.append(update)
        return updates

    last = loop.run(new_battle_after_the_first_update())[-1]
    assert not (isinstance(last[6], gr.Column) and last[6].visible)
    assert visit.battle is None and visit.arena.turns == []
    manager = view.playground.manager  # (it takes the abort on its own loop)
    poll(lambda: not any(manager.unfinished_requests(key) for key in ("tiny-a", "tiny-b")), 10)


def finished_battle(view: ArenaView, browser: str, address: str, keys: tuple[str, str]) -> Visit:
    """What a battle leaves once both answers finished: two done columns (no engine needed for
    what is tested here, the vote's limits)."""
    visit = Visit(browser_id=browser, address=address)
    visit.battle = Battle(keys)
    turn = Turn(text="Which is better?")
    turn.columns = [Reply(key, key, "", answer="an answer", state="done", prompt_tokens=9) for key in keys]
    visit.arena.turns.append(turn)
    return visit


def test_a_script_with_fifty_fresh_identities_from_one_address_does_not_change_the_order(
    loop, arena, tmp_path: Path
):
    view, board, _, clock = arena
    clock.now += 10 * VOTE_WINDOW_S  # other tests' votes are out of every window
    before = {row["model"]: row for row in loop.run(board.board("all"))["rows"]}
    honest = [("tiny-a", "tiny-b", "a")] * 14 + [("tiny-a", "tiny-b", "b")] * 6
    for index, (a, b, outcome) in enumerate(honest):
        visit = finished_battle(view, new_id(), f"198.51.100.{index}", (a, b))
        assert loop.run(view.vote(outcome, "", visit))[2] == ""
    order = [row["model"] for row in loop.run(board.board("all"))["rows"]]
    refused = 0
    for _ in range(50):  # a new identity every time, one address: for tiny-b
        visit = finished_battle(view, new_id(), "203.0.113.7", ("tiny-a", "tiny-b"))
        refused += "Visitors at your address" in loop.run(view.vote("b", "", visit))[2]
    assert refused == 45  # five an hour from one address
    after = loop.run(board.board("all"))
    assert [row["model"] for row in after["rows"]] == order == ["tiny-a", "tiny-b"]
    assert after["votes"] - sum(row["votes"] for row in before.values()) // 2 == 25
