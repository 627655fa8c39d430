"""Twins of further architectures whose classes ship in transformers (Mistral 3, Cohere 2
Vision, Aria, Llama 4, Gemma 3n...)."""

from __future__ import annotations

from app.twins.common import Builder

BUILDERS: dict[str, Builder] = {}

WHY_NOT: dict[str, str] = {}
