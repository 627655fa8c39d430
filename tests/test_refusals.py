"""Refusals a user can act on, without an engine: sampling values checked before they reach one,
an engine's or a server's validation messages turned into one line with the numbers, and text
that is not text refused."""

from __future__ import annotations

import pytest

from app.catalog.adapters import PromptError, to_turns
from app.catalog.cards import load_cards
from app.config import Settings
from app.engines.base import SamplingError, SamplingSettings, explain_refusal
from app.engines.manager import EngineManager

CARDS = load_cards()


@pytest.mark.parametrize(
    ("sampling", "line"),
    [
        (
            SamplingSettings(max_tokens=-1),
            "Max tokens is -1; it must be a whole number from 1 to 2,147,483,647",
        ),
        (SamplingSettings(temperature=float("nan")), "Temperature is nan; it must be from 0 to 2"),
        (SamplingSettings(temperature=2.5), "Temperature is 2.5; it must be from 0 to 2"),
        (SamplingSettings(top_p=0.0), "Top-p is 0.0; it must be above 0 and at most 1"),
        (SamplingSettings(seed=-3), "The seed is -3; it must be a whole number from 0 to"),
    ],
)
def test_sampling_out_of_range_is_refused_before_any_engine_is_asked(sampling, line):
    class NoFactory:
        def capacity(self):
            raise AssertionError("no engine may be asked")

        def memory_need(self, card):
            raise AssertionError("no engine may be asked")

        async def build(self, card, report, devices):
            raise AssertionError("no engine may be built")

    manager = EngineManager({"qwen2_vl": CARDS["qwen2_vl"]}, Settings(gpu_count=0), NoFactory())

    async def first_event():
        async for event in manager.stream("qwen2_vl", [{"role": "user", "content": "hi"}], sampling):
            return event

    import asyncio

    with pytest.raises(SamplingError) as refused:
        asyncio.run(first_event())
    assert str(refused.value).startswith(line) and str(refused.value).endswith("change it and send again.")
    SamplingSettings(temperature=0, top_p=1, max_tokens=1, seed=0).check()


@pytest.mark.parametrize(
    ("message", "line"),
    [
        (
            "This model's maximum context length is 4096 tokens. However, your request has 5012 input "
            "tokens. Please reduce the length of the input messages.",
            "The prompt is 5,012 tokens; Qwen2-VL 7B Instruct takes at most 4,096 (prompt plus answer): "
            "shorten it or start a new chat.",
        ),
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
            "(4000 in the messages, 1000 in the completion). Please reduce the length.",
            "The prompt is 4,000 tokens and the answer may take 1,000; Qwen2-VL 7B Instruct takes at "
            "most 4,096 (prompt plus answer): lower max tokens, shorten the prompt or start a new chat.",
        ),
        (
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
            "Temperature is -1.0; it must be from 0 to 2: change it and send again.",
        ),
        (
            "top_p must be in (0, 1], got 2.0.",
            "Top-p is 2.0; it must be above 0 and at most 1: change it and send again.",
        ),
    ],
)
def test_a_servers_validation_answer_becomes_the_same_line_as_the_local_engines(message, line):
    assert explain_refusal(CARDS["qwen2_vl"].display_name, message) == line


def test_a_lone_surrogate_is_refused_with_where_it_is():
    with pytest.raises(PromptError, match=r"^The message holds a broken character \(U\+DC80.* at position 3"):
        to_turns([{"role": "user", "content": "ab\udc80"}])
    with pytest.raises(PromptError, match=r"^The system prompt holds a broken character"):
        to_turns([{"role": "system", "content": "\ud800"}, {"role": "user", "content": "hi"}])
