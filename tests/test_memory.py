"""Memory sizing for the scheduler (`app.engines.memory`) and the memory check after an engine stops
(`app.engines.vllm_engine.wait_for_memory_freed`), on the real catalog and real model folders."""

from __future__ import annotations

import json
from pathlib import Path

from app.catalog.cards import load_cards
from app.engines.memory import (
    GPU_ENGINE_OVERHEAD_BYTES,
    estimate_need,
    kv_bytes_per_token,
    parameters_from_config,
    parameters_from_name,
)
from app.engines.vllm_engine import visible_devices, wait_for_memory_freed

CARDS = load_cards()
GB = 10**9


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
