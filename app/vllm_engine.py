"""Engines for the manager: vLLM's `AsyncLLM` in this process, or a remote vLLM server.

`AsyncLLM` runs its engine core in a child process; this process renders prompts, turns media
into vLLM's inputs and streams delta outputs. vLLM and torch are imported only when the first
engine is built, so the UI process starts without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from app.adapters import ChatTemplateOwner, PromptError, RenderedPrompt, render
from app.cards import ModelCard
from app.config import Settings
from app.engine import EngineError, EngineFailure, SamplingSettings, StreamEnd, TextDelta, first_line
from app.remote_engine import RemoteEngine

log = logging.getLogger(__name__)

# GPU memory still in use after a shutdown that counts as "back" (CUDA context, other tenants).
GPU_MEMORY_SLACK_BYTES = 512 * 2**20
MEMORY_RETURN_TIMEOUT_S = 60.0


class VllmEngineFactory:
    """Builds an engine for a card: remote where the card or settings name a server, else local."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        if settings.hf_cache is not None:
            # Tokenizers, processors and configs load through the hub cache, in this process
            # and in the engine processes it starts; weights follow `download_dir`.
            os.environ["HF_HUB_CACHE"] = str(settings.hf_cache)

    def engine_args(self, card: ModelCard) -> dict[str, Any]:
        """The card's engine arguments with this deployment's settings applied."""
        settings = self._settings
        args = card.engine_args
        folder = settings.model_folders.get(card.key)
        if folder is not None:
            if args.get("tokenizer") == args["model"]:
                args["tokenizer"] = str(folder)
            args["model"] = str(folder)
        args["enforce_eager"] = settings.eager
        if settings.gpu_count == 0:
            args["kv_cache_memory_bytes"] = settings.cpu_kv_cache_bytes
        else:
            share = self._gpu_share()
            args["gpu_memory_utilization"] = min(share, args.get("gpu_memory_utilization", share))
            args["enable_sleep_mode"] = True
        if settings.hf_cache is not None:
            args["download_dir"] = str(settings.hf_cache)
        return args

    def _gpu_share(self) -> float:
        """Each resident engine's fraction of a GPU: the budget split over the residency limit."""
        budget = self._settings.memory_budget
        fraction = budget.fraction
        if budget.bytes is not None:
            fraction = budget.bytes / _gpu_total_bytes()
        return max(0.05, min(0.95, (fraction or 0.9) / self._settings.max_resident))

    async def build(self, card: ModelCard, report: Callable[[str], None]) -> Any:
        remote_url = self._settings.remote_engines.get(card.key) or card.remote_url
        if remote_url:
            report(f"connecting to {remote_url}")
            return await RemoteEngine.connect(remote_url, card)
        args = self.engine_args(card)
        report("starting the engine: weights, memory profiling, KV cache")
        gpu_used_before = _gpu_used_bytes() if self._settings.gpu_count else None
        try:
            engine = await asyncio.to_thread(_start_async_llm, args)
        except Exception as error:
            raise EngineError(explain_build_error(card, error)) from error
        report("loading the chat template")
        try:
            owner = await asyncio.to_thread(_chat_template_owner, engine, card, args)
            lora = await asyncio.to_thread(_lora_request, card, args)
        except Exception as error:
            await asyncio.to_thread(engine.shutdown)
            raise EngineError(explain_build_error(card, error)) from error
        return VllmEngine(engine, owner, lora, gpu_used_before)


def _start_async_llm(args: dict[str, Any]) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))


def _chat_template_owner(engine: Any, card: ModelCard, args: dict[str, Any]) -> ChatTemplateOwner:
    if card.chat_template_owner == "processor":
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(
            args["model"],
            revision=args.get("revision"),
            trust_remote_code=args.get("trust_remote_code", False),
        )
        return ProcessorTemplate(processor)
    return engine.get_tokenizer()


def _lora_request(card: ModelCard, args: dict[str, Any]) -> Any:
    if card.lora is None:
        return None
    from huggingface_hub import snapshot_download
    from vllm.lora.request import LoRARequest

    model = Path(args["model"])
    root = model if model.is_dir() else Path(snapshot_download(args["model"], revision=args.get("revision")))
    return LoRARequest(card.lora.name, card.lora.id, str(root / card.lora.subpath))


class ProcessorTemplate:
    """A processor's chat template with its tokenizer's token ids (what the adapters call)."""

    def __init__(self, processor: Any) -> None:
        self._processor = processor
        self.eos_token_id = getattr(processor.tokenizer, "eos_token_id", None)

    def apply_chat_template(
        self, conversation: Any, tokenize: bool = False, add_generation_prompt: bool = True
    ) -> Any:
        return self._processor.apply_chat_template(
            conversation, tokenize=tokenize, add_generation_prompt=add_generation_prompt
        )

    def convert_tokens_to_ids(self, tokens: str) -> Any:
        return self._processor.tokenizer.convert_tokens_to_ids(tokens)


class VllmEngine:
    """An `AsyncLLM` serving one card: renders, streams deltas, aborts, sleeps, shuts down."""

    resident = True

    def __init__(self, engine: Any, owner: ChatTemplateOwner, lora: Any, gpu_used_before: int | None) -> None:
        self._engine = engine
        self._owner = owner
        self._lora = lora
        self._gpu_used_before = gpu_used_before
        manager = getattr(engine.engine_core, "resources", None)
        processes = getattr(getattr(manager, "engine_manager", None), "processes", [])
        self.process_ids = [p.pid for p in processes if p.pid is not None]

    @property
    def can_sleep(self) -> bool:
        """Sleep mode (CUDA only) where the host has room for the weights it moves there."""
        config = self._engine.vllm_config
        if not config.model_config.enable_sleep_mode:
            return False
        import psutil

        weights = _folder_bytes(Path(config.model_config.model))
        return weights is not None and psutil.virtual_memory().available > 1.5 * weights

    def unfinished_requests(self) -> int:
        return self._engine.get_num_unfinished_requests()

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def generate(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[TextDelta | StreamEnd]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        rendered = render(card, messages, self._owner)
        params = SamplingParams(
            **{
                **card.sampling_defaults,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "max_tokens": sampling.max_tokens,
                "seed": sampling.seed,
                "ignore_eos": sampling.ignore_eos,
                "stop_token_ids": rendered.stop_token_ids or None,
                "output_kind": RequestOutputKind.DELTA,
            }
        )
        outputs = self._engine.generate(
            engine_prompt(card, rendered), params, request_id, lora_request=self._lora
        )
        prompt_tokens = completion_tokens = 0
        finished = False
        try:
            async for output in outputs:
                prompt_tokens = prompt_tokens or len(output.prompt_token_ids or ())
                completion = output.outputs[0]
                completion_tokens += len(completion.token_ids)
                if completion.text:
                    yield TextDelta(completion.text)
                if output.finished:
                    finished = True
                    yield StreamEnd(
                        completion.finish_reason or "stop", prompt_tokens, completion_tokens, rendered.prompt
                    )
        except EngineDeadError:
            raise EngineFailure(
                f"{card.display_name} stopped unexpectedly (its engine process died); "
                "send the message again to restart it."
            ) from None
        except EngineGenerateError as error:
            raise EngineError(f"{card.display_name} could not answer: {_first_line(error)}") from None
        except ValueError as error:
            # vLLM validates the prompt (length, media) as the request is added.
            raise PromptError(f"{card.display_name} cannot take this input: {_first_line(error)}") from None
        finally:
            await outputs.aclose()
            if not finished:
                with contextlib.suppress(Exception):
                    await self._engine.abort(request_id)

    async def sleep(self) -> None:
        await self._engine.sleep(level=1)

    async def wake(self) -> None:
        await self._engine.wake_up()

    async def shutdown(self) -> None:
        # Stopped first: it would otherwise log the engine's exit as a crash.
        handler = getattr(self._engine, "output_handler", None)
        if handler is not None:
            handler.cancel()
        await asyncio.to_thread(self._engine.shutdown)
        await asyncio.to_thread(_wait_for_exit, self.process_ids)
        if self._gpu_used_before is not None:
            await asyncio.to_thread(_wait_for_gpu_memory, self._gpu_used_before + GPU_MEMORY_SLACK_BYTES)


def engine_prompt(card: ModelCard, rendered: RenderedPrompt) -> dict[str, Any]:
    """vLLM's prompt dict: media in order, videos with their metadata where the model uses it,
    and images' content hashes as ids so a picture repeated across turns hits vLLM's caches."""
    data: dict[str, Any] = {}
    uuids: dict[str, Any] = {}
    if rendered.images:
        data["image"] = rendered.images
        hashes = [getattr(image, "info", {}).get("content_hash") for image in rendered.images]
        if all(hashes):
            uuids["image"] = hashes
    if rendered.videos:
        data["video"] = [_video_input(video, card.video_metadata) for video in rendered.videos]
    prompt: dict[str, Any] = {"prompt": rendered.prompt}
    if data:
        prompt["multi_modal_data"] = data
    if uuids:
        prompt["multi_modal_uuids"] = uuids
    return prompt


def _video_input(video: Any, with_metadata: bool) -> Any:
    """A `VideoClip` (frames, metadata, timestamps), a (frames, metadata) pair, or frames."""
    if isinstance(video, tuple) and len(video) >= 2:
        frames, metadata = video[0], video[1]
        return (frames, metadata) if with_metadata else frames
    return video


def explain_build_error(card: ModelCard, error: BaseException) -> str:
    """What went wrong in a build, in one line a user can act on (no paths, no traceback)."""
    text = " ".join(str(e) for e in _causes(error))
    name = card.display_name
    if re.search(r"out of memory|OutOfMemory|CUDA error: out of memory", text, re.IGNORECASE):
        return (
            f"{name} does not fit in GPU memory with the other models loaded; unload one or raise the budget."
        )
    if re.search(r"LocalEntryNotFound|offline|couldn't connect|Cannot find|not found in the cached", text):
        return (
            f"{name}: the model files are not on this machine and the Hugging Face hub cannot be "
            "reached; download them first or map the card to a folder (APP_MODEL_FOLDERS)."
        )
    if re.search(r"gated repo|401|403|access to model", text, re.IGNORECASE):
        return f"{name}: the model repository needs a Hugging Face token with access (HF_TOKEN)."
    return f"{name} could not be loaded: {_first_line(error)}"


def _causes(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _first_line(error: BaseException) -> str:
    """The error's first line with file paths hidden, capped for a status line."""
    return re.sub(r"(?<![\w.])/[\w./-]+", "<path>", first_line(error))[:300]


def _folder_bytes(folder: Path) -> int | None:
    if not folder.is_dir():
        return None
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) or None


def _wait_for_exit(process_ids: list[int], timeout_s: float = 30.0) -> None:
    """Waits for the engine's processes to exit, killing those that outlive the timeout."""
    import psutil

    processes = []
    for pid in process_ids:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        log.warning("engine process %s outlived its shutdown; killing it", process.pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=5)


def process_tree_memory() -> tuple[int, int]:
    """Resident memory of this process and all its children, and how many children: what
    unloading must give back."""
    import psutil

    me = psutil.Process()
    children = me.children(recursive=True)
    rss = me.memory_info().rss
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += child.memory_info().rss
    return rss, len(children)


def _gpu_total_bytes() -> int:
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total


def _gpu_used_bytes() -> int | None:
    """Memory in use on the visible GPUs, measured by NVML (no CUDA context in this process)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        indices = [
            int(i) for i in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if i.strip().isdigit()
        ]
        return sum(
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in indices or [0]
        )
    except Exception:
        log.warning("cannot read GPU memory through NVML; not waiting for it after unloads")
        return None


def _wait_for_gpu_memory(limit_bytes: int) -> None:
    deadline = time.monotonic() + MEMORY_RETURN_TIMEOUT_S
    while (used := _gpu_used_bytes()) is not None and used > limit_bytes:
        if time.monotonic() > deadline:
            log.warning(
                "GPU memory still %d MiB above its level before the build", (used - limit_bytes) >> 20
            )
            return
        time.sleep(0.2)
