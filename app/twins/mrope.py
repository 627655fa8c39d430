"""Twins of Qwen-style multimodal-RoPE architectures beyond Qwen2/2.5/3-VL and GLM-4.1V."""

from __future__ import annotations

from app.twins.common import Builder

BUILDERS: dict[str, Builder] = {}

WHY_NOT: dict[str, str] = {}
