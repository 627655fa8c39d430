"""Settings come from `APP_*` variables, once, with errors that name the variable."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import (
    MemoryBudget,
    Settings,
    SettingsError,
    add_flags,
    detect_gpu_count,
    env_name,
    flag_name,
    from_command_line,
)


def test_settings_come_from_the_environment():
    settings = Settings.from_env(
        {
            "APP_ALLOW_REMOTE_CODE": "yes",
            "APP_GPU_COUNT": "2",
            "APP_CARDS_DIR": "/x",
            "APP_DEFAULT_MODEL": "qwen2_5_vl",
            "APP_MEMORY_BUDGET": "40GiB",
            "APP_MAX_RESIDENT": "2",
            "APP_IDLE_UNLOAD_S": "600",
            "APP_DRAIN_TIMEOUT_S": "5",
            "APP_ENFORCE_EAGER": "1",
            "APP_MODEL_FOLDERS": "llava=/models/llava, qwen2_vl = /models/qwen",
            "APP_REMOTE_ENGINES": "gemma3=http://gpu-box:8000/v1",
            "APP_HF_CACHE": "/cache",
        }
    )
    assert settings == Settings(
        cards_dir=Path("/x"),
        allow_remote_code=True,
        gpu_count=2,
        default_model="qwen2_5_vl",
        memory_budget=MemoryBudget(fraction=None, bytes=40 * 2**30),
        max_resident=2,
        idle_unload_s=600,
        drain_timeout_s=5,
        enforce_eager=True,
        model_folders={"llava": Path("/models/llava"), "qwen2_vl": Path("/models/qwen")},
        remote_engines={"gemma3": "http://gpu-box:8000/v1"},
        hf_cache=Path("/cache"),
    )
    assert Settings.from_env({"APP_GPU_COUNT": "0"}).allow_remote_code is False


def test_eager_mode_defaults_to_the_platform():
    assert Settings(gpu_count=0).eager is True
    assert Settings(gpu_count=1).eager is False
    assert Settings(gpu_count=1, enforce_eager=True).eager is True


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("0.8", MemoryBudget(0.8)),
        ("1", MemoryBudget(1.0)),
        ("512MiB", MemoryBudget(None, 512 * 2**20)),
        ("2 GB", MemoryBudget(None, 2 * 10**9)),
    ],
)
def test_memory_budget_is_a_fraction_or_bytes(text: str, budget: MemoryBudget):
    assert MemoryBudget.parse(text) == budget


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"APP_MEMORY_BUDGET": "lots"}, "APP_MEMORY_BUDGET"),
        ({"APP_IDLE_UNLOAD_S": "soon"}, "APP_IDLE_UNLOAD_S"),
        ({"APP_DRAIN_TIMEOUT_S": "-1"}, "APP_DRAIN_TIMEOUT_S"),
        ({"APP_MODEL_FOLDERS": "llava"}, "APP_MODEL_FOLDERS"),
    ],
)
def test_bad_settings_name_their_variable(env: dict[str, str], named: str):
    with pytest.raises(SettingsError, match=named):
        Settings.from_env({"APP_GPU_COUNT": "0", **env})


def test_command_line_values_override_the_environment_where_given():
    settings = Settings.from_env({"APP_GPU_COUNT": "0", "APP_MAX_RESIDENT": "3"})
    assert settings.with_overrides(max_resident=None, default_model="llava").max_resident == 3
    assert settings.with_overrides(max_resident=1).max_resident == 1
    with pytest.raises(SettingsError, match="unknown"):
        settings.with_overrides(colour="blue")


def test_gpu_count_comes_from_device_files_narrowed_by_cuda_visible_devices():
    two = ["/dev/nvidia0", "/dev/nvidia1"]
    assert detect_gpu_count({}, two) == 2
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "1"}, two) == 1
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, two) == 0
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, two) == 2
    # CUDA stops at an entry it cannot read: on the H200, a UUID without "GPU-" made none visible.
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "1,oops,0"}, two) == 1
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "b8165666-1092-95bb-2e75-a9fdb498f280"}, two) == 0
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "GPU-b8165666,MIG-4a1c"}, two) == 1
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "0,0"}, two) == 0
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "2,0"}, two) == 0  # no third GPU
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "GPU-"}, two) == 0
    assert detect_gpu_count({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"}, two) == 2


def test_settings_naming_models_outside_the_catalog_are_refused():
    Settings(default_model="llava", remote_engines={"gemma3": "http://x/v1"}).check_keys({"llava", "gemma3"})
    with pytest.raises(SettingsError, match=r"APP_REMOTE_ENGINES names \['gemma4'\]"):
        Settings(remote_engines={"gemma4": "http://x/v1"}).check_keys({"gemma3"})
    with pytest.raises(SettingsError, match="APP_DEFAULT_MODEL"):
        Settings(default_model="nope").check_keys({"llava"})


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("max_resident", "0"),
        ("gpu_count", "abc"),
        ("port", "99999"),
        ("quantum_s", "-1"),
        ("idle_unload_s", "soon"),
        ("memory_budget", "lots"),
        ("memory_budget", "0"),
        ("max_upload_bytes", "big"),
        ("host_memory_budget", "-1"),
        ("cpu_kv_cache_bytes", "x"),
        ("model_folders", "llava"),
        ("remote_engines", "gemma3"),
        ("queue_size", "0"),
        ("concurrency", "-3"),
        ("tensor_parallel_size", "0"),
    ],
)
def test_a_bad_value_is_refused_the_same_way_from_a_variable_and_from_a_flag(field: str, text: str):
    variable, flag = env_name(field), flag_name(field)
    with pytest.raises(SettingsError) as from_env:
        Settings.from_env({"APP_GPU_COUNT": "0", variable: text})
    with pytest.raises(SettingsError) as from_flag:
        from_command_line(flags(flag, text), env={"APP_GPU_COUNT": "0"})
    message = str(from_env.value)
    assert message.startswith(f"{variable}={text!r}: write ") and "\n" not in message
    assert str(from_flag.value) == message.replace(variable, flag, 1)


def test_a_bad_switch_names_its_variable():
    with pytest.raises(SettingsError, match=r"^APP_SHARE='maybe': write 1 or 0"):
        Settings.from_env({"APP_SHARE": "maybe"})


def test_flags_override_the_environment_and_are_validated_with_it():
    env = {"APP_GPU_COUNT": "0", "APP_MAX_RESIDENT": "3", "APP_PORT": "8000"}
    settings = from_command_line(
        flags("--max-resident", "2", "--model-folder", "llava=/m/l", "--no-eager"), env
    )
    assert (settings.max_resident, settings.port, settings.enforce_eager) == (2, 8000, False)
    assert settings.model_folders == {"llava": Path("/m/l")}
    # A flag replaces its variable before anything is validated: a bad variable it replaces is no error.
    assert from_command_line(flags("--max-resident", "1"), {**env, "APP_MAX_RESIDENT": "0"}).max_resident == 1
    with pytest.raises(SettingsError, match=r"^APP_MAX_RESIDENT='0'"):
        from_command_line(flags("--port", "8001"), {**env, "APP_MAX_RESIDENT": "0"})


def test_every_setting_has_a_variable_a_flag_and_a_default_in_the_help():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    helps = {action.dest: action.help for action in parser._actions}
    for name in Settings.model_fields:
        assert f"({env_name(name)}; default: " in helps[name]
    assert Settings.from_env(
        {
            "APP_GPU_COUNT": "0",
            "APP_TENSOR_PARALLEL_SIZE": "1",
            "APP_MAX_UPLOAD": "1GB",
            "APP_LOAD_FORMAT": "dummy",
        }
    ) == Settings(tensor_parallel_size=1, max_upload_bytes=10**9, load_format="dummy")


def test_settings_in_code_read_no_environment_and_are_validated(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("APP_PORT", "1234")
    assert Settings().port == 7860
    with pytest.raises(ValidationError):
        Settings(max_resident=0)
    with pytest.raises(SettingsError, match=r"^--max-resident='0': write a whole number of at least 1$"):
        Settings(gpu_count=1).with_overrides(max_resident=0)
