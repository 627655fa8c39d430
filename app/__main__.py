"""`python -m app`: for now, the model catalog and what this machine can serve.

The browser UI arrives with the Gradio app; until then this command loads and validates every
model card (a bad card stops it with the file name) and prints the catalog.
"""

from __future__ import annotations

import argparse
import sys

from app.cards import CardError, ModelCard, load_cards
from app.config import Settings, SettingsError


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    parser.add_argument("--available", action="store_true", help="list only servable models")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        cards = load_cards(settings.cards_dir)
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
