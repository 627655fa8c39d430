"""How a card and the settings become vLLM's engine arguments, and how build errors read.
(The engine itself runs in test_engine.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.catalog.cards import load_cards
from app.config import Settings
from app.engines.vllm_engine import VllmEngineFactory, explain_build_error

CARDS = load_cards()


def test_a_cpu_engines_need_counts_its_cache_of_processed_media():
    """vLLM keeps processed pictures in the engine's process, up to APP_MEDIA_CACHE_BYTES: on the
    CPU backend that is the same RAM the scheduler's budget counts."""
    card = CARDS["qwen2_vl"]
    small = VllmEngineFactory(Settings(gpu_count=0, media_cache_bytes="0")).memory_need(card)
    big = VllmEngineFactory(Settings(gpu_count=0, media_cache_bytes="1GiB")).memory_need(card)
    assert big.per_device - small.per_device == 2**30


def test_cpu_engines_are_eager_with_a_bounded_kv_cache():
    args = VllmEngineFactory(Settings(gpu_count=0, cpu_kv_cache_bytes=2**28)).engine_args(CARDS["qwen2_vl"])
    assert args["enforce_eager"] is True and args["kv_cache_memory_bytes"] == 2**28
    assert "gpu_memory_utilization" not in args and "enable_sleep_mode" not in args
    assert args["max_model_len"] == CARDS["qwen2_vl"].engine_args["max_model_len"]


@pytest.mark.parametrize("gpu_count", [0, 1])
def test_vllms_cache_of_processed_media_is_bounded_by_the_setting(gpu_count: int):
    """vLLM's default keeps up to 4 GiB of processed pictures in an engine's process: distinct
    pictures from strangers grew it about 1 MiB each (bench_media_cache)."""
    settings = Settings(gpu_count=gpu_count, media_cache_bytes="256MiB")
    args = VllmEngineFactory(settings, device_totals=[80 * 10**9]).engine_args(CARDS["qwen2_vl"])
    assert args["mm_processor_cache_gb"] == 0.25
    default = VllmEngineFactory(Settings(gpu_count=gpu_count), device_totals=[80 * 10**9])
    assert default.engine_args(CARDS["qwen2_vl"])["mm_processor_cache_gb"] == 0.5
    # 0: no cache (every picture processed again in each request), as vLLM reads 0.
    off = VllmEngineFactory(Settings(gpu_count=gpu_count, media_cache_bytes="0"), device_totals=[80 * 10**9])
    assert off.engine_args(CARDS["qwen2_vl"])["mm_processor_cache_gb"] == 0


def test_each_gpu_engine_gets_the_memory_its_model_needs_and_may_sleep():
    factory = VllmEngineFactory(Settings(gpu_count=1), device_totals=[80 * 10**9])
    card = CARDS["qwen2_vl"]
    need = factory.memory_need(card)
    args = factory.engine_args(card)
    assert args["gpu_memory_utilization"] == round(need.per_device / (80 * 10**9), 4)
    # No config at hand here (test_memory has one): vLLM sizes the KV cache within the share.
    assert "kv_cache_memory_bytes" not in args
    assert args["enable_sleep_mode"] is True and args["enforce_eager"] is False
    # A 7B model at bf16: 14 GB of weights; the reserve is max_model_len x max_num_seqs tokens.
    assert 13e9 < need.weights_bytes < 15e9
    small = factory.memory_need(CARDS["qwen2_5_vl"])
    assert small.per_device < need.per_device
    assert factory.capacity().device_budgets == (int(0.9 * 80 * 10**9),)


@pytest.mark.parametrize("key", ["gemma3n", "glm4v", "glm4_1v", "idefics3", "smolvlm"])
def test_a_cards_enforce_eager_is_never_turned_off(key: str):
    assert CARDS[key].engine_args["enforce_eager"] is True
    compiled = Settings(gpu_count=1, enforce_eager=False)
    assert (
        VllmEngineFactory(compiled, device_totals=[80 * 10**9]).engine_args(CARDS[key])["enforce_eager"]
        is True
    )
    eager = Settings(gpu_count=1, enforce_eager=True)
    other = VllmEngineFactory(eager, device_totals=[80 * 10**9]).engine_args(CARDS["qwen2_vl"])
    assert other["enforce_eager"] is True  # the setting turns eager mode on where a card leaves it unset


def test_local_folders_and_the_cache_replace_downloads(monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", "unset")  # the factory sets it: restored after the test
    settings = Settings(gpu_count=1, model_folders={"llava": Path("/models/llava")}, hf_cache=Path("/cache"))
    args = VllmEngineFactory(settings, device_totals=[80 * 10**9]).engine_args(CARDS["llava"])
    assert args["model"] == "/models/llava" and args["download_dir"] == "/cache"
    assert os.environ["HF_HUB_CACHE"] == "/cache"
    other = VllmEngineFactory(settings, device_totals=[80 * 10**9]).engine_args(CARDS["qwen2_vl"])
    assert other["model"] == "Qwen/Qwen2-VL-7B-Instruct"


def test_build_errors_read_as_one_actionable_line_without_paths():
    card = CARDS["llava"]
    try:
        try:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load /root/.cache/x")
        except OSError as cause:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from cause
    except RuntimeError as error:
        offline = explain_build_error(card, error)
    assert offline.startswith(card.display_name) and "APP_MODEL_FOLDERS" in offline and "/root" not in offline
    oom = explain_build_error(card, RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert "does not fit in GPU memory" in oom
    other = explain_build_error(card, ValueError("bad value in /srv/models/llava/config.json\nmore"))
    assert other == f"{card.display_name} could not be loaded: bad value in <path>"


def test_a_cards_sampling_defaults_are_the_models_defaults_and_the_user_still_decides():
    from app.engines.base import SamplingSettings, card_sampling

    ocr = CARDS["deepseek_ocr"]
    defaults = card_sampling(ocr)
    assert (defaults.temperature, defaults.max_tokens) == (0.0, 8192)
    # What the API sends when a value is left empty (None), and what a user's slider sends.
    assert SamplingSettings().for_card(ocr).max_tokens == 8192
    chosen = SamplingSettings(temperature=0.4, max_tokens=100).for_card(ocr)
    assert (chosen.temperature, chosen.max_tokens, chosen.top_p) == (0.4, 100, 1.0)
    # A card without defaults gets the app's.
    assert card_sampling(CARDS["qwen2_vl"]) == SamplingSettings(temperature=0.7, top_p=1.0, max_tokens=512)
