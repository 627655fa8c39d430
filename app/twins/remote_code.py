"""Twins of remote-code models whose config or processor the installed vLLM or transformers
carries (Keye-VL, dots.ocr, ERNIE-4.5-VL, R-4B, Bee)."""

from __future__ import annotations

from app.twins.common import Builder

BUILDERS: dict[str, Builder] = {}

WHY_NOT: dict[str, str] = {}
