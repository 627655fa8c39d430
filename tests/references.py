"""What the reference examples do, as the catalog tests compare against it: read from a golden
file committed with the tests (`tests/golden/references.json`), so that a clone on its own
passes its tests.

The golden file is made by executing the references themselves (vLLM's `vision_language.py`
examples, a multi-image notebook and the VLM docs, in `../shared/seeds`, Apache-2.0 like vLLM)
with vLLM and transformers stubbed (`reference_scripts.py`): `python scripts/golden_references.py`
writes it again where the seeds are at hand, recording every call the tests make, and
`tests/test_references_golden.py` checks it is in sync with them whenever they are.
"""

from __future__ import annotations

import atexit
import json
import os
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

GOLDEN = Path(__file__).resolve().parent / "golden" / "references.json"
REGENERATE = "python scripts/golden_references.py (with the seeds at hand)"
# Set by scripts/golden_references.py: run the references and record what the tests ask.
RECORDING = os.environ.get("REFERENCES_RECORD", "")

SNAPSHOT_ROOT = "/snapshots/"


class StubTokenizer:
    """Stands in for a Hugging Face tokenizer or processor: records chat-template calls.

    `apply_chat_template` renders the messages as JSON so that equal prompts mean equal
    messages; `convert_tokens_to_ids` knows a few tokens and returns None for the rest, as
    slow tokenizers do for unknown tokens.
    """

    VOCAB: ClassVar[dict[str, int]] = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|end▁of▁sentence|>": 100001,
    }
    eos_token_id = 2

    def __init__(self, name: str = "stub") -> None:
        self.name = name
        self.calls: list[Any] = []

    def apply_chat_template(
        self, messages: Any, tokenize: bool = True, add_generation_prompt: bool = False, **kw: Any
    ) -> Any:
        assert tokenize is False and add_generation_prompt is True and not kw
        self.calls.append(messages)
        batched = bool(messages) and isinstance(messages[0], list)
        if batched:
            return [self.render(conversation) for conversation in messages]
        return self.render(messages)

    @staticmethod
    def render(conversation: list[dict[str, Any]]) -> str:
        return "TEMPLATE" + json.dumps(conversation, default=str, sort_keys=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.VOCAB.get(token)


@dataclass
class Recorded:
    engine_kwargs: dict[str, Any]
    prompts: list[str]
    stop_token_ids: list[int] | None
    lora: list[tuple[Any, ...]] | None
    sampling: list[dict[str, Any]] | None
    tokenizer_messages: list[Any] = field(default_factory=list)
    revisions: list[str | None] = field(default_factory=list)


@cache
def golden() -> dict[str, Any]:
    if RECORDING:  # what the tests ask is written when they are done
        atexit.register(_write)
        return {"calls": {}, "facts": {}}
    if not GOLDEN.is_file():
        return {"calls": {}, "facts": {}}
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def plain(value: Any) -> Any:
    """A value as JSON keeps it (tuples and sets as lists), so that live and golden values
    compare."""
    return json.loads(
        json.dumps(value, default=lambda o: sorted(o) if isinstance(o, set | frozenset) else str(o))
    )


def _recorded(name: str, *args: Any) -> Recorded:
    key = json.dumps([name, *args], ensure_ascii=False)
    calls = golden()["calls"]
    if RECORDING:
        import reference_scripts

        calls[key] = plain(asdict(getattr(reference_scripts, name)(*args)))
    if key not in calls:
        raise AssertionError(f"{name}{tuple(args)} is not in {GOLDEN.name}: regenerate it with {REGENERATE}")
    return Recorded(**calls[key])


def _fact(name: str, *args: Any) -> Any:
    key = json.dumps([name, *args], ensure_ascii=False)
    facts = golden()["facts"]
    if RECORDING:
        import reference_scripts

        facts[key] = plain(getattr(reference_scripts, name)(*args))
    if key not in facts:
        raise AssertionError(f"{name}{tuple(args)} is not in {GOLDEN.name}: regenerate it with {REGENERATE}")
    return facts[key]


def _write() -> None:
    document = golden()
    document["source"] = "../shared/seeds (vLLM examples and docs, Apache-2.0); see tests/references.py"
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(
        json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def run_reference(key: str, questions: list[str], modality: str) -> Recorded:
    """What the reference for a card key does with `questions` about one modality."""
    return _recorded("run_reference", key, questions, modality)


def run_multi_image(key: str, question: str, image_urls: list[str]) -> Recorded:
    return _recorded("run_multi_image", key, question, image_urls)


def all_reference_keys() -> list[str]:
    return _fact("all_reference_keys")


def reference_modalities(key: str) -> list[str]:
    return _fact("reference_modalities", key)


def newest_video_metadata_models() -> list[str]:
    return _fact("newest_video_metadata_models")


def multi_image_keys() -> list[str]:
    return _fact("multi_image_keys")


def usage_guide_phi3_prompt() -> str:
    """The two-image Phi-3-vision prompt the VLM docs write out."""
    return _fact("usage_guide_phi3_prompt")
