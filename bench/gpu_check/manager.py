"""The `manager` phase: swaps through the app's own `EngineManager` with `VllmEngineFactory`
(one GPU, one engine awake at a time), as the app would run the two models' cards, and the GPU
memory after `manager.close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from . import common
from .common import MAX_MODEL_LEN, gib
from .engines import picture, request_ids
from .folders import model_card
from .machine import gpu_used, wait_for_memory
from .phase import Phase, Plan


async def manager_swap(plan: Plan) -> dict[str, Any]:
    """The app's manager on one GPU with one engine awake at a time: the 2B-class model, then
    the 7B-class one (a swap), then each again (waking where the manager put them to sleep)."""
    from app.config import Settings
    from app.engines.base import SamplingSettings, StreamEnd
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory

    phase = Phase("manager swap", plan.timeout_s)
    models = plan.models
    cards = {m.spec.key: model_card(m.spec, m.folder, m.load_format) for m in models.values()}
    settings = Settings(
        gpu_count=common.MANAGER_GPU_COUNT,
        # The cards' own context, as every other phase builds them (not a chat-sized one).
        chat_context=MAX_MODEL_LEN,
        max_resident=1,
        quantum_s=0.0,
        idle_unload_s=0.0,
        enforce_eager=False,
    )
    factory = VllmEngineFactory(settings)
    manager = EngineManager(cards, settings, factory)
    target = gpu_used()
    with contextlib.suppress(Exception):
        phase.notes["engine_args"] = {
            key: {
                k: v
                for k, v in factory.engine_args(card).items()
                if k in ("gpu_memory_utilization", "kv_cache_memory_bytes", "enable_sleep_mode")
            }
            for key, card in cards.items()
        }
    sampling = SamplingSettings(temperature=0.0, max_tokens=plan.tokens, ignore_eos=True)
    small, large = models["small"].spec.key, models["large"].spec.key
    # The app's estimate of each card, before its build (the manager books the measure after).
    estimates = {key: factory.memory_need(card) for key, card in cards.items()}
    memory: dict[str, Any] = {}
    phase.notes["estimate_against_measured"] = memory

    def compare(key: str) -> None:
        """The app's estimate for `key` against what its engine took (NVML, around the build)."""
        held = manager.engines().get(key)
        taken = getattr(held[0], "footprint_bytes", None) if held else None
        if key in memory or taken is None or estimates[key] is None:
            return
        need = estimates[key]
        memory[key] = {
            "estimated_gib": gib(need.estimated_per_device),
            "measured_gib": gib(taken),
            "weights_from": need.weights_from,
            "kv_from": need.kv_from,
        }
        if models["large"].spec.repo == HUB_CARD_REPO and key == large:
            # The catalog's own card for the 7B-class model, as the app sizes it here (from the
            # Hugging Face cache where the model is in it, else its name): same sizes, measured.
            hub = hub_card_need(factory)
            if hub is not None:
                memory[f"catalog card {HUB_CARD_KEY}"] = {
                    "estimated_gib": gib(hub.estimated_per_device),
                    "measured_gib (its 7B-class twin here)": gib(taken),
                    "weights_from": hub.weights_from,
                    "kv_from": hub.kv_from,
                }

    async def ask(key: str) -> dict[str, Any]:
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": picture(next(request_ids))},
                    {"type": "text", "text": "Describe this picture."},
                ],
            }
        ]
        phases, end = [], None
        async for event in manager.stream(key, messages, sampling):
            if isinstance(event, StreamEnd):
                end = event
            elif hasattr(event, "state"):
                # State and phase, without the elapsed seconds (which change every update).
                seen = f"{event.state.value}: {event.phase}" if event.phase else event.state.value
                if not phases or phases[-1] != seen:
                    phases.append(seen)
        if end is None or end.completion_tokens != plan.tokens:
            raise RuntimeError(f"answer ended with {end}")
        compare(key)
        states = {k: manager.status(k).state.value for k in cards}
        return {"tokens": end.completion_tokens, "statuses_seen": phases[-8:], "states_after": states}

    try:
        for name, key in (
            ("first request: build the 2B-class model", small),
            ("swap to the 7B-class model", large),
            ("swap back to the 2B-class model", small),
            ("swap again to the 7B-class model", large),
        ):
            result = await phase.run(name, lambda key=key: ask(key))
            if result is not None and name.startswith("swap"):
                states = result["states_after"]
                other = small if key == large else large
                phase.check(
                    f"{name}: the other model is no longer awake",
                    states[key] == "ready" and states[other] != "ready",
                    json.dumps(states),
                )
    finally:
        closed = await phase.run("manager.close()", manager.close)
        if closed is not None:
            back = await asyncio.to_thread(wait_for_memory, target)
            phase.notes["gpu_after_close"] = back
            if back.get("memory_back") is not None:
                phase.check("GPU memory back after manager.close()", back["memory_back"])
    return phase.record()


# The catalog card whose model the 7B-class folder has the sizes of.
HUB_CARD_KEY, HUB_CARD_REPO = "qwen2_vl", "Qwen/Qwen2-VL-7B-Instruct"


def hub_card_need(factory: Any) -> Any:
    from app.catalog.cards import load_cards

    card = load_cards().get(HUB_CARD_KEY)
    return factory.memory_need(card) if card is not None and card.hf_repo == HUB_CARD_REPO else None
