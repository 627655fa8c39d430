"""Runs the reference example scripts in ../shared/seeds with vLLM and transformers stubbed.

Used only where the seeds are at hand: to write the golden file the tests read
(`scripts/golden_references.py`, `tests/golden/references.json`), and to check that file is
in sync with them (`tests/test_references_golden.py`). The stubs record what the references
pass (engine arguments, chat-template messages, LoRA requests, sampling parameters) and never
touch a network or a GPU.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import types
from functools import cache
from pathlib import Path
from typing import Any

from references import SNAPSHOT_ROOT, Recorded, StubTokenizer

SEEDS_DIR = Path(
    os.environ.get("APP_REFERENCE_SEEDS", Path(__file__).resolve().parents[2] / "shared" / "seeds")
)
NEWEST = "002_3c8af7ef3aa5682b.txt"  # vision_language.py, newest complete copy
NEWER_CUT = "000_aa6abf83b142853f.txt"  # newer copy, flattened and with <tags> stripped
OLDER = "003_d4f3891e89fc6934.txt"  # older copy with Chinese notes
MULTI_IMAGE = "001_4e384f5808406db7.txt"  # multi-image notebook


class _Recorder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


class _EngineArgs(_Recorder):
    pass


class _SamplingParams(_Recorder):
    pass


class _LoRARequest(_Recorder):
    pass


class NGramPerReqLogitsProcessor:
    """Stub of vLLM's DeepSeek-OCR logits processor; only its qualified name matters."""


NGramPerReqLogitsProcessor.__module__ = "vllm.model_executor.models.deepseek_ocr"


def qualified_name(obj: Any) -> Any:
    """A class as vLLM takes it by name (`module:Class`; a dotted name is refused)."""
    if isinstance(obj, type):
        return f"{obj.__module__}:{obj.__qualname__}"
    return obj


class _Session:
    """The stub modules for one execution of a reference, with what they recorded."""

    def __init__(self) -> None:
        self.tokenizers: list[StubTokenizer] = []
        self.revisions: list[str | None] = []

        def from_pretrained(name: str, **kwargs: Any) -> StubTokenizer:
            tokenizer = StubTokenizer(name)
            self.tokenizers.append(tokenizer)
            return tokenizer

        def snapshot_download(repo_id: str, revision: str | None = None) -> str:
            self.revisions.append(revision)
            return SNAPSHOT_ROOT + repo_id

        auto = types.SimpleNamespace(from_pretrained=from_pretrained)
        ns = types.SimpleNamespace
        self.modules: dict[str, Any] = {
            "vllm": ns(LLM=None, EngineArgs=_EngineArgs, SamplingParams=_SamplingParams),
            "vllm.assets.image": ns(ImageAsset=None),
            "vllm.assets.video": ns(VideoAsset=None),
            "vllm.lora.request": ns(LoRARequest=_LoRARequest),
            "vllm.multimodal.image": ns(convert_image_mode=None),
            "vllm.multimodal.utils": ns(fetch_image=lambda url: url),
            "vllm.utils": ns(FlexibleArgumentParser=None),
            "vllm.utils.argparse_utils": ns(FlexibleArgumentParser=None),
            "vllm.model_executor.models.deepseek_ocr": ns(
                NGramPerReqLogitsProcessor=NGramPerReqLogitsProcessor
            ),
            "transformers": ns(AutoTokenizer=auto, AutoProcessor=auto),
            "huggingface_hub": ns(snapshot_download=snapshot_download),
        }

    def importer(self, name: str, globals_=None, locals_=None, fromlist=(), level=0):
        if name in self.modules:
            assert fromlist, f"the references import {name} only with from-imports"
            return self.modules[name]
        return builtins.__import__(name, globals_, locals_, fromlist, level)


def _namespace(session: _Session, **extra: Any) -> dict[str, Any]:
    stub_builtins = dict(vars(builtins))
    stub_builtins["__import__"] = session.importer
    return {"__name__": "reference", "__builtins__": stub_builtins, **extra}


def _read(name: str) -> str:
    path = SEEDS_DIR / name
    if not path.exists():
        raise FileNotFoundError(
            f"reference {name} not found in {SEEDS_DIR}; set APP_REFERENCE_SEEDS to the seeds folder"
        )
    return path.read_text(encoding="utf-8")


def _code_newest() -> str:
    text = _read(NEWEST)
    return text[text.index("# SPDX-License-Identifier") :]


def _code_older() -> str:
    text = _read(OLDER)
    start = text.index('"""', text.index("examples/offline_inference/vision_language.py"))
    return text[start:]


def _code_multi_image() -> str:
    """The notebook's code cells, without the cells that run models and their output."""
    cells: list[list[str]] = []
    current: list[str] | None = None
    for line in _read(MULTI_IMAGE).splitlines():
        if re.fullmatch(r"In \[\d+\]:", line):
            current = []
            cells.append(current)
        elif line.startswith("##"):
            current = None
        elif current is not None:
            current.append(line)
    code = ["\n".join(cell).strip() for cell in cells]
    return "\n\n".join(cell for cell in code if not cell.startswith("main("))


def _run(code: str, function_name: str, *args: Any, **namespace_extra: Any) -> tuple[Any, _Session]:
    session = _Session()
    namespace = _namespace(session, **namespace_extra)
    exec(compile(code, "reference", "exec"), namespace)  # noqa: S102
    return namespace[function_name], session


@cache
def _newest_namespace_keys() -> dict[str, str]:
    tree = ast.parse(_code_newest())
    return _example_map(tree)


def _example_map(tree: ast.Module) -> dict[str, str]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "model_example_map"
        ):
            value = node.value
            assert isinstance(value, ast.Dict)
            return {
                ast.literal_eval(k): v.id  # type: ignore[union-attr]
                for k, v in zip(value.keys, value.values, strict=True)
            }
    raise AssertionError("model_example_map not found")


def newest_keys() -> list[str]:
    return list(_newest_namespace_keys())


@cache
def older_keys() -> dict[str, str]:
    return _example_map(ast.parse(_code_older()))


def newest_video_metadata_models() -> list[str]:
    tree = ast.parse(_code_newest())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == (
            "MODELS_NEED_VIDEO_METADATA"
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("MODELS_NEED_VIDEO_METADATA not found")


def _record(request: Any, session: _Session) -> Recorded:
    sampling = None
    if getattr(request, "sampling_params", None):
        sampling = [dict(s.kwargs) for s in request.sampling_params]
    lora = None
    if request.lora_requests:
        lora = [lr.args for lr in request.lora_requests]
    kwargs = {k: qualified_name_list(v) for k, v in request.engine_args.kwargs.items()}
    prompts = request.prompts if hasattr(request, "prompts") else [request.prompt]
    return Recorded(
        engine_kwargs=kwargs,
        prompts=list(prompts),
        stop_token_ids=request.stop_token_ids,
        lora=lora,
        sampling=sampling,
        tokenizer_messages=[call for t in session.tokenizers for call in t.calls],
        revisions=session.revisions,
    )


def qualified_name_list(value: Any) -> Any:
    if isinstance(value, list):
        return [qualified_name(v) for v in value]
    return value


def run_newest(key: str, questions: list[str], modality: str) -> Recorded:
    function, session = _run(_code_newest(), _newest_namespace_keys()[key])
    return _record(function(questions, modality), session)


def run_older(key: str, questions: list[str], modality: str) -> Recorded:
    args = types.SimpleNamespace(disable_mm_preprocessor_cache=False)
    function, session = _run(_code_older(), older_keys()[key], args=args)
    return _record(function(questions, modality), session)


def run_multi_image(key: str, question: str, image_urls: list[str]) -> Recorded:
    code = _code_multi_image()
    mapping = _example_map(ast.parse(code))
    function, session = _run(code, mapping[key])
    return _record(function(question, image_urls), session)


def multi_image_keys() -> list[str]:
    return list(_example_map(ast.parse(_code_multi_image())))


def supports(run: Any, key: str, modality: str) -> bool:
    """Whether a reference function accepts a modality (they assert or fall through)."""
    try:
        run(key, ["q"], modality)
    except (AssertionError, UnboundLocalError, NameError, KeyError, ValueError):
        return False
    return True


# The newer copy (000) is flattened onto one line with its <tags> stripped, so it cannot be
# executed; hunyuan_vl, which only it has, is read from it expression by expression.
def run_hunyuan_vl(questions: list[str], modality: str) -> Recorded:
    assert modality == "image"
    text = _read(NEWER_CUT)
    body = text[text.index("def run_hunyuan_vl") : text.index("# naver-hyperclovax")]
    model_name = re.search(r'model_name = "([^"]+)"', body).group(1)  # type: ignore[union-attr]
    engine_src = re.search(r"engine_args = EngineArgs\((.*?)\) placeholder", body).group(1)  # type: ignore[union-attr]
    placeholder = ast.literal_eval(re.search(r"placeholder = (\"[^\"]*\")", body).group(1))  # type: ignore[union-attr]
    prompt_src = re.search(r"prompts = \[ (f\"[^\"]*\") for question", body).group(1)  # type: ignore[union-attr]
    call = ast.parse(f"dict({engine_src})", mode="eval")
    env = {"model_name": model_name, "modality": modality, "dict": dict}
    engine_kwargs = eval(compile(call, "000", "eval"), env)  # noqa: S307
    prompt_expr = compile(ast.parse(prompt_src, mode="eval"), "000", "eval")
    prompts = [
        eval(prompt_expr, {"placeholder": placeholder, "question": q})  # noqa: S307
        for q in questions
    ]
    stop = re.search(r"stop_token_ids=(\w+)", body).group(1)  # type: ignore[union-attr]
    assert stop == "None"
    return Recorded(engine_kwargs, prompts, None, None, None)


def run_reference(key: str, questions: list[str], modality: str) -> Recorded:
    """The reference for a card key: 002 first, then the copies that add models."""
    if key in _newest_namespace_keys():
        return run_newest(key, questions, modality)
    if key == "hunyuan_vl":
        return run_hunyuan_vl(questions, modality)
    return run_older(key, questions, modality)


def reference_modalities(key: str) -> list[str]:
    if key == "hunyuan_vl":
        return ["image"]
    return [m for m in ("image", "video") if supports(run_reference, key, m)]


# The keys the catalog must cover: every model of 002, plus what the other copies add.
EXTRA_KEYS = ("hunyuan_vl", "florence2", "mllama")


def all_reference_keys() -> list[str]:
    return newest_keys() + list(EXTRA_KEYS)


def usage_guide_phi3_prompt() -> str:
    guide = _read("004_1a9858e7c11aeed7.txt")
    literal = re.search(r'prompt = ("<\|user\|>\\n<\|image_1\|>[^"]*")', guide).group(1)  # type: ignore[union-attr]
    return ast.literal_eval(literal)
