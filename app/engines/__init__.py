"""Engines and their manager: the scheduler's policy, memory shares, vLLM and remote engines."""
