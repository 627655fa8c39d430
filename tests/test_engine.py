"""The engine manager on the real vLLM engine (CPU), serving the two demo twins.

Random weights print nonsense, so the tests assert on what the pipeline controls: token counts
(`ignore_eos`), finish reasons, prompt sizes, states, processes and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from clips import write_video
from PIL import Image

from app.catalog.cards import load_cards
from app.config import Settings
from app.domain.replies import until_stopped
from app.engines.base import (
    EngineError,
    EngineFailure,
    ModelState,
    ModelStatus,
    SamplingSettings,
    StreamEnd,
    TextDelta,
)
from app.engines.manager import EngineManager
from app.engines.vllm_engine import VllmEngineFactory, process_tree_memory
from app.media.loading import load_video

CATALOG = load_cards()

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# One engine at a time, so that the tests below exercise swaps on this 2-core machine.
SETTINGS = Settings(
    gpu_count=0, cpu_kv_cache_bytes=64 * 2**20, idle_unload_s=0, drain_timeout_s=60, max_resident=1
)
FIXED = SamplingSettings(temperature=0.0, max_tokens=12, ignore_eos=True)


class CountingFactory:
    """The real factory, counting builds and remembering each engine."""

    def __init__(self, settings: Settings) -> None:
        self.real = VllmEngineFactory(settings)
        self.builds: list[str] = []
        self.engines: dict[str, Any] = {}

    def capacity(self) -> Any:
        return self.real.capacity()

    def memory_need(self, card: Any) -> Any:
        return self.real.memory_need(card)

    async def build(self, card: Any, report: Callable[[str], None], devices: tuple[int, ...]) -> Any:
        self.builds.append(card.key)
        engine = await self.real.build(card, report, devices)
        self.engines[card.key] = engine
        return engine


def ask(text: str, *media: tuple[str, Any]) -> list[dict[str, Any]]:
    parts = [{"type": kind, kind: item} for kind, item in media]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


async def answer(manager: EngineManager, key: str, messages: list[dict[str, Any]], sampling=FIXED) -> dict:
    """Consumes one stream: statuses seen, text deltas with their arrival times, the end."""
    result: dict[str, Any] = {"statuses": [], "deltas": [], "times": [], "end": None}
    async for event in manager.stream(key, messages, sampling):
        if isinstance(event, ModelStatus):
            result["statuses"].append(event)
        elif isinstance(event, TextDelta):
            result["deltas"].append(event.text)
            result["times"].append(time.monotonic())
        else:
            assert isinstance(event, StreamEnd)
            result["end"] = event
    return result


def picture(seed: int, size: int = 96) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def factory() -> CountingFactory:
    return CountingFactory(SETTINGS)


@pytest.fixture(scope="module")
def manager(loop, tiny_cards, factory):
    manager = EngineManager(tiny_cards, SETTINGS, factory, progress_interval_s=0.2)
    yield manager
    loop.run(manager.close())


@pytest.fixture
def quiet(loop, manager) -> None:
    """Unloads the shared manager's engines, for tests that build their own on 2 cores."""
    loop.run(manager.close())


def test_simultaneous_first_requests_share_one_build_and_stream_an_image_answer(loop, manager, factory):
    async def two_first_requests():
        return await asyncio.gather(
            answer(manager, "tiny-a", ask("What is this?", ("image", picture(1)))),
            answer(manager, "tiny-a", ask("What is this?", ("image", picture(2)), ("image", picture(3)))),
        )

    one_image, two_images = loop.run(two_first_requests())
    assert factory.builds == ["tiny-a"]
    for result in (one_image, two_images):
        states = {status.state for status in result["statuses"]}
        assert ModelState.LOADING in states or ModelState.QUEUED in states
        assert result["end"].finish_reason == "length"
        assert result["end"].completion_tokens == FIXED.max_tokens
        assert "".join(result["deltas"])
    # Each picture adds the same number of visual tokens to the prompt.
    text_only = loop.run(answer(manager, "tiny-a", ask("What is this?")))
    per_image = one_image["end"].prompt_tokens - text_only["end"].prompt_tokens
    assert per_image > 0
    assert two_images["end"].prompt_tokens - text_only["end"].prompt_tokens == 2 * per_image
    assert one_image["end"].prompt.count("<|image_pad|>") == 1
    assert manager.status("tiny-a").state is ModelState.READY
    assert manager.status("tiny-a").estimate_s > 0


def test_video_answer_prompt_grows_with_the_frames_sampled(loop, manager, tmp_path):
    clip = write_video(tmp_path / "clip.mp4", seconds=2.0, fps=10, size=(64, 48))
    few, more = load_video(clip, num_frames=4), load_video(clip, num_frames=8)
    assert few.frames.shape == (4, 48, 64, 3)
    short = loop.run(answer(manager, "tiny-a", ask("What happens?", ("video", few))))
    long = loop.run(answer(manager, "tiny-a", ask("What happens?", ("video", more))))
    for result in (short, long):
        assert result["end"].finish_reason == "length"
        assert result["end"].completion_tokens == FIXED.max_tokens
        assert "<|video_pad|>" in result["end"].prompt
    assert long["end"].prompt_tokens > short["end"].prompt_tokens


def test_as_many_concurrent_streams_as_the_card_batches_are_batched_not_serialised(loop, manager, tiny_cards):
    sampling = replace(FIXED, max_tokens=48)
    batch = tiny_cards["tiny-a"].engine_args["max_num_seqs"]  # Qwen2-VL's card: 5

    async def together():
        return await asyncio.gather(
            *(answer(manager, "tiny-a", ask(f"Question {i}"), sampling) for i in range(batch))
        )

    results = loop.run(together())
    assert all(r["end"].completion_tokens == 48 for r in results)
    # Under a lock, each stream would start after the previous one ended. Batched, every
    # stream has produced text before the first one finishes.
    first_finish = min(r["times"][-1] for r in results)
    assert all(r["times"][0] < first_finish for r in results)


def test_closing_a_stream_aborts_its_request_and_the_engine_keeps_serving(loop, manager):
    async def stop_after_three_deltas():
        stream = manager.stream("tiny-a", ask("Tell me a long story"), replace(FIXED, max_tokens=2000))
        received = 0
        async for event in stream:
            if isinstance(event, TextDelta):
                received += 1
                if received == 3:
                    break
        await stream.aclose()
        for _ in range(50):
            if manager.unfinished_requests("tiny-a") == 0:
                break
            await asyncio.sleep(0.05)
        return received, manager.unfinished_requests("tiny-a"), manager.status("tiny-a").in_flight

    received, unfinished, in_flight = loop.run(stop_after_three_deltas())
    assert (received, unfinished, in_flight) == (3, 0, 0)
    after = loop.run(answer(manager, "tiny-a", ask("Still there?")))
    assert after["end"].completion_tokens == FIXED.max_tokens


def test_a_stop_pressed_while_the_chat_waits_for_a_piece_aborts_the_request(loop, manager):
    """The chat's Stop, looked at while it waits (`until_stopped`): pressed once the engine holds
    the request and before its first piece (a long prompt's prefill), it cancels the wait inside
    the manager's stream; that must end the request in vLLM as closing the stream does."""

    async def stopped_before_the_first_piece():
        story = "Tell me a long story about " + "a red circle and a blue square, " * 150
        stream = manager.stream("tiny-a", ask(story), replace(FIXED, max_tokens=2000))

        def held() -> bool:  # Stop, once vLLM holds the request
            return manager.unfinished_requests("tiny-a") > 0

        async with contextlib.aclosing(stream):
            events = [event async for event in until_stopped(stream, held, every_s=0.001)]
        for _ in range(50):
            if manager.unfinished_requests("tiny-a") == 0:
                break
            await asyncio.sleep(0.05)
        pieces = [event for event in events if isinstance(event, TextDelta | StreamEnd)]
        return pieces, manager.unfinished_requests("tiny-a"), manager.status("tiny-a").in_flight

    assert loop.run(stopped_before_the_first_piece()) == ([], 0, 0)
    after = loop.run(answer(manager, "tiny-a", ask("Still there?")))
    assert after["end"].completion_tokens == FIXED.max_tokens


def test_a_swap_waits_for_answers_in_flight_on_the_engine_it_evicts(loop, manager, factory):
    async def long_answer_then_other_model():
        first = asyncio.create_task(
            answer(manager, "tiny-a", ask("Long one"), replace(FIXED, max_tokens=300))
        )
        while not manager.status("tiny-a").in_flight:
            await asyncio.sleep(0.01)
        phases: list[str] = []
        unsubscribe = manager.subscribe(lambda s: s.key == "tiny-b" and phases.append(s.phase))
        second = await answer(manager, "tiny-b", ask("Short one"))
        unsubscribe()
        return await first, second, phases

    first, second, phases = loop.run(long_answer_then_other_model())
    assert first["end"].finish_reason == "length" and first["end"].completion_tokens == 300
    assert second["end"].completion_tokens == FIXED.max_tokens
    assert any("waiting for 1 answer" in phase for phase in phases)
    # The new model's first token came after the evicted model's last one.
    assert second["times"][0] > first["times"][-1]
    assert manager.status("tiny-a").state is ModelState.NOT_LOADED
    assert manager.status("tiny-b").state is ModelState.READY


def test_past_the_drain_time_answers_on_the_evicted_engine_are_stopped(loop, tiny_cards, quiet):
    # No quantum: the swap starts draining at once, and the drain time runs out mid-answer.
    settings = SETTINGS.with_overrides(drain_timeout_s=0.5, quantum_s=0)
    manager = EngineManager(tiny_cards, settings, VllmEngineFactory(settings))

    async def scenario():
        first = asyncio.create_task(
            answer(manager, "tiny-a", ask("Endless"), replace(FIXED, max_tokens=3000))
        )
        while not manager.status("tiny-a").in_flight:
            await asyncio.sleep(0.01)
        second = await answer(manager, "tiny-b", ask("Me now"))
        return await first, second

    try:
        first, second = loop.run(scenario())
    finally:
        loop.run(manager.close())
    assert first["end"].finish_reason == "abort"
    assert 0 < first["end"].completion_tokens < 3000
    assert second["end"].completion_tokens == FIXED.max_tokens


def test_killing_the_engine_process_mid_answer_fails_the_stream_then_rebuilds(loop, tiny_cards, quiet):
    settings = SETTINGS.with_overrides(max_resident=2)
    factory = CountingFactory(settings)
    manager = EngineManager(tiny_cards, settings, factory)

    async def scenario():
        await answer(manager, "tiny-b", ask("Warm up"))
        bystander = asyncio.create_task(
            answer(manager, "tiny-b", ask("Keep going"), replace(FIXED, max_tokens=400))
        )
        victim = manager.stream("tiny-a", ask("Doomed"), replace(FIXED, max_tokens=3000))
        error = None
        try:
            async for event in victim:
                if isinstance(event, TextDelta):
                    os.kill(factory.engines["tiny-a"].process_ids[0], signal.SIGKILL)
        except EngineFailure as failure:
            error = failure
        failed = manager.status("tiny-a")
        again = await answer(manager, "tiny-a", ask("Back?"))
        return error, failed, again, await bystander

    try:
        error, failed, again, bystander = loop.run(scenario())
    finally:
        loop.run(manager.close())
    assert error is not None and "stopped unexpectedly" in str(error)
    assert failed.state is ModelState.FAILED and "random-weight twin" in failed.reason
    assert again["end"].completion_tokens == FIXED.max_tokens
    assert factory.builds == ["tiny-b", "tiny-a", "tiny-a"]
    assert bystander["end"].finish_reason == "length" and bystander["end"].completion_tokens == 400


def test_a_failed_build_names_the_model_and_cause_and_the_manager_keeps_working(
    loop, tiny_cards, quiet, tmp_path
):
    broken_folder = tmp_path / "no-weights"
    broken_folder.mkdir()
    (broken_folder / "config.json").write_text('{"model_type": "qwen2_vl", "architectures": ["Nope"]}')
    from app.demo.models import twin_card

    cards = {**tiny_cards, "broken": twin_card(CATALOG["qwen2_vl"], broken_folder, "broken")}
    manager = EngineManager(cards, SETTINGS, VllmEngineFactory(SETTINGS))
    try:
        with pytest.raises(EngineError) as error:
            loop.run(answer(manager, "broken", ask("Hello?")))
        status = manager.status("broken")
        fine = loop.run(answer(manager, "tiny-b", ask("Hello?")))
    finally:
        loop.run(manager.close())
    assert status.state is ModelState.FAILED
    assert status.reason == str(error.value)
    assert status.reason.startswith("Qwen2-VL 7B Instruct: random-weight twin")
    assert "could not be loaded" in status.reason
    assert str(broken_folder) not in status.reason and "Traceback" not in status.reason
    assert fine["end"].completion_tokens == FIXED.max_tokens


def test_a_picture_the_engine_process_no_longer_holds_is_sent_again_and_answered(loop, manager, factory):
    """vLLM keeps processed pictures in two caches: keys in this process, data in the engine's.
    They can drift apart under concurrent requests; vLLM then ends the request with a retryable
    error and no token (seen in a grid run: an empty answer shown as done). The drift is made
    here with vLLM's own reset of the engine process's half."""
    messages = ask("What is this?", ("image", picture(7)))

    async def forgotten_between_two_answers() -> tuple[dict, dict]:
        first = await answer(manager, "tiny-a", messages)
        await factory.engines["tiny-a"]._engine.engine_core.reset_mm_cache_async()
        return first, await answer(manager, "tiny-a", messages)

    first, second = loop.run(forgotten_between_two_answers())
    assert first["end"].completion_tokens == FIXED.max_tokens
    assert second["end"].finish_reason == "length"
    assert second["end"].completion_tokens == FIXED.max_tokens and len(second["deltas"]) > 0


def test_an_unknown_model_is_refused_with_a_message(loop, manager):
    with pytest.raises(EngineError, match="no model 'gpt-9'"):
        loop.run(answer(manager, "gpt-9", ask("hi")))


SWAPS = 4


def test_repeated_swaps_leave_memory_and_processes_where_they_started(loop, tiny_cards, quiet):
    manager = EngineManager(tiny_cards, SETTINGS, VllmEngineFactory(SETTINGS))

    async def swaps(count: int) -> None:
        for i in range(count):
            result = await answer(manager, ("tiny-a", "tiny-b")[i % 2], ask("Swap", ("image", picture(i))))
            assert result["end"].completion_tokens == FIXED.max_tokens

    try:
        # The first two builds import and warm everything this process keeps (tokenizers,
        # processors, vLLM's modules); the baseline is taken after them.
        loop.run(swaps(2), timeout=600)
        loop.run(manager.close())
        baseline_rss, baseline_children = process_tree_memory()
        # Four (each a build of about 10 s of both cores): a leak of more than 12.5 MiB a swap
        # shows, as it did over eight with 100 MiB; the 20-swap figure is the benchmark's
        # (`bench/bench_engine.py`).
        loop.run(swaps(SWAPS), timeout=1200)
        loop.run(manager.close())
        rss, children = process_tree_memory()
    finally:
        loop.run(manager.close())
    assert children == baseline_children
    # Stated tolerance: 12.5 MiB a swap for the whole process tree (measured: about 15 MiB
    # over 20 swaps in all).
    grown = rss - baseline_rss
    assert grown < SWAPS * 12.5 * 2**20, f"grew {grown >> 20} MiB over {SWAPS} swaps"


def test_the_model_state_describes_itself_for_the_ui():
    status = ModelStatus("m", ModelState.LOADING, "starting", elapsed_s=3.2, estimate_s=20)
    assert status.describe() == "loading: starting (3 s of about 20 s)"
    failed = ModelStatus("m", ModelState.FAILED, reason="M could not be loaded: boom")
    assert failed.describe() == "failed: M could not be loaded: boom"


def test_video_frames_reach_the_engine_as_sampled(tmp_path: Path):
    """What the manager hands vLLM for a video: the sampled frames with their metadata."""
    from app.catalog.adapters import RenderedPrompt
    from app.demo.models import twin_card
    from app.engines.vllm_engine import engine_prompt

    clip = load_video(write_video(tmp_path / "c.mp4"), num_frames=4)
    image = Image.new("RGB", (8, 8))
    image.info["content_hash"] = "abc"
    card = twin_card(CATALOG["qwen2_5_vl"], tmp_path, "t")  # a card that sends video metadata
    prompt = engine_prompt(card, RenderedPrompt("p", [image], [clip]))
    frames, metadata = prompt["multi_modal_data"]["video"][0]
    assert frames is clip.frames and metadata["frames_indices"] == clip.metadata["frames_indices"]
    assert prompt["multi_modal_uuids"] == {"image": ["abc"]}


def test_an_engine_unused_for_the_idle_time_is_unloaded_and_its_process_ends(loop, tiny_cards, quiet):
    settings = SETTINGS.with_overrides(idle_unload_s=1.0)
    factory = CountingFactory(settings)
    manager = EngineManager(tiny_cards, settings, factory)

    async def answer_then_wait() -> tuple[ModelState, ModelState]:
        await answer(manager, "tiny-b", ask("Hi"))
        right_after = manager.status("tiny-b").state
        for _ in range(100):
            if manager.status("tiny-b").state is ModelState.NOT_LOADED:
                break
            await asyncio.sleep(0.1)
        return right_after, manager.status("tiny-b").state

    try:
        right_after, later = loop.run(answer_then_wait())
    finally:
        loop.run(manager.close())
    assert (right_after, later) == (ModelState.READY, ModelState.NOT_LOADED)
    assert not psutil.pid_exists(factory.engines["tiny-b"].process_ids[0])


def test_two_users_on_two_models_with_one_resident_engine_both_get_every_answer(loop, tiny_cards, quiet):
    """The livelock of the first round, on the real engine: one engine at a time, two users,
    each sending three messages one after the other on a different model, at the same time."""
    factory = CountingFactory(SETTINGS)
    manager = EngineManager(tiny_cards, SETTINGS, factory, progress_interval_s=0.2)

    async def user(key: str) -> list[dict]:
        return [await answer(manager, key, ask(f"Message {i}")) for i in range(3)]

    async def both() -> list[list[dict]]:
        return await asyncio.gather(user("tiny-a"), user("tiny-b"))

    try:
        results = loop.run(both(), timeout=900)
    finally:
        loop.run(manager.close())
    answers = [r for user_results in results for r in user_results]
    assert all(r["end"].completion_tokens == FIXED.max_tokens for r in answers)
    # Each build serves at least one answer: at most one build per message, never a build
    # evicted before it answered (the livelock built and evicted forever).
    assert len(factory.builds) <= 6
    for key in ("tiny-a", "tiny-b"):
        assert factory.builds.count(key) >= 1


def test_by_default_the_two_demo_models_are_resident_together_on_cpu(loop, tiny_cards, quiet):
    settings = Settings(**{**SETTINGS.model_dump(), "max_resident": None})  # no cap
    factory = CountingFactory(settings)
    manager = EngineManager(tiny_cards, settings, factory)

    async def alternate() -> list[dict]:
        return [await answer(manager, ("tiny-a", "tiny-b")[i % 2], ask("Hi")) for i in range(4)]

    try:
        results = loop.run(alternate(), timeout=600)
        states = [manager.status(key).state for key in ("tiny-a", "tiny-b")]
    finally:
        loop.run(manager.close())
    assert all(r["end"].completion_tokens == FIXED.max_tokens for r in results)
    assert factory.builds == ["tiny-a", "tiny-b"]
    assert states == [ModelState.READY, ModelState.READY]
