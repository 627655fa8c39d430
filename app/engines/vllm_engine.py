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
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.catalog.adapters import ChatTemplateOwner, PromptError, RenderedPrompt
from app.catalog.cards import ModelCard
from app.config import Settings
from app.engines.base import (
    EngineError,
    EngineFailure,
    SamplingSettings,
    StreamEnd,
    TextDelta,
    explain_refusal,
    first_line,
)
from app.engines.gpus import gpu_memory, process_gpu_memory, visible_devices
from app.engines.memory import (
    MemoryNeed,
    ModelFacts,
    estimate_need,
    facts_from_hub,
    facts_in_hub_cache,
    merged,
)
from app.engines.remote_engine import RemoteEngine
from app.engines.scheduler import Capacity
from app.engines.tokens import (
    LiteralPrompt,
    ProcessorTemplate,
    PromptCounter,
    register_context,
    register_counter,
    register_folder,
    render_literal,
)

log = logging.getLogger(__name__)

# GPU memory still in use after a shutdown that counts as "back" (CUDA context, other tenants).
GPU_MEMORY_SLACK_BYTES = 512 * 2**20
MEMORY_RETURN_TIMEOUT_S = 60.0
# Seconds before a model the Hugging Face cache did not hold whole is looked for there again.
FACTS_RECHECK_S = 10.0
# Room above a measured footprint in the share vLLM checks is free at a rebuild.
MEASURED_SLACK_BYTES = 512 * 2**20


class VllmEngineFactory:
    """Builds an engine for a card: remote where the card or settings name a server, else local.

    It also tells the scheduler what engines may use (`capacity`) and what each takes
    (`memory_need`), and applies the scheduler's placement: each engine gets its own share of
    the GPUs it is placed on, sized from its need, not an equal split.
    """

    def __init__(self, settings: Settings, device_totals: Sequence[int] | None = None) -> None:
        """`device_totals`: each GPU's memory in bytes where NVML should not be asked (checks)."""
        self._settings = settings
        if settings.hf_cache is not None:
            # Tokenizers, processors and configs load through the hub cache, in this process
            # and in the engine processes it starts; weights follow `download_dir`.
            os.environ["HF_HUB_CACHE"] = str(settings.hf_cache)
        if settings.gpu_count:
            # CUDA numbers devices fastest first unless told otherwise; NVML numbers them by
            # PCI bus. Both must agree for placement and memory checks to name the same GPU.
            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self._device_totals: list[int] | None = list(device_totals) if device_totals is not None else None
        for key, folder in settings.model_folders.items():
            # The size check counts with the tokenizer in the folder before the engine is built.
            register_folder(key, folder)
        # Hub models' facts read from the Hub at start (`read_facts_from_hub`), by card key.
        self._hub_facts: dict[str, ModelFacts] = {}
        # What the Hugging Face cache held of each model at its last look, and when.
        self._cache_facts: dict[str, tuple[ModelFacts | None, float]] = {}
        # What each model's last build took on its busiest GPU, measured: rebuilds ask vLLM for it.
        self._measured: dict[str, int] = {}
        # The context each model's engine was built with (the registry holds it from then on).
        self._built_context: dict[str, int] = {}

    def device_totals(self) -> list[int]:
        """Each visible GPU's memory (NVML), or the machine's RAM where there is no GPU."""
        if self._device_totals is None:
            if self._settings.gpu_count == 0:
                import psutil

                self._device_totals = [psutil.virtual_memory().total]
            else:
                # The app's GPUs are those CUDA_VISIBLE_DEVICES names, in its order.
                totals = gpu_memory("total") or []
                physical = self._physical(tuple(range(self._settings.gpu_count)))
                self._device_totals = [totals[i] for i in physical if i < len(totals)]
                if not self._device_totals:
                    raise EngineError(
                        "The GPUs' memory cannot be read (NVML); set APP_MEMORY_BUDGET in bytes."
                    )
        return self._device_totals

    def capacity(self) -> Capacity:
        import psutil

        budget = self._settings.memory_budget
        ram = psutil.virtual_memory().total
        if self._settings.gpu_count == 0:
            # Engines on the CPU share the host with the app: half of it unless told in bytes.
            return Capacity((budget.bytes or ram // 2,), host_budget=0)
        totals = self.device_totals()
        per_device = tuple(budget.bytes or int((budget.fraction or 0.9) * total) for total in totals)
        host = self._settings.host_memory_budget or ram // 2
        return Capacity(per_device, host_budget=host)

    def memory_need(self, card: ModelCard) -> MemoryNeed | None:
        if self._is_remote(card):
            return None
        folder = self._settings.model_folders.get(card.key)
        on_gpu = self._settings.gpu_count > 0
        try:
            facts = None if folder is not None else self._facts(card)
            need = estimate_need(
                card,
                folder,
                on_gpu=on_gpu,
                cpu_kv_cache_bytes=self._settings.cpu_kv_cache_bytes,
                facts=facts,
                chat_context=self._settings.chat_context,
                media_cache_bytes=self._settings.media_cache_bytes,
                device_budget=self._smallest_budget() if on_gpu else None,
            )
            if need.context_tokens is not None and card.key not in self._built_context:
                # The size check and the page count with the context the engine will be built
                # with, before its first build (a build registers what it really got).
                register_context(card.key, need.context_tokens)
            return need
        except Exception:
            # Files that cannot be read as expected must not stop the scheduling of every model.
            log.warning("sizing %s from its files failed; sized from its card", card.key, exc_info=True)
            return estimate_need(card, None, on_gpu, self._settings.cpu_kv_cache_bytes)

    def _smallest_budget(self) -> int | None:
        """What an engine may take of the smallest GPU it could be placed on (None where the
        GPUs' memory cannot be read)."""
        try:
            budgets = sorted(self.capacity().device_budgets)
        except Exception:
            return None
        return budgets[0] if budgets else None

    def _facts(self, card: ModelCard) -> ModelFacts | None:
        """A Hub model's facts: the Hugging Face cache's (its config, and its weights where they
        are all there), each missing figure from what was read of the Hub. A look in the cache
        that finds the model incomplete is repeated at most every few seconds (the scheduler asks
        at every step; a download may be under way)."""
        if Path(card.hf_repo).is_absolute():
            return None
        now = time.monotonic()
        known = self._cache_facts.get(card.key)
        complete = known is not None and known[0] is not None and known[0].weights_bytes is not None
        if known is None or (not complete and now - known[1] > FACTS_RECHECK_S):
            known = (facts_in_hub_cache(card.hf_repo, card.revision, self._settings.hf_cache), now)
            self._cache_facts[card.key] = known
        return merged(known[0], self._hub_facts.get(card.key))

    def _is_remote(self, card: ModelCard) -> bool:
        return bool(self._settings.remote_engines.get(card.key) or card.remote_url)

    def read_facts_from_hub(self, cards: Sequence[ModelCard]) -> int:
        """Reads each Hub model's config and weights' size from the Hub (kilobytes each), for
        the models whose files are not on this machine yet, so that the scheduler sizes them from
        their own numbers before their first build. Stops at the first model the Hub does not
        answer for a network reason (an offline box). Returns how many were read."""
        read = 0
        for card in cards:
            if self._is_remote(card) or card.key in self._settings.model_folders:
                continue
            if Path(card.hf_repo).is_absolute() or card.key in self._hub_facts:
                continue
            cached = facts_in_hub_cache(card.hf_repo, card.revision, self._settings.hf_cache)
            if cached is not None and cached.weights_bytes is not None and cached.config is not None:
                continue  # the whole model is on this machine
            try:
                facts = facts_from_hub(card.hf_repo, card.revision, self._settings.hf_cache)
            except Exception as error:
                if _unreachable(error):
                    log.info("the Hub cannot be reached (%s): models sized by estimate", first_line(error))
                    break
                log.info("no facts for %s from the Hub: %s", card.key, first_line(error))
                continue
            self._hub_facts[card.key] = facts
            read += 1
        return read

    def engine_args(self, card: ModelCard, devices: tuple[int, ...] = (0,)) -> dict[str, Any]:
        """The card's engine arguments with this deployment's settings applied: the model's
        folder, eager mode where the card does not ask for it itself (a card's
        `enforce_eager: true` is never turned off), and memory sized from the model's need."""
        settings = self._settings
        args = card.engine_args
        folder = settings.model_folders.get(card.key)
        if folder is not None:
            if args.get("tokenizer") == args["model"]:
                args["tokenizer"] = str(folder)
            args["model"] = str(folder)
        args["enforce_eager"] = bool(args.get("enforce_eager")) or settings.eager
        need = self.memory_need(card)
        if settings.gpu_count == 0:
            args["kv_cache_memory_bytes"] = settings.cpu_kv_cache_bytes
        elif need is not None:
            totals = self.device_totals()
            smallest = min(totals[d] for d in devices) if devices else totals[0]
            # vLLM refuses to start unless this share of the GPU is free: after a first build,
            # what that build took (and some room), as the scheduler books it.
            share = need.per_device
            if card.key in self._measured:
                share = min(share, self._measured[card.key] + MEASURED_SLACK_BYTES)
            args["gpu_memory_utilization"] = round(min(0.95, max(0.05, share / smallest)), 4)
            if need.context_tokens is not None:
                # A chat-sized context where the config allows it (the reserve is sized for it).
                args["max_model_len"] = need.context_tokens
            if need.kv_from_config:
                # Per GPU: the reserve from max_model_len and max_num_seqs (the config's arithmetic,
                # so it holds them), not what profiling leaves. Without a config the reserve is a
                # guess: vLLM then sizes the KV cache itself within the share above.
                args["kv_cache_memory_bytes"] = max(1, need.kv_per_device)
            args["enable_sleep_mode"] = True
        args.setdefault("mm_processor_cache_gb", settings.media_cache_bytes / 2**30)
        if settings.hf_cache is not None:
            args["download_dir"] = str(settings.hf_cache)
        if settings.load_format is not None:
            args["load_format"] = settings.load_format
        if settings.tensor_parallel_size is not None:
            args["tensor_parallel_size"] = settings.tensor_parallel_size
        return args

    async def build(
        self, card: ModelCard, report: Callable[[str], None], devices: tuple[int, ...] = (0,)
    ) -> Any:
        remote_url = self._settings.remote_engines.get(card.key) or card.remote_url
        if remote_url:
            report(f"connecting to {remote_url}")
            return await RemoteEngine.connect(remote_url, card)
        args = self.engine_args(card, devices)
        report("starting the engine: weights, memory profiling, KV cache")
        used_before = gpu_memory("used") if self._settings.gpu_count else None
        try:
            engine = await asyncio.to_thread(_start_async_llm, args, self._visible(devices))
        except Exception as error:
            if not _longer_than_derived(error, args, card):
                raise EngineError(explain_build_error(card, error)) from error
            # vLLM derives the model's context from its config in ways the app's reading can
            # miss (class defaults, tokenizer limits): the chat-sized context goes, the card's stays.
            log.warning(
                "%s refused %s tokens of context; built with its card's", card.key, args["max_model_len"]
            )
            args["max_model_len"] = card.max_model_len
            try:
                engine = await asyncio.to_thread(_start_async_llm, args, self._visible(devices))
            except Exception as again:
                raise EngineError(explain_build_error(card, again)) from again
        report("loading the chat template")
        try:
            owner = await asyncio.to_thread(_chat_template_owner, engine, card, args)
            lora = await asyncio.to_thread(_lora_request, card, args)
            tokenizer = engine.get_tokenizer()
        except Exception as error:
            await asyncio.to_thread(shut_down, engine)
            raise EngineError(explain_build_error(card, error)) from error
        footprint = None
        used_after = gpu_memory("used") if used_before is not None else None
        if used_before is not None and used_after is not None:
            physical = self._physical(devices)
            footprint = {d: max(0, used_after[d] - used_before[d]) for d in physical if d < len(used_after)}
            # Where NVML tells each process's memory: the engine's own processes' (other engines'
            # memory coming or going during the build then does not count).
            footprint = process_gpu_memory(engine_process_ids(engine), physical) or footprint
            if footprint:
                self._measured[card.key] = max(footprint.values())
        counter = PromptCounter(card, tokenizer, owner)
        # From now on the size check counts with the engine's own tokenizer, within its context.
        register_counter(card.key, counter)
        self._built_context[card.key] = engine.vllm_config.model_config.max_model_len
        register_context(card.key, self._built_context[card.key])
        return VllmEngine(engine, owner, lora, footprint, counter)

    def _physical(self, devices: tuple[int, ...]) -> list[int]:
        """NVML (PCI bus order) indices of the app's logical devices, through CUDA_VISIBLE_DEVICES:
        none past what it names (those GPUs are not the app's, whatever `gpu_count` says)."""
        visible = visible_devices()
        return [d if visible is None else visible[d] for d in devices if visible is None or d < len(visible)]

    def _visible(self, devices: tuple[int, ...]) -> str | None:
        """CUDA_VISIBLE_DEVICES for an engine placed on `devices` (None on CPU)."""
        if self._settings.gpu_count == 0 or not devices:
            return None
        return ",".join(str(d) for d in self._physical(devices))


_placement_lock = threading.Lock()


def _start_async_llm(args: dict[str, Any], visible: str | None) -> Any:
    """Starts `AsyncLLM`; its engine processes inherit CUDA_VISIBLE_DEVICES at spawn, so the
    placement is the environment during the start (builds take turns under a lock)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    with _placement_lock:
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        try:
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        finally:
            if visible is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved


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


class VllmEngine:
    """An `AsyncLLM` serving one card: renders, streams deltas, aborts, sleeps, shuts down."""

    resident = True

    def __init__(
        self,
        engine: Any,
        owner: ChatTemplateOwner,
        lora: Any,
        footprint: dict[int, int] | None = None,
        counter: PromptCounter | None = None,
    ) -> None:
        self._engine = engine
        self._owner = owner
        self._tokenizer = engine.get_tokenizer()
        self._counter = counter
        self._lora = lora
        # What the build took on each GPU (NVML index: bytes), measured around it.
        self._footprint = footprint
        # What sleeping gave back on each GPU, while asleep (a sleeper holds only the rest).
        self._freed_by_sleep: dict[int, int] = {}
        # Requests aborted from outside while between two sends (see `generate`): not sent again.
        self._aborted: set[str] = set()
        self.process_ids = engine_process_ids(engine)

    @property
    def footprint_bytes(self) -> int | None:
        """The most the build took on any one GPU, measured (NVML) around it; None on the CPU."""
        return max(self._footprint.values()) if self._footprint else None

    @property
    def kv_cache_tokens(self) -> int | None:
        """Tokens the engine's KV cache holds (blocks times block size), as vLLM sized it."""
        cache = self._engine.vllm_config.cache_config
        blocks = getattr(cache, "num_gpu_blocks", None)
        return int(blocks) * int(cache.block_size) if blocks else None

    @property
    def kv_cache_block_size(self) -> int:
        return int(self._engine.vllm_config.cache_config.block_size)

    @property
    def can_sleep(self) -> bool:
        """Sleep mode exists on CUDA only; the app turns it on for every GPU engine, local folder
        or hub model alike (whether the host has room is the scheduler's host budget)."""
        return bool(self._engine.vllm_config.model_config.enable_sleep_mode)

    def unfinished_requests(self) -> int:
        return self._engine.get_num_unfinished_requests()

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        await self._engine.abort(request_id)

    async def generate(
        self, card: ModelCard, messages: Sequence[dict[str, Any]], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[TextDelta | StreamEnd]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.exceptions import EngineDeadError

        literal = render_literal(card, messages, self._owner, self._tokenizer)
        rendered = literal.rendered
        try:
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
        except Exception as error:
            raise self._refusal(card, error, literal) from None
        # A request can end in vLLM with a retryable error and no token: the engine process no
        # longer holds a picture this process believes it sent before (vLLM's two media caches
        # drift apart under concurrent requests; it then forgets the stale entries so that one
        # resend carries the data). Sent once more; a second error is the user's failure line.
        try:
            for attempt in (1, 2):
                if attempt == 2 and request_id in self._aborted:
                    yield StreamEnd("abort", 0, 0, rendered.prompt)
                    return
                outputs = self._engine.generate(
                    engine_prompt(card, rendered, literal.token_ids),
                    params,
                    request_id,
                    lora_request=self._lora,
                )
                prompt_tokens = completion_tokens = 0
                finished = resend = False
                try:
                    async for output in outputs:
                        prompt_tokens = prompt_tokens or len(output.prompt_token_ids or ())
                        completion = output.outputs[0]
                        completion_tokens += len(completion.token_ids)
                        if completion.text:
                            yield TextDelta(completion.text)
                        if output.finished:
                            finished = True
                            # vLLM's request-level error ("retryable ... internal error"), not an end.
                            if completion.finish_reason == "error":
                                resend = attempt == 1 and completion_tokens == 0
                                if not resend:
                                    log.warning("request %s ended with an error in the engine", request_id)
                                    raise EngineError(
                                        f"{card.display_name} could not answer this message (an error "
                                        "inside the engine, logged); try again, or another message."
                                    )
                                log.warning(
                                    "request %s ended with an error in the engine and no token; sent again",
                                    request_id,
                                )
                                break
                            yield StreamEnd(
                                completion.finish_reason or "stop",
                                prompt_tokens,
                                completion_tokens,
                                rendered.prompt,
                            )
                except EngineDeadError:
                    raise EngineFailure(
                        f"{card.display_name} stopped unexpectedly (its engine process died); "
                        "send the message again to restart it."
                    ) from None
                except EngineError:
                    raise
                except Exception as error:
                    # vLLM validates the prompt (length, media, sampling) as the request is added.
                    raise self._refusal(card, error, literal) from None
                finally:
                    await outputs.aclose()
                    if not finished:
                        with contextlib.suppress(Exception):
                            await self._engine.abort(request_id)
                if not resend:
                    return
        finally:
            self._aborted.discard(request_id)

    def _refusal(self, card: ModelCard, error: BaseException, literal: LiteralPrompt) -> EngineError:
        """The user's line for an error from vLLM's request path (logged: one line with its
        cause; the traceback at debug level)."""
        counted = None
        if self._counter is not None:
            with contextlib.suppress(Exception):
                counted = self._counter.count_rendered(literal)
        message = explain_request_error(card, error, literal.rendered, counted)
        cause = _root_cause(error)
        log.info("%s refused a request: %s", card.key, message)
        if message.startswith(card.display_name + " could not answer"):
            log.warning("%s could not answer: %s: %s", card.key, type(cause).__name__, _first_line(cause))
        log.debug("the refused request's error", exc_info=error)
        return PromptError(message)

    async def sleep(self) -> None:
        before = gpu_memory("used") if self._footprint else None
        await self._engine.sleep(level=1)
        after = gpu_memory("used") if before is not None else None
        if self._footprint and before is not None and after is not None:
            # What sleeping gave back: a shutdown of the sleeper then waits only for the rest.
            self._freed_by_sleep = {
                d: max(0, before[d] - after[d]) for d in self._footprint if d < min(len(before), len(after))
            }

    async def wake(self) -> None:
        # vLLM 0.32 says whether every part (weights, KV cache) is back; a partial wake is a
        # failure the manager answers with a rebuild.
        if not await self._engine.wake_up():
            raise EngineError("the engine is not fully awake after waking it")
        self._freed_by_sleep = {}

    async def shutdown(self) -> None:
        # Stopped first: it would otherwise log the engine's exit as a crash.
        before = gpu_memory("used") if self._footprint else None
        held = {
            d: max(0, taken - self._freed_by_sleep.get(d, 0)) for d, taken in (self._footprint or {}).items()
        }
        handler = getattr(self._engine, "output_handler", None)
        if handler is not None:
            handler.cancel()
        await asyncio.to_thread(shut_down, self._engine)
        await asyncio.to_thread(wait_for_exit, self.process_ids)
        if held:
            await asyncio.to_thread(wait_for_memory_freed, before, held)


def shut_down(engine: Any) -> None:
    """Shuts a vLLM engine down, once. AsyncLLM shuts itself down again when it is collected,
    which for the first engine is only as the interpreter exits (a traceback vLLM keeps holds its
    frame), when the modules it calls are gone: a `TypeError` traceback after the app stopped.
    The instance's own `shutdown` is made a no-op once it has run."""
    engine.shutdown()
    engine.shutdown = lambda *args, **kwargs: None


def engine_prompt(
    card: ModelCard, rendered: RenderedPrompt, token_ids: list[int] | None = None
) -> dict[str, Any]:
    """vLLM's prompt dict: media in order, videos with their metadata where the model uses it,
    and images' content hashes as ids so a picture repeated across turns hits vLLM's caches.
    `token_ids`: the prompt as ids instead of text (where user text must stay text)."""
    data: dict[str, Any] = {}
    uuids: dict[str, Any] = {}
    if rendered.images:
        data["image"] = rendered.images
        hashes = [getattr(image, "info", {}).get("content_hash") for image in rendered.images]
        if all(hashes):
            uuids["image"] = hashes
    if rendered.videos:
        data["video"] = [_video_input(video, card.video_metadata) for video in rendered.videos]
    prompt: dict[str, Any] = (
        {"prompt": rendered.prompt} if token_ids is None else {"prompt_token_ids": token_ids}
    )
    if data:
        prompt["multi_modal_data"] = data
    if uuids:
        prompt["multi_modal_uuids"] = uuids
    return prompt


def _video_input(video: Any, with_metadata: bool) -> Any:
    """A `VideoClip` (frames, metadata, timestamps), a (frames, metadata) pair, or frames."""
    if isinstance(video, tuple) and len(video) >= 2:
        frames, metadata = video[0], video[1]
        return (frames, vllm_video_metadata(metadata)) if with_metadata else frames
    return video


# The keys vLLM's own video loader gives processors (transformers' VideoMetadata takes no others).
VLLM_VIDEO_METADATA_KEYS = ("total_num_frames", "fps", "duration", "video_backend", "frames_indices")


def vllm_video_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The app's clip metadata as vLLM's loader writes it: its keys only (Qwen3-VL and GLM-4.1V
    refuse others, such as the codec), and `do_sample_frames` off, since the frames already are
    the app's sample (GLM-4.1V reads the flag; a processor sampling again would drop frames)."""
    return {key: metadata[key] for key in VLLM_VIDEO_METADATA_KEYS if key in metadata} | {
        "do_sample_frames": False
    }


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


# vLLM's image processors refuse extreme shapes ("absolute aspect ratio must be smaller than 200").
_ASPECT = re.compile(r"aspect ratio must be (?:smaller|less) than (\d+)")


def explain_request_error(
    card: ModelCard, error: BaseException, rendered: RenderedPrompt, counted: int | None = None
) -> str:
    """What went wrong with one request, in one line that says what to change (no class names,
    paths or tracebacks): vLLM's validation messages, the media processors' refusals, else the
    deepest cause's first line."""
    name = card.display_name
    causes = _causes(error)
    for cause in causes:
        line = explain_refusal(name, str(cause), counted)
        if line is not None:
            return line
    text = " ".join(str(c) for c in causes)
    aspect = _ASPECT.search(text)
    if aspect:
        limit = int(aspect.group(1))
        sizes = [image.size for image in rendered.images if hasattr(image, "size")]
        bad = [f"{w}x{h}" for w, h in sizes if max(w, h) >= limit * max(1, min(w, h))]
        shown = f" ({', '.join(bad)} pixels)" if bad else ""
        return (
            f"{name} cannot take this image{shown}: its long side may be at most {limit} times its "
            "short side. Crop it or send another picture."
        )
    if re.search(r"can't serialize ints|int too big|OverflowError", text):
        return f"{name} cannot take a number this large in the request; use smaller settings."
    root = _root_cause(error)
    detail = _first_line(root) if str(root).strip() else ""
    if isinstance(root, ValueError | TypeError) and detail:
        return f"{name} cannot take this input: {detail}"
    return f"{name} could not answer this message (the cause has been logged); try another message."


def _root_cause(error: BaseException) -> BaseException:
    """The deepest error with a message (vLLM wraps causes in message-less errors)."""
    with_text = [c for c in _causes(error) if str(c).strip()]
    return with_text[-1] if with_text else error


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


def wait_for_exit(process_ids: list[int], timeout_s: float = 30.0) -> int:
    """Waits for an engine's processes to exit, killing those that outlive the timeout; returns
    how many had to be killed (the GPU check reports it)."""
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
    return len(alive)


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


def engine_process_ids(engine: Any) -> list[int]:
    """The process ids of an `AsyncLLM`'s engine core (one per data-parallel rank)."""
    manager = getattr(engine.engine_core, "resources", None)
    processes = getattr(getattr(manager, "engine_manager", None), "processes", [])
    return [p.pid for p in processes if p.pid is not None]


def wait_for_memory_freed(
    before: list[int] | None, footprint: dict[int, int], read: Callable[[str], list[int] | None] = gpu_memory
) -> bool:
    """After a shutdown, waits until each GPU the engine was on has dropped by most of what its
    build took (other engines' memory does not matter). False on timeout or NVML errors."""
    if before is None:
        return False
    deadline = time.monotonic() + MEMORY_RETURN_TIMEOUT_S
    while True:
        used = read("used")
        if used is None:
            return False
        short = {
            d: used[d] - (before[d] - taken)
            for d, taken in footprint.items()
            if d < len(used) and used[d] > before[d] - taken + GPU_MEMORY_SLACK_BYTES
        }
        if not short:
            return True
        if time.monotonic() > deadline:
            log.warning(
                "GPU memory not back after an engine stopped: %s MiB short",
                {d: b >> 20 for d, b in short.items()},
            )
            return False
        time.sleep(0.2)


def _longer_than_derived(error: BaseException, args: Mapping[str, Any], card: ModelCard) -> bool:
    """Whether vLLM refused a chat-sized `max_model_len` as longer than the model's own (and the
    card's own length is shorter, so a rebuild with it can work)."""
    own = card.max_model_len
    asked = args.get("max_model_len")
    text = str(error)
    return bool(own and asked and asked > own and "max_model_len" in text and "derived" in text)


def _unreachable(error: BaseException) -> bool:
    """Whether the Hub did not answer at all (offline mode, no network), not only for one model
    (a gated or missing repository, a rate limit or a server error answer with an HTTP status)."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    if isinstance(error, LocalEntryNotFoundError) and isinstance(error.__cause__, HfHubHTTPError):
        return False  # the Hub answered for this file (a 429, a 5xx): the next model may work
    network = (
        OfflineModeIsEnabled,
        LocalEntryNotFoundError,
        ConnectionError,
        TimeoutError,
        httpx.TransportError,
    )
    return isinstance(error, network)
