"""Memory sizing for the scheduler (`app.engines.memory`) and the memory check after an engine stops
(`app.engines.vllm_engine.wait_for_memory_freed`), on the real catalog and real model folders."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.catalog.cards import load_cards
from app.config import Settings
from app.engines.gpus import gpu_memory, visible_devices
from app.engines.memory import (
    DEFAULT_MAX_NUM_SEQS,
    GIB,
    GPU_ENGINE_OVERHEAD_BYTES,
    ModelFacts,
    chat_length,
    estimate_need,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_dtype_bytes,
    native_context,
    parameters_from_config,
    parameters_from_name,
    sliding_windows,
    weights_on_disk,
)
from app.engines.metrics import measured_gpu_memory
from app.engines.vllm_engine import VllmEngineFactory, wait_for_memory_freed

CARDS = load_cards()
GB = 10**9


@pytest.fixture(autouse=True)
def _forget_contexts():
    """Sizing a card on a GPU registers the context its engine will get (app.engines.tokens):
    forgotten after each test, so that other tests' size checks see the cards' own."""
    from app.engines.tokens import register_context

    yield
    for key in CARDS:
        register_context(key, None)


def test_parameter_counts_are_read_from_repository_names():
    assert parameters_from_name("Qwen/Qwen2-VL-7B-Instruct") == 7
    assert parameters_from_name("HuggingFaceTB/SmolVLM2-2.2B-Instruct") == 2.2
    assert parameters_from_name("h2oai/h2ovl-mississippi-800m") == 0.8
    assert parameters_from_name("Qwen/Qwen3-VL-30B-A3B-Instruct") == 30
    assert parameters_from_name("meta-llama/Llama-4-Scout-17B-16E-Instruct") is None
    assert parameters_from_name("rhymes-ai/Aria") is None


def test_every_card_gets_a_need_and_sizes_follow_the_models():
    needs = {key: estimate_need(card, None, on_gpu=True) for key, card in CARDS.items()}
    assert all(need.per_device > GPU_ENGINE_OVERHEAD_BYTES for need in needs.values())
    assert needs["qwen2_5_vl"].weights_bytes < needs["qwen2_vl"].weights_bytes  # 3B < 7B
    assert needs["glm4_5v_fp8"].weights_bytes < needs["glm4_5v"].weights_bytes  # FP8: a byte each
    assert all(c.parameters_b or parameters_from_name(c.hf_repo) for c in CARDS.values())
    tensor_parallel = [k for k, c in CARDS.items() if c.gpus_needed > 1]
    assert tensor_parallel and all(needs[k].devices == CARDS[k].gpus_needed for k in tensor_parallel)


def test_a_local_folder_is_sized_from_its_config_and_weights(tmp_path: Path, tiny_cards):
    import shutil

    import torch
    from transformers import AutoConfig, Qwen2VLForConditionalGeneration

    card = tiny_cards["tiny-a"]
    # The twin with weights saved next to its config, as a local checkpoint has them.
    folder = tmp_path / "with-weights"
    shutil.copytree(card.hf_repo, folder)
    Qwen2VLForConditionalGeneration(AutoConfig.from_pretrained(folder)).to(torch.bfloat16).save_pretrained(
        folder
    )
    need = estimate_need(card, folder, on_gpu=True)
    on_disk = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert need.weights_bytes == on_disk
    config = json.loads((folder / "config.json").read_text())
    per_token = kv_bytes_per_token(config)
    assert per_token == 2 * 2 * config["text_config"]["num_key_value_heads"] * 32 * 2
    assert need.kv_bytes == per_token * card.engine_args["max_model_len"] * card.engine_args["max_num_seqs"]
    # Without weights (load_format="dummy" folders), the config gives the parameter count.
    dummy = tmp_path / "dummy"
    dummy.mkdir()
    (dummy / "config.json").write_text(json.dumps(config))
    params = parameters_from_config(config)
    assert params is not None and abs(params * 1e9 * 2 - on_disk) / on_disk < 0.5
    # A real card pointed at such a folder is sized as the folder's model, not by its name.
    real = load_cards()["qwen2_vl"]  # "7B" in its name
    assert estimate_need(real, dummy, on_gpu=False).weights_bytes == int(params * 1e9 * 2)


def test_the_memory_check_after_a_stop_measures_that_engine_by_device():
    """Two GPUs; the engine took 10 GB on GPU 1. Another engine's use on GPU 0 does not matter."""
    readings = iter([[30 * GB, 25 * GB], [30 * GB, 15.2 * GB]])
    assert wait_for_memory_freed([30 * GB, 25 * GB], {1: 10 * GB}, read=lambda kind: next(readings))
    assert not wait_for_memory_freed([30 * GB, 25 * GB], {1: 10 * GB}, read=lambda kind: None)


def test_cuda_visible_devices_become_nvml_indices():
    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,-1,0"}) == [1]


def test_an_omni_config_is_sized_from_its_thinker():
    """Qwen2.5-Omni nests the model vLLM serves under thinker_config: without looking there a
    twin was sized from the card's name (7B) and refused on a CPU budget."""
    text = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    omni = {"thinker_config": {"text_config": {**text, "vocab_size": 512}}}
    assert parameters_from_config(omni) == parameters_from_config({**text, "vocab_size": 512})
    assert kv_bytes_per_token(omni) == 2 * 2 * 2 * 32 * 2


def text_config(hidden: int, layers: int, heads: int, kv_heads: int) -> dict[str, int]:
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
    }


# The text models of the two small-GPU models the README suggests whose reserve was short, as
# their config.json files describe them (Phi-3 mini without grouped-query attention; SmolLM2).
PHI_3_5_VISION = {
    "hidden_size": 3072,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
}
SMOLVLM2_TEXT = {
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
}


@pytest.mark.parametrize(
    ("key", "config"), [("phi3_v", PHI_3_5_VISION), ("smolvlm", {"text_config": SMOLVLM2_TEXT})]
)
def test_the_kv_reserve_holds_the_cards_full_length_sequences(key: str, config: dict):
    """Phi-3.5-vision needs 1.5 GiB for one 4,096-token sequence, SmolVLM2 1.5 GiB for 8,192;
    a reserve guessed from the weights gave them 0.64 and 0.67 GiB, and vLLM refuses to build
    an engine whose cache cannot hold one full sequence."""
    card = CARDS[key]
    need = estimate_need(card, None, on_gpu=True, facts=ModelFacts(config, 8 * GB, "the Hub"))
    length, sequences = card.engine_args["max_model_len"], card.engine_args["max_num_seqs"]
    text = config.get("text_config", config)
    per_token = (
        2
        * text["num_hidden_layers"]
        * text["num_key_value_heads"]
        * 2
        * (text["hidden_size"] // text["num_attention_heads"])
    )
    assert need.kv_bytes == per_token * length * sequences and need.kv_bytes >= sequences * 1.5 * GIB
    assert need.kv_from_config and need.from_files and need.weights_bytes == 8 * GB
    # Without the config, the guess still holds one full sequence of theirs (vLLM then sizes the
    # cache itself within the share, `kv_cache_memory_bytes` unset: test_vllm_engine).
    guessed = estimate_need(card, None, on_gpu=True)
    assert guessed.kv_bytes >= per_token * length and not guessed.kv_from_config


def test_kv_arithmetic_follows_each_layers_attention():
    text = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 2}
    full = 12 * 2 * 2 * 128 * 2
    assert kv_bytes_per_token(text) == full
    # Whole blocks of 16 tokens, as vLLM allocates them on a GPU.
    assert kv_bytes_per_sequence(text, 16) == kv_bytes_per_sequence(text, 1) == 16 * full
    # Sliding windows: every sixth layer global (older Gemma 3 configs) or as layer_types say; a
    # windowed layer holds its window and two steps' tokens in flight and a block more, never more
    # than the sequence (and a block); mixed kinds get a twentieth more for vLLM's page padding.
    gemma = {**text, "sliding_window": 1024, "sliding_window_pattern": 6}
    assert sliding_windows(gemma, 12).count(None) == 2
    per_layer = full // 12
    total = per_layer * (2 * 8192 + 10 * (3072 + 16))  # 1023 + 2 x 1024 tokens: 192 blocks, +1
    assert kv_bytes_per_sequence(gemma, 8192, batched_tokens=1024) == total + total // 20
    short = per_layer * (2 * 2048 + 10 * (2048 + 16))
    assert kv_bytes_per_sequence(gemma, 2048, batched_tokens=2048) == short + short // 20
    # Step3 names its (one) KV head group `num_attention_groups`.
    step3 = {**text, "num_key_value_heads": None, "num_attention_groups": 1}
    assert kv_bytes_per_token(step3) == full // 2
    typed = {**text, "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"] * 6}
    assert sliding_windows(typed, 12) == [512, None] * 6
    # Qwen2's configs name a window they do not use.
    assert sliding_windows({**text, "sliding_window": 4096, "use_sliding_window": False}, 12) == [None] * 12
    # Multi-head latent attention (DeepSeek-V2 style): one latent vector and the rotary key part.
    mla = {**text, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert kv_bytes_per_token(mla) == 12 * (512 + 64) * 2
    # ChatGLM's own names for KV heads and their size.
    glm = {
        "hidden_size": 4096,
        "num_layers": 40,
        "num_attention_heads": 32,
        "multi_query_group_num": 2,
        "kv_channels": 128,
    }
    assert kv_bytes_per_token(glm) == 40 * 2 * 2 * 128 * 2
    # FP8 KV cache: a byte an element.
    card = CARDS["qwen2_vl"]
    assert kv_dtype_bytes(card) == 2
    fp8 = card.model_copy(
        update={"reference_engine_args": {**card.reference_engine_args, "kv_cache_dtype": "fp8"}}
    )
    assert kv_dtype_bytes(fp8) == 1


def _hub_cache(root: Path, repo: str, files: dict[str, str]) -> Path:
    """A Hugging Face cache holding `files` of `repo` at one revision, laid out as the hub client
    writes it (refs/main naming the snapshot)."""
    commit = "0" * 40
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


def test_a_hub_model_in_the_hugging_face_cache_is_sized_from_its_own_files(tmp_path: Path, monkeypatch):
    """Qwen2.5-VL 3B: 5.6 GiB guessed from its name, about 7 GiB real; its config.json and
    safetensors index in the cache (as a download leaves them) give the real figures, and vLLM is
    given the reserve exactly."""
    monkeypatch.setenv("HF_HUB_CACHE", "unset")  # the factory sets it: restored after the test
    card = CARDS["qwen2_5_vl"]
    config = {
        "text_config": {
            "hidden_size": 2048,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
        }
    }
    index = {"metadata": {"total_size": 7_509_245_952}, "weight_map": {}}
    _hub_cache(
        tmp_path,
        card.hf_repo,
        {"config.json": json.dumps(config), "model.safetensors.index.json": json.dumps(index)},
    )
    factory = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[24 * GB])
    need = factory.memory_need(card)
    assert (
        need.weights_bytes == 7_509_245_952 and need.weights_from == "safetensors in the Hugging Face cache"
    )
    per_token = 2 * 36 * 2 * 128 * 2
    length, sequences = (
        card.engine_args["max_model_len"],
        card.engine_args.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS),
    )
    assert need.kv_bytes == per_token * length * sequences and need.from_files
    assert factory.engine_args(card)["kv_cache_memory_bytes"] == need.kv_bytes
    # Elsewhere (no cache): a guess from the name, and vLLM sizes the cache within the share.
    bare = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path / "empty"), device_totals=[24 * GB])
    guessed = bare.memory_need(card)
    assert guessed.weights_from == "the repository's name" and not guessed.from_files
    assert "kv_cache_memory_bytes" not in bare.engine_args(card)


def test_reading_facts_from_an_unreachable_hub_stops_at_the_first_model(monkeypatch, caplog):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    factory = VllmEngineFactory(Settings(gpu_count=1), device_totals=[24 * GB])
    with caplog.at_level("INFO", logger="app.engines.vllm_engine"):
        assert factory.read_facts_from_hub(list(CARDS.values())) == 0
    assert [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()] != []
    assert len(caplog.records) == 1


def test_an_engine_is_booked_as_measured_once_built():
    need = estimate_need(CARDS["qwen2_vl"], None, on_gpu=True)
    measured = need.measured(need.per_device + 3 * GIB)
    assert measured.per_device == need.estimated_per_device + 3 * GIB and measured.from_files
    assert measured.asleep_per_device == need.asleep_per_device and measured.asleep_host == need.weights_bytes


def test_the_memory_table_in_the_docs_is_what_the_script_prints(tmp_path: Path):
    """docs/MEMORY.md's table is the script's output on a machine without the Hub (an empty
    Hugging Face cache, offline): a change to the estimator or a card shows there."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    printed = subprocess.run(
        [sys.executable, "bench/memory_table.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = (root / "docs" / "MEMORY.md").read_text()
    table = docs.split("<!-- memory-table:begin -->\n")[1].split("<!-- memory-table:end -->")[0]
    assert printed == table, "docs/MEMORY.md is out of date: regenerate it with the command it gives"
    assert len(printed.splitlines()) > 40


def test_a_chat_gets_a_chat_sized_context_where_the_config_allows_it(tmp_path: Path, monkeypatch):
    """The references' examples give Qwen2.5-VL 4,096 tokens (a few pictures); its config says
    128,000. On a GPU a chat gets APP_CHAT_CONTEXT (16,384), with the reserve counted for it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # the factory sets it: restored after
    card = CARDS["qwen2_5_vl"]
    config = {"text_config": {**text_config(2048, 36, 16, 2), "max_position_embeddings": 128000}}
    index = {"metadata": {"total_size": 7_509_245_952}, "weight_map": {}}
    files = {"config.json": json.dumps(config), "model.safetensors.index.json": json.dumps(index)}
    _hub_cache(tmp_path, card.hf_repo, files)
    factory = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[24 * GB])
    need = factory.memory_need(card)
    sequences = card.engine_args.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS)
    assert card.max_model_len == 4096 and need.context_tokens == 16384
    assert need.kv_bytes == 2 * 36 * 2 * 128 * 2 * 16384 * sequences
    args = factory.engine_args(card)
    assert args["max_model_len"] == 16384 and args["kv_cache_memory_bytes"] == need.kv_bytes
    smaller = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path, chat_context=8192), [24 * GB])
    assert smaller.engine_args(card)["max_model_len"] == 8192
    # On the CPU backend the card's own length stays (the twins' and demo models' tests rely on it).
    cpu = VllmEngineFactory(Settings(gpu_count=0, hf_cache=tmp_path))
    assert cpu.engine_args(card)["max_model_len"] == 4096


def test_the_chat_context_never_lets_the_kv_reserve_outweigh_the_weights():
    phi = CARDS["phi3_v"]  # 4,096 in its card, 131,072 in its config, no grouped-query attention
    config = {**PHI_3_5_VISION, "max_position_embeddings": 131072}
    weights = int(8.3 * GB)
    # 16,384 tokens x 2 sequences x 393 KB = 12 GiB > 8.3 GB of weights; 8,192 tokens: 6 GiB.
    assert chat_length(phi, config, weights, 16384) == 8192
    assert chat_length(phi, config, weights, 2048) == 4096  # never below the card's own
    assert chat_length(phi, None, weights, 16384) == 4096  # no config: the card's
    assert chat_length(phi, {**config, "max_position_embeddings": 4096}, weights, 16384) == 4096
    # Its real config scales rope the long way past 4,096 tokens (every sequence then uses the
    # long factors, which vLLM warns degrade short ones): it keeps 4,096.
    longrope = {**config, "rope_scaling": {"type": "longrope"}, "original_max_position_embeddings": 4096}
    assert native_context(longrope) == 4096 and chat_length(phi, longrope, weights, 16384) == 4096
    # A tokenizer's limit counts as vLLM counts it.
    assert native_context({**config, "model_max_length": 8192}) == 8192
    # A card that leaves the length to vLLM gets a chat-sized one, not the model's whole context.
    paligemma = CARDS["paligemma"]
    assert paligemma.max_model_len is None
    gemma = {"text_config": {**text_config(2048, 18, 8, 1), "max_position_embeddings": 8192}}
    assert chat_length(paligemma, gemma, 6 * GB, 16384) == 8192
    assert native_context({"text_config": {"seq_length": 8192, "max_position_embeddings": 32768}}) == 8192


def test_the_caches_config_and_the_hubs_weights_are_combined_and_moe_is_never_counted_from_config(
    tmp_path: Path, monkeypatch
):
    """Qwen3-VL-30B-A3B: the config alone in the cache (a tokenizer load leaves it) counts a
    third of the weights (its experts are not in the formula); the Hub's safetensors headers give
    them all. Before, the config's count won and the Hub's figure was thrown away."""
    from app.engines import vllm_engine

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    card = CARDS["qwen3_vl_moe"]
    config = {"text_config": {**text_config(2048, 48, 32, 4), "head_dim": 128, "num_experts": 128}}
    _hub_cache(tmp_path, card.hf_repo, {"config.json": json.dumps(config)})
    factory = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[80 * GB])
    alone = factory.memory_need(card)
    assert alone.weights_from == "the repository's name" and not alone.from_files  # not the config's count
    assert alone.kv_from_config
    hub = ModelFacts(None, 62 * GB, "the Hub")
    monkeypatch.setattr(vllm_engine, "facts_from_hub", lambda repo, revision, cache: hub)
    assert factory.read_facts_from_hub([card]) == 1  # the config was cached, the weights were not
    need = factory.memory_need(card)
    assert need.weights_bytes == 62 * GB and need.weights_from == "safetensors in the Hub" and need.from_files


def test_files_that_cannot_be_read_never_stop_the_sizing(tmp_path: Path, monkeypatch):
    """A broken link in the cache, a config with a field of the wrong type, shards without their
    index (a download under way): the model is sized from its card, and no figure is taken from
    part of its weights."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    card = CARDS["qwen2_vl"]
    config = {"text_config": {**text_config(3584, 28, 28, 4), "num_kv_shared_layers": "two"}}
    snapshot = _hub_cache(tmp_path, card.hf_repo, {"config.json": json.dumps(config)})
    (snapshot / "model-00001-of-00005.safetensors").write_bytes(b"x" * 1000)
    (snapshot / "model-00002-of-00005.safetensors").symlink_to(tmp_path / "gone")
    factory = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[80 * GB])
    need = factory.memory_need(card)
    assert need.weights_from == "the repository's name" and not need.kv_from_config
    assert weights_on_disk(snapshot) is None


def test_tensor_parallel_kv_is_split_by_heads_and_latent_attention_is_kept_whole():
    card = CARDS["NVLM_D"]  # four GPUs
    assert card.gpus_needed == 4
    few_heads = {"text_config": text_config(8192, 80, 64, 2)}
    need = estimate_need(card, None, on_gpu=True, facts=ModelFacts(few_heads, 150 * GB, "the Hub"))
    assert need.kv_per_device == math.ceil(need.kv_bytes / 2)  # two heads: each on two GPUs
    latent = {"text_config": {**text_config(8192, 80, 64, 64), "kv_lora_rank": 512, "qk_rope_head_dim": 64}}
    need = estimate_need(card, None, on_gpu=True, facts=ModelFacts(latent, 150 * GB, "the Hub"))
    assert need.kv_per_device == need.kv_bytes


def test_an_answer_from_the_hub_for_one_file_does_not_stop_the_reading():
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from app.engines.vllm_engine import _unreachable

    limited = HfHubHTTPError(
        "429", response=httpx.Response(429, request=httpx.Request("GET", "https://hf.co"))
    )
    try:
        raise LocalEntryNotFoundError("no local copy") from limited
    except LocalEntryNotFoundError as error:
        assert not _unreachable(error)
    assert _unreachable(LocalEntryNotFoundError("no network"))
    assert _unreachable(httpx.ConnectError("no route"))


def test_a_sleeping_engines_shutdown_waits_only_for_what_it_still_holds(monkeypatch):
    """An engine took 20 GB on GPU 1; asleep it gave 17 GB back. Its shutdown used to wait for
    all 20 GB to drop from a reading where only 3 GB were still its own: a minute's timeout at
    every unload of a sleeper (NVML readings simulated: no GPU here)."""
    import asyncio
    from types import SimpleNamespace

    from app.engines import vllm_engine
    from app.engines.vllm_engine import VllmEngine

    async def asleep(level: int) -> None:
        pass

    fake = SimpleNamespace(
        get_tokenizer=lambda: None,
        engine_core=SimpleNamespace(resources=None),
        sleep=asleep,
        shutdown=lambda: None,
    )
    readings = iter([[5 * GB, 30 * GB], [5 * GB, 13 * GB], [5 * GB, 13 * GB]])
    monkeypatch.setattr(vllm_engine, "gpu_memory", lambda kind: next(readings))
    waited = {}
    monkeypatch.setattr(
        vllm_engine, "wait_for_memory_freed", lambda before, held: waited.update(held) or True
    )
    engine = VllmEngine(fake, None, None, footprint={1: 20 * GB})
    asyncio.run(engine.sleep())
    asyncio.run(engine.shutdown())
    assert waited == {1: 3 * GB}


def test_the_chat_context_is_cut_to_what_fits_the_gpu_and_registered_before_the_build(
    tmp_path: Path, monkeypatch
):
    """Qwen2-VL 7B on a 24 GB card (21.6 GB budget): 16,384 tokens for 5 sequences would need
    24.5 GB and the model would be refused; it keeps the card's 4,096 (8,192 would need 22.2 GB).
    On a 26 GB card it gets 8,192. The size check uses that context from the first message on,
    before any engine is built."""
    from app.engines.tokens import context_length, register_context

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    card = CARDS["qwen2_vl"]
    config = {"text_config": {**text_config(3584, 28, 28, 4), "max_position_embeddings": 32768}}
    index = {"metadata": {"total_size": 16_582_751_232}, "weight_map": {}}
    _hub_cache(
        tmp_path,
        card.hf_repo,
        {"config.json": json.dumps(config), "model.safetensors.index.json": json.dumps(index)},
    )
    roomy = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[80 * 10**9])
    assert roomy.memory_need(card).context_tokens == 16384
    small = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[24 * 10**9])
    need = small.memory_need(card)
    assert need.context_tokens == 4096 and need.per_device <= small.capacity().device_budgets[0]
    factory = VllmEngineFactory(Settings(gpu_count=1, hf_cache=tmp_path), device_totals=[26 * 10**9])
    try:
        need = factory.memory_need(card)
        assert need.context_tokens == 8192 and need.per_device <= factory.capacity().device_budgets[0]
        assert context_length(card) == 8192
    finally:
        register_context(card.key, None)


def test_a_context_vllm_refuses_is_retried_at_the_cards_own():
    from app.engines.vllm_engine import _longer_than_derived

    card = CARDS["qwen2_vl"]
    refusal = ValueError(
        "User-specified max_model_len (16384) is greater than the derived max_model_len "
        "(max_position_embeddings=8192 in model's config.json)."
    )
    assert _longer_than_derived(refusal, {"max_model_len": 16384}, card)
    assert not _longer_than_derived(refusal, {"max_model_len": 4096}, card)  # the card's own
    assert not _longer_than_derived(RuntimeError("CUDA out of memory"), {"max_model_len": 16384}, card)


class SimulatedNvml:
    """NVML as the H200 lent on 2026-11-29 answered it (bench/gpu_check --readings), for one or
    more GPUs: a simulation, since this machine has no GPU. The driver reserves memory that NVML's
    first memory call counts as used and in the total, and that CUDA never hands out."""

    nvmlMemory_v2 = 2

    def __init__(self, uuids: list[str], total: int = 150_754_820_096, reserved: int = 645_464_064) -> None:
        self.uuids, self.total, self.reserved = uuids, total, reserved
        self.totals = [total] * len(uuids)
        self.used = [0] * len(uuids)
        self.has_v2 = True

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        # As the real one answered: the whole UUID, with or without "GPU-" (not a prefix).
        for index, known in enumerate(self.uuids):
            if uuid in (known, known.removeprefix("GPU-")):
                return index
        raise RuntimeError("Not Found")

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuids[handle]

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int = 1) -> Any:
        used, total = self.used[handle], self.totals[handle]
        if version == self.nvmlMemory_v2:
            if not self.has_v2:
                raise RuntimeError("Function Not Found")  # an older driver
            return SimpleNamespace(total=total, reserved=self.reserved, used=used)
        return SimpleNamespace(total=total, used=used + self.reserved)


H200_UUIDS = ["GPU-b8165666-1092-95bb-2e75-a9fdb498f280", "GPU-0f2a9c41-5d3e-4b7a-9c1d-2e8f6a7b3c90"]


def test_cuda_visible_devices_are_read_as_cuda_reads_them(monkeypatch):
    """CUDA takes a GPU's UUID prefix ("GPU-b8165666" made one GPU visible on the H200) and stops
    at an entry it cannot read (a UUID without "GPU-" made none visible). The app must name the
    same GPUs, or it measures and places engines on the wrong one, or on none."""
    monkeypatch.setitem(sys.modules, "pynvml", SimulatedNvml(H200_UUIDS))
    assert visible_devices({"CUDA_VISIBLE_DEVICES": H200_UUIDS[1]}) == [1]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-0f2a9c41,GPU-b8165666"}) == [1, 0]
    # The rules CUDA follows, as torch mirrors them: the first entry decides the kind of list, an
    # empty entry ends it, and a GPU named twice leaves none.
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-b8165666-1092-95bb-2e75-a9fdb498f280,1"}) == [0]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,,0"}) == [1]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,0,1"}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-b816,GPU-b8165666"}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "b8165666-1092-95bb-2e75-a9fdb498f280"}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,GPU-zzzz,0"}) == [1]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0,2,1"}) == [0]  # there is no third GPU
    # "GPU-" alone made the H200 invisible to CUDA; a prefix of both GPUs' UUIDs names no one GPU:
    # the app stops there rather than guess.
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-"}) == []
    monkeypatch.setitem(
        sys.modules, "pynvml", SimulatedNvml([H200_UUIDS[0], "GPU-b8170000-0000-0000-0000-000000000000"])
    )
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-b816,GPU-b81"}) == [0]


def test_gpu_memory_leaves_out_what_the_driver_reserves(monkeypatch):
    """NVML's total counts 0.6 GiB on the H200 that CUDA never hands out (its total was 139.80 GiB
    against NVML's 140.40), so a budget of 0.9 of NVML's total was 0.54 GiB too generous; and its
    'used' counted the same 0.6 GiB on an idle GPU, which nvidia-smi shows as 0 MiB."""
    nvml = SimulatedNvml(H200_UUIDS[:1])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert gpu_memory("total") == [nvml.total - nvml.reserved]
    assert gpu_memory("used") == [0]
    nvml.used = [8 * 2**30]
    assert gpu_memory("used") == [8 * 2**30]
    assert measured_gpu_memory() == [8 * 2**30]
    nvml.has_v2 = False  # an older driver: its one call's figures, the reserve in them
    assert gpu_memory("total") == [nvml.total] and gpu_memory("used") == [8 * 2**30 + nvml.reserved]


def test_the_factory_sizes_the_gpus_cuda_visible_devices_names(monkeypatch):
    """The budget is a share of each of the app's GPUs, those CUDA_VISIBLE_DEVICES names in its
    order; an entry past what CUDA reads gives the app no GPU there, whatever the count says."""
    nvml = SimulatedNvml(H200_UUIDS)
    nvml.totals = [80 * 2**30, 48 * 2**30]
    nvml.reserved = 0
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert VllmEngineFactory(Settings(gpu_count=1)).device_totals() == [48 * 2**30]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-b8165666,GPU-zzzz")
    factory = VllmEngineFactory(Settings(gpu_count=2))
    assert factory.device_totals() == [80 * 2**30]
    assert factory._visible((0,)) == "0" and factory._visible((1,)) == ""


def test_the_metrics_number_gpus_as_the_app_does(monkeypatch):
    """With CUDA_VISIBLE_DEVICES=1 the app's GPU 0 is NVML's GPU 1, and the booked memory is
    reported as device 0: what NVML measures must be reported under the same number."""
    nvml = SimulatedNvml(H200_UUIDS)
    nvml.used = [40 * 2**30, 5 * 2**30]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert measured_gpu_memory() == [5 * 2**30]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert measured_gpu_memory() == [40 * 2**30, 5 * 2**30]
