"""Comparisons: who runs side by side and who waits, and what an export holds."""

from __future__ import annotations

import functools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.compare import Column, Comparison, export_name, to_json, to_markdown
from app.engines.base import SamplingSettings


def test_exports_hold_prompts_repositories_settings_answers_and_timings():
    comparison = Comparison("Which is bigger?", ["shapes.png"], "Be brief.", SamplingSettings(seed=3))
    comparison.columns = [
        Column(
            "a",
            "Model A",
            "org/a @ abc123",
            state="done",
            answer="The circle.",
            prompt="<p>A</p>",
            prompt_tokens=80,
            completion_tokens=4,
            ttft_s=0.05,
            tokens_per_s=70.0,
        ),
        Column("b", "Model B", "org/b", state="failed", error="Model B could not be loaded: no GPU"),
    ]
    data = json.loads(to_json(comparison))
    assert data["sampling"]["seed"] == 3 and data["system"] == "Be brief."
    assert [c["source"] for c in data["columns"]] == ["org/a @ abc123", "org/b"]
    assert data["columns"][0]["prompt"] == "<p>A</p>"
    markdown = to_markdown(comparison)
    assert "## Model A" in markdown and "- Model: org/a @ abc123" in markdown
    assert "Time to first token: n/a" in markdown.split("## Model B")[1]
    assert "0.05 s" in markdown and "70.0" in markdown and "The circle." in markdown
    assert "failed: Model B could not be loaded: no GPU" in markdown


def test_the_markdown_export_reads_as_text_not_python_and_fences_what_it_quotes():
    """It wrote "seed None", "System prompt: ''" and answers outside any code block."""
    comparison = Comparison(
        "Is it ```code```?", [], "", SamplingSettings(temperature=0.7, top_p=1.0, max_tokens=8)
    )
    comparison.started = "2026-11-22T05:46:03+00:00"
    comparison.columns = [Column("qwen2_vl", "Qwen2-VL", "Qwen/Qwen2-VL-7B-Instruct", state="done")]
    comparison.columns[0].answer = "# Not a heading\n```\nstill the answer"
    markdown = to_markdown(comparison)
    assert "seed random" in markdown and "None" not in markdown and "''" not in markdown
    assert "System prompt:\n\n(none)" in markdown
    # The answer and the input sit in fences longer than any backtick run they hold.
    assert "````text\n# Not a heading\n```\nstill the answer\n````" in markdown
    assert "````text\nIs it ```code```?\n````" in markdown
    assert export_name(comparison) == "comparison-20261122T054603-qwen2_vl"


def test_stopping_a_comparison_marks_the_columns_that_had_not_ended_as_stopped():
    """Stop left them at "loading… (1 s of about 13 s)" forever, and the export said so."""
    import asyncio

    from app.catalog.cards import load_cards
    from app.domain.compare import run
    from app.engines.base import ModelState, ModelStatus

    class NeverReady:
        """The manager's `stream` for models that stay loading until the stream is closed."""

        async def stream(self, key, messages, sampling):
            yield ModelStatus(key, ModelState.LOADING, "starting", elapsed_s=1, estimate_s=13)
            await asyncio.Event().wait()

    async def messages_for(card):
        return []

    async def stop_while_loading() -> Comparison:
        comparison = Comparison("hi", [], "", SamplingSettings())
        cards = load_cards()
        two = [cards["qwen2_vl"], cards["llava"]]
        updates = run(NeverReady(), comparison, two, messages_for, refresh_s=0.01)
        async for update in updates:
            if all(column.state.startswith("loading") for column in update.columns):
                break
        await updates.aclose()
        return comparison

    comparison = asyncio.run(stop_while_loading())
    assert [column.state for column in comparison.columns] == ["stopped", "stopped"]
    assert json.loads(to_json(comparison))["columns"][0]["state"] == "stopped"


@functools.cache
def four_cards() -> list[Any]:
    from app.catalog.cards import load_cards

    return list(load_cards().values())[:4]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.005, 0.02]), min_size=2, max_size=4))
def test_the_columns_requests_reach_the_scheduler_in_column_order_whichever_is_prepared_first(delays):
    """Models that do not fit together answer in turn, first column first: each request must join
    the scheduler's line in column order. A conversation is prepared in a thread (its prompt
    counted), so a later column's could be ready first; under load the second column answered
    first, and a test holding the first column's answer waited on it for ever."""
    import asyncio
    import time

    from app.domain.compare import run
    from app.engines.base import StreamEnd

    cards = four_cards()[: len(delays)]
    arrived: list[str] = []

    class InLine:
        """The manager's `stream`, noting the order in which requests join its line."""

        async def stream(self, key, messages, sampling):
            arrived.append(key)
            yield StreamEnd(prompt_tokens=1, completion_tokens=0, finish_reason="stop")

    async def messages_for(card):
        await asyncio.to_thread(time.sleep, delays[cards.index(card)])
        return []

    async def compare() -> None:
        comparison = Comparison("hi", [], "", SamplingSettings())
        async for _ in run(InLine(), comparison, cards, messages_for, refresh_s=0.01):
            pass

    asyncio.run(compare())
    assert arrived == [card.key for card in cards]
