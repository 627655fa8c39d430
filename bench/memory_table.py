"""Every servable card's memory figures as the scheduler books them before a build: weights, KV
bytes per token, the KV reserve, the engine overhead and the total on each GPU, each with where it
comes from. Writes a Markdown table (docs/MEMORY.md holds this repository's machines' output).

    .venv/bin/python bench/memory_table.py          # from what is on this machine
    .venv/bin/python bench/memory_table.py --hub    # first reads each model's files from the Hub

On a GPU box, `--hub` is what the app itself does at start (`read_facts_from_hub`): each model's
config.json and its safetensors headers, a few kilobytes each, no weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.catalog.cards import load_cards, servable_cards
from app.config import Settings
from app.engines.memory import DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_NUM_SEQS, GIB, MemoryNeed
from app.engines.vllm_engine import VllmEngineFactory

# The figures do not depend on the card's size: one 80 GB GPU, shares computed per card.
GPU_BYTES = 80 * 10**9


def table(hub: bool = False) -> str:
    cards = servable_cards(load_cards(), gpu_count=8, allow_remote_code=True)
    factory = VllmEngineFactory(Settings(gpu_count=1), device_totals=[GPU_BYTES])
    if hub:
        factory.read_facts_from_hub(list(cards.values()))
    header = ("Card", "Weights (GiB)", "from", "KV reserve (GiB)", "holds", "from", "Per GPU (GiB)")
    rows = ["| " + " | ".join(header) + " |", "|---|---:|---|---:|---|---|---:|"]
    for key, card in sorted(cards.items()):
        need = factory.memory_need(card)
        if need is None:
            continue
        rows.append(_row(key, card.engine_args, need))
    return "\n".join(rows) + "\n"


def _row(key: str, args: dict, need: MemoryNeed) -> str:
    length = need.context_tokens or int(args.get("max_model_len") or DEFAULT_MAX_MODEL_LEN)
    sequences = int(args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS) if need.kv_from_config else 1
    gpus = f" (x{need.devices} GPUs)" if need.devices > 1 else ""
    return (
        f"| `{key}` | {need.weights_bytes / GIB:.1f} | {need.weights_from} | {need.kv_bytes / GIB:.2f} "
        f"| {sequences} x {length:,} tokens | {need.kv_from} | {need.per_device / GIB:.1f}{gpus} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hub", action="store_true", help="read each model's files from the Hub first")
    print(table(parser.parse_args().hub), end="")


if __name__ == "__main__":
    main()
