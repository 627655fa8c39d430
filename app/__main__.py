"""`python -m app`: for now, the model catalog and what this machine can serve.

The browser UI arrives with the Gradio app; until then this command loads and validates every
model card (a bad card stops it with the file name) and prints the catalog.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cards import CardError, ModelCard, load_cards
from app.config import MemoryBudget, Settings, SettingsError, parse_mapping


def catalog_rows(cards: dict[str, ModelCard], settings: Settings) -> list[tuple[str, ...]]:
    rows = []
    for card in sorted(cards.values(), key=lambda c: (c.family, c.display_name)):
        availability = card.availability(
            settings.gpu_count, settings.allow_remote_code, card.key in settings.remote_engines
        )
        media = ", ".join(card.modalities) + (" (several images)" if card.multi_image else "")
        status = "yes" if availability.available else f"no: {availability.reason}"
        rows.append((card.key, card.display_name, card.hf_repo, media, status))
    return rows


def parse_pairs(pairs: list[str] | None, flag: str) -> dict[str, str] | None:
    return parse_mapping(flag, ",".join(pairs)) if pairs else None


def settings_from(args: argparse.Namespace) -> Settings:
    """The environment's settings, with the flags given on the command line on top."""
    folders = parse_pairs(args.model_folder, "--model-folder")
    remote = parse_pairs(args.remote_engine, "--remote-engine")
    return Settings.from_env().with_overrides(
        default_model=args.default_model,
        memory_budget=MemoryBudget.parse(args.memory_budget) if args.memory_budget else None,
        max_resident=args.max_resident,
        idle_unload_s=args.idle_unload_s,
        drain_timeout_s=args.drain_timeout_s,
        enforce_eager=args.eager,
        model_folders={k: Path(v) for k, v in folders.items()} if folders else None,
        remote_engines=remote,
        hf_cache=args.hf_cache,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    parser.add_argument("--available", action="store_true", help="list only servable models")
    engines = parser.add_argument_group("engines (each overrides its APP_* variable)")
    engines.add_argument("--default-model", help="card key selected at start (APP_DEFAULT_MODEL)")
    engines.add_argument("--memory-budget", help="GPU fraction (0.9) or bytes (40GiB) (APP_MEMORY_BUDGET)")
    engines.add_argument("--max-resident", type=int, help="engines resident at once (APP_MAX_RESIDENT)")
    engines.add_argument(
        "--idle-unload-s", type=float, help="unload engines idle this long (APP_IDLE_UNLOAD_S)"
    )
    engines.add_argument(
        "--drain-timeout-s", type=float, help="swap waits this long for answers (APP_DRAIN_TIMEOUT_S)"
    )
    engines.add_argument(
        "--eager", action=argparse.BooleanOptionalAction, help="eager mode (APP_ENFORCE_EAGER)"
    )
    engines.add_argument(
        "--model-folder", action="append", metavar="KEY=PATH", help="APP_MODEL_FOLDERS entry"
    )
    engines.add_argument(
        "--remote-engine", action="append", metavar="KEY=URL", help="APP_REMOTE_ENGINES entry"
    )
    engines.add_argument("--hf-cache", type=Path, help="where weights are downloaded (APP_HF_CACHE)")
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
        cards = load_cards(settings.cards_dir)
        settings.check_keys(cards)
    except (CardError, SettingsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = catalog_rows(cards, settings)
    if args.available:
        rows = [row for row in rows if row[-1] == "yes"]
    for key, name, repo, media, status in rows:
        print(f"{key:24} {name:38} {repo:48} {media:28} {status}")
    print(
        f"\n{len(cards)} model cards; this machine has {settings.gpu_count} GPU(s), remote code "
        f"{'allowed' if settings.allow_remote_code else 'not allowed'} (APP_ALLOW_REMOTE_CODE)."
        "\nThe browser UI is not built yet: this command validates and lists the catalog."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
