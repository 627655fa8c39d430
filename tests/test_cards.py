"""The catalog: strict cards, honest availability, failures that name the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from app.catalog.cards import CARDS_DIR, CardError, load_card, load_cards, servable_cards

CARDS = load_cards()


def test_load_cards_defaults_to_the_project_folder_and_keys_by_file_name():
    assert len(CARDS) == 62
    assert sorted(CARDS) == sorted(p.stem for p in CARDS_DIR.glob("*.yaml"))
    card = CARDS["qwen2_5_vl"]
    assert card.hf_repo == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert card.modalities == ["image", "video"]
    assert card.engine_args["model"] == card.hf_repo
    assert card.engine_args["limit_mm_per_prompt"] == {"image": 4, "video": 1}


def test_every_card_documents_hardware_and_its_overrides():
    for key, card in CARDS.items():
        if card.gpus_needed > 1:
            assert f"needs {card.gpus_needed} GPUs" in card.hardware, key
        if card.engine_overrides is not None:
            assert card.engine_overrides.why.strip(), key


# --- broken cards ----------------------------------------------------------------------------


def write_catalog(tmp_path: Path, card_key: str = "qwen2_5_vl", **changes: object) -> Path:
    data = yaml.safe_load((CARDS_DIR / f"{card_key}.yaml").read_text(encoding="utf-8"))
    for field, value in changes.items():
        if value is None:
            data.pop(field, None)
        else:
            data[field] = value
    (tmp_path / f"{card_key}.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"adapter": None}, "adapter: Field required"),
        ({"adapter": "guess_from_name"}, "unknown adapter 'guess_from_name'"),
        ({"key": "qwen2_5"}, "differs from the file name"),
        ({"modalities": ["image", "audio"]}, "modalities.1"),
        ({"hf_repo": "someone/else"}, "model must equal hf_repo"),
        ({"prompt": {"user": "{text}", "image": "<i>", "video": "<v>", "colour": 1}}, "colour"),
        (
            {"prompt": {"user": "{text}{question}", "image": "<i>", "video": "<v>"}},
            "unknown field(s) ['question']",
        ),
        ({"prompt": {"user": "{media}{text}", "image": "<i>"}}, "no video placeholder"),
        ({"engine_overrides": {"args": {"max_model_len": 1}}}, "engine_overrides.why: Field required"),
        ({"modalities": ["image"]}, "not in modalities"),
    ],
)
def test_a_broken_card_stops_loading_with_its_file_name(tmp_path: Path, changes: dict, message: str):
    folder = write_catalog(tmp_path, **changes)
    with pytest.raises(CardError) as error:
        load_cards(folder)
    assert "qwen2_5_vl.yaml" in str(error.value)
    assert message in str(error.value)


def test_invalid_yaml_and_empty_folders_are_reported(tmp_path: Path):
    with pytest.raises(CardError, match="no model cards"):
        load_cards(tmp_path)
    (tmp_path / "bad.yaml").write_text("key: [unclosed\n", encoding="utf-8")
    with pytest.raises(CardError, match=r"bad\.yaml: not valid YAML"):
        load_cards(tmp_path)
    (tmp_path / "bad.yaml").write_text("- a list\n", encoding="utf-8")
    with pytest.raises(CardError, match=r"bad\.yaml: a card must be a mapping"):
        load_cards(tmp_path)


# --- availability ----------------------------------------------------------------------------


def test_availability_names_every_reason():
    llama4 = CARDS["llama4"].availability(gpu_count=1, allow_remote_code=True)
    assert not llama4.available
    assert llama4.reason == "needs 8 NVIDIA GPUs (tensor_parallel_size 8); this machine has only 1"
    # One GPU on a machine with none, in words ("needs 1 GPUs ... has 0" before).
    assert CARDS["llava"].availability(0, allow_remote_code=False).reason == (
        "needs an NVIDIA GPU; this machine has none"
    )
    assert CARDS["llama4"].availability(gpu_count=8, allow_remote_code=False).available

    internvl = CARDS["internvl_chat"]
    assert "trust_remote_code" in internvl.availability(1, allow_remote_code=False).reason
    assert internvl.availability(1, allow_remote_code=True).available

    mllama = CARDS["mllama"].availability(gpu_count=8, allow_remote_code=True)
    assert not mllama.available and "MllamaForConditionalGeneration" in mllama.reason

    both = CARDS["minimax_vl_01"].availability(gpu_count=1, allow_remote_code=False)
    assert len(both.reasons) == 3


def test_servable_cards_depend_on_the_machine_and_the_operator():
    one_gpu = servable_cards(CARDS, gpu_count=1, allow_remote_code=False)
    assert "qwen2_5_vl" in one_gpu and "llama4" not in one_gpu and "internvl_chat" not in one_gpu
    trusting = servable_cards(CARDS, gpu_count=1, allow_remote_code=True)
    assert set(one_gpu) < set(trusting) and "internvl_chat" in trusting
    big = servable_cards(CARDS, gpu_count=8, allow_remote_code=True)
    assert "llama4" in big and not any(CARDS[k].unsupported_reason for k in big)


@pytest.mark.vllm
def test_unsupported_cards_are_exactly_those_missing_from_the_installed_vllm_registry():
    from vllm.model_executor.models.registry import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for key, card in CARDS.items():
        overrides = card.engine_args.get("hf_overrides", {}).get("architectures")
        if overrides:
            assert overrides == [card.architecture], key
        assert (card.architecture in supported) == (card.unsupported_reason is None), key
        if card.unsupported_reason:
            assert card.architecture in card.unsupported_reason


@pytest.mark.vllm
def test_engine_args_are_arguments_of_the_installed_vllm():
    from vllm.engine.arg_utils import EngineArgs

    names = {field.name for field in dataclasses.fields(EngineArgs)}
    for key, card in CARDS.items():
        assert set(card.engine_args) <= names, (key, set(card.engine_args) - names)


def test_video_cards_sample_the_references_frame_count_within_the_decoders_cap(tmp_path: Path):
    from app.media.loading import VideoLimits

    video_cards = [card for card in CARDS.values() if "video" in card.modalities]
    assert video_cards and all(card.video_frames == 16 for card in video_cards)
    text = (CARDS_DIR / "qwen2_vl.yaml").read_text(encoding="utf-8") + "video_frames: 65\n"
    (tmp_path / "qwen2_vl.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(CardError, match=r"qwen2_vl\.yaml: video_frames"):
        load_card(tmp_path / "qwen2_vl.yaml")
    assert VideoLimits().max_frames == 64


def vllm_media_limits(architecture: str) -> dict[str, int | None] | None:
    """What vLLM 0.32's processing of `architecture` takes per prompt (None: any number), read
    from its own model class; None where it cannot say without the model's config."""
    from vllm.model_executor.models.registry import ModelRegistry

    model = ModelRegistry._try_load_model_cls(architecture)
    factories = getattr(model, "_processor_factory", None)
    if factories is None:
        return None
    classes = [factories.info] if isinstance(factories.info, type) else built_info_classes(factories.info)
    said = []
    for info in classes:
        try:
            said.append(dict(info(None).get_supported_mm_limits()))
        except Exception:  # it reads the model's config: not at hand here
            return None
    return said[0] if said and all(limits == said[0] for limits in said) else None


def built_info_classes(builder: object) -> list[type]:
    """The processing-info classes a builder function of vLLM's can return (LLaVA's picks Pixtral's
    or LLaVA's by the model's config, which is not at hand): the class its return annotation
    names and that class's subclasses in the builder's module; none where it names no class."""
    import inspect
    import typing

    from vllm.multimodal.processing import BaseProcessingInfo

    try:
        named = typing.get_type_hints(builder).get("return")
    except Exception:  # an annotation that does not resolve
        return []
    if not (inspect.isclass(named) and issubclass(named, BaseProcessingInfo)):
        return []
    module = inspect.getmodule(builder)
    own = [cls for cls in vars(module).values() if inspect.isclass(cls) and cls.__module__ == module.__name__]
    return [named, *(cls for cls in own if cls is not named and issubclass(cls, named))]


@pytest.mark.vllm
def test_media_limits_are_what_the_architecture_takes():
    """Several images a prompt wherever vLLM's model takes several (a chat's follow-up picture
    must not dead-end), never more than it takes, and each raised limit says why."""
    checked, wrong = set(), []
    for key, card in CARDS.items():
        supported = vllm_media_limits(card.architecture)
        if supported is None:
            continue
        checked.add(key)
        for kind, limit in card.media_limits.items():
            most = supported.get(kind, 0)
            if most is None and kind == "image" and limit < 2:
                wrong.append(f"{key}: vLLM takes several images; the card takes {limit}")
            elif most is not None and limit > most:
                wrong.append(f"{key}: the card takes {limit} {kind}s, vLLM {most}")
        if card.media_limits.get("image", 0) > card.reference_engine_args.get("limit_mm_per_prompt", {}).get(
            "image", 0
        ) and (card.engine_overrides is None or "images per prompt" not in card.engine_overrides.why):
            wrong.append(f"{key}: a raised image limit whose why does not say 'images per prompt'")
    assert not wrong, wrong  # every card that disagrees, at once
    assert len(checked) >= 40
    # LLaVA's processing info is a builder function (Pixtral's or LLaVA's, by the config): read too.
    assert {"llava", "pixtral_hf"} <= checked
