"""`python -m app`: starts VLM Playground in the browser (`--list`: prints the catalog instead).

Every model card is loaded and validated first (a bad card stops it with the file name). On a
machine that can serve none of the catalog (no GPU, no remote engine), tiny random-weight models
are built locally so that the interface still works; the UI labels them as random weights.

SIGTERM (how Docker and Hugging Face stop a container) and SIGINT (Ctrl-C) stop it within 30 s
(`SHUTDOWN_TIMEOUT_S`): answers are cut off, the engines are shut down, then the web server; any
child process still running is killed and vLLM's socket files left by this run are removed. It
then exits with code 0 (1 when the engines did not stop by themselves in time). A second signal
during the stop, or a stop not done in time, ends it at once with code 128 + the signal's number,
after the same last-resort cleanup.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from app.cards import CardError, ModelCard, load_cards, servable_cards
from app.config import MemoryBudget, Settings, SettingsError, parse_bytes, parse_mapping
from app.shutdown import ENGINES_CLOSE_S, Shutdown

# Small, strong models to select at start on a GPU machine, best first.
PREFERRED_DEFAULTS = ("qwen2_5_vl", "qwen2_vl", "phi3_v", "llava")
DEMO_VARIANTS = {"demo_tiny_a": "tiny-a", "demo_tiny_b": "tiny-b"}

log = logging.getLogger(__name__)


def catalog_rows(cards: dict[str, ModelCard], settings: Settings) -> list[tuple[str, ...]]:
    rows = []
    for card in sorted_cards(cards):
        availability = card.availability(
            settings.gpu_count, settings.allow_remote_code, card.key in settings.remote_engines
        )
        media = ", ".join(card.modalities) + (" (several images)" if card.multi_image else "")
        status = "yes" if availability.available else f"no: {availability.reason}"
        rows.append((card.key, card.display_name, card.hf_repo, media, status))
    return rows


def catalog_markdown(cards: dict[str, ModelCard]) -> str:
    """The catalog as the README's table: what each model takes and whether one GPU serves it
    with the default operator settings (no remote code). `python -m app --list --markdown`."""
    settings = Settings(gpu_count=1)
    lines = [
        "| model | key | repository | media | hardware | on one GPU |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row, card in zip(catalog_rows(cards, settings), sorted_cards(cards), strict=True):
        key, name, repo, media, status = row
        cells = [name, f"`{key}`", repo, media, card.hardware, status]
        lines.append("| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def sorted_cards(cards: dict[str, ModelCard]) -> list[ModelCard]:
    return sorted(cards.values(), key=lambda c: (c.family, c.display_name))


def parse_pairs(pairs: list[str] | None, flag: str) -> dict[str, str] | None:
    return parse_mapping(flag, ",".join(pairs)) if pairs else None


def settings_from(args: argparse.Namespace) -> Settings:
    """The environment's settings, with the flags given on the command line on top."""
    folders = parse_pairs(args.model_folder, "--model-folder")
    remote = parse_pairs(args.remote_engine, "--remote-engine")
    return Settings.from_env().with_overrides(
        host=args.host,
        port=args.port,
        share=args.share,
        models=tuple(k.strip() for k in args.models.split(",") if k.strip()) if args.models else None,
        demo_models=args.demo_models,
        demo_dir=args.demo_dir,
        queue_size=args.queue_size,
        concurrency=args.concurrency,
        max_upload_bytes=parse_bytes("--max-upload", args.max_upload, 0) if args.max_upload else None,
        default_model=args.default_model,
        memory_budget=MemoryBudget.parse(args.memory_budget) if args.memory_budget else None,
        max_resident=args.max_resident,
        idle_unload_s=args.idle_unload_s,
        drain_timeout_s=args.drain_timeout_s,
        quantum_s=args.quantum_s,
        host_memory_budget=parse_bytes("--host-memory-budget", args.host_memory_budget, 0)
        if args.host_memory_budget
        else None,
        enforce_eager=args.eager,
        model_folders={k: Path(v) for k, v in folders.items()} if folders else None,
        remote_engines=remote,
        hf_cache=args.hf_cache,
    )


def default_demo_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "vlm-playground" / "demo-models"


def with_demo_models(cards: dict[str, ModelCard], settings: Settings) -> dict[str, ModelCard]:
    """The catalog, plus the tiny demo models where the settings ask for them or where this
    machine can serve nothing else. Built once into the demo folder (about a second each)."""
    servable = servable_cards(
        offered(cards, settings), settings.gpu_count, settings.allow_remote_code, settings.remote_engines
    )
    wanted = settings.demo_models if settings.demo_models is not None else not servable
    if not wanted:
        return cards
    from app.tiny_model import build_tiny_vlm, tiny_card  # torch is imported only here

    folder = settings.demo_dir or default_demo_dir()
    demo = {
        key: tiny_card(key, build_tiny_vlm(folder / variant, variant), variant)
        for key, variant in DEMO_VARIANTS.items()
    }
    return demo | cards


def offered(cards: dict[str, ModelCard], settings: Settings) -> dict[str, ModelCard]:
    """The cards the operator offers (APP_MODELS; all when empty), the demo models included."""
    return {
        k: c for k, c in cards.items() if not settings.models or k in settings.models or k in DEMO_VARIANTS
    }


def default_model(cards: dict[str, ModelCard], settings: Settings) -> str | None:
    """The operator's choice, else a small strong model this machine can serve, else a demo model."""
    if settings.default_model:
        return settings.default_model
    servable = servable_cards(cards, settings.gpu_count, settings.allow_remote_code, settings.remote_engines)
    preferred = [k for k in (*PREFERRED_DEFAULTS, *DEMO_VARIANTS) if k in servable]
    return next(iter(preferred or servable), None)


def serve(cards: dict[str, ModelCard], settings: Settings) -> int:
    """Builds the manager and the page, and serves until interrupted."""
    from app.engine import EngineManager
    from app.media import VideoDecoderPool
    from app.ui import Playground, launch
    from app.vllm_engine import VllmEngineFactory

    if settings.gpu_count == 0:
        from app.tiny_model import use_local_vllm_environment

        use_local_vllm_environment((settings.demo_dir or default_demo_dir()).parent / "vllm")
    cards = offered(cards, settings)
    settings = settings.with_overrides(default_model=default_model(cards, settings))
    shutdown = Shutdown(Path(os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()))
    shutdown.install()
    manager = EngineManager(cards, settings, VllmEngineFactory(settings))
    decoder = VideoDecoderPool()
    playground = Playground(manager, settings, decoder)
    print(
        f"VLM Playground on http://{settings.host}:{settings.port} (default model: {settings.default_model})"
    )
    demo = None
    engines_stopped = False
    try:
        demo = launch(playground.build(), settings, block=False, quiet=False)
        shutdown.wait()
    finally:
        # In this order: the engines need the server's loop, which closing the server ends.
        try:
            playground.close(ENGINES_CLOSE_S)
            engines_stopped = True
        except TimeoutError:
            log.warning("the engines did not stop within %s s", ENGINES_CLOSE_S)
        except Exception:
            log.exception("stopping the engines failed")
        if demo is not None:
            stop_event = getattr(getattr(demo, "app", None), "stop_event", None)
            if stop_event is not None and playground.loop is not None and playground.loop.is_running():
                # Gradio sets this asyncio event from this thread in `close`, which does not wake
                # the server's loop: open pages' heartbeat streams would hold the server 5 s more.
                playground.loop.call_soon_threadsafe(stop_event.set)
            demo.close()
        decoder.close()
        shutdown.reap()
        if shutdown.since is not None:
            log.info("stopped %.1f s after the signal", time.monotonic() - shutdown.since)
    return 0 if engines_stopped else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    parser.add_argument("--list", action="store_true", help="print the catalog and exit")
    parser.add_argument("--available", action="store_true", help="with --list: only servable models")
    parser.add_argument("--markdown", action="store_true", help="with --list: the README's catalog table")
    web = parser.add_argument_group("web app (each overrides its APP_* variable)")
    web.add_argument("--host", help="address to listen on (APP_HOST; 0.0.0.0 for every interface)")
    web.add_argument("--port", type=int, help="port (APP_PORT, default 7860)")
    web.add_argument("--share", action=argparse.BooleanOptionalAction, help="Gradio share link (APP_SHARE)")
    web.add_argument("--models", help="comma-separated card keys to offer (APP_MODELS; default all)")
    web.add_argument(
        "--demo-models",
        action=argparse.BooleanOptionalAction,
        help="offer the tiny random-weight models (APP_DEMO_MODELS; default: when nothing else is servable)",
    )
    web.add_argument("--demo-dir", type=Path, help="where the demo models are built (APP_DEMO_DIR)")
    web.add_argument(
        "--queue-size", type=int, help="events waiting before new ones are refused (APP_QUEUE_SIZE)"
    )
    web.add_argument("--concurrency", type=int, help="answers generated at once per view (APP_CONCURRENCY)")
    web.add_argument("--max-upload", help="largest upload, e.g. 200MB (APP_MAX_UPLOAD)")
    engines = parser.add_argument_group("engines (each overrides its APP_* variable)")
    engines.add_argument("--default-model", help="card key selected at start (APP_DEFAULT_MODEL)")
    engines.add_argument("--memory-budget", help="GPU fraction (0.9) or bytes (40GiB) (APP_MEMORY_BUDGET)")
    engines.add_argument(
        "--max-resident", type=int, help="cap on engines awake at once (APP_MAX_RESIDENT; default: by memory)"
    )
    engines.add_argument(
        "--idle-unload-s", type=float, help="unload engines idle this long (APP_IDLE_UNLOAD_S)"
    )
    engines.add_argument(
        "--drain-timeout-s", type=float, help="swap waits this long for answers (APP_DRAIN_TIMEOUT_S)"
    )
    engines.add_argument(
        "--quantum-s",
        type=float,
        help="a model in use keeps the GPU this long while others wait (APP_QUANTUM_S, default 30)",
    )
    engines.add_argument(
        "--host-memory-budget", help="host memory for sleeping engines, e.g. 64GiB (APP_HOST_MEMORY_BUDGET)"
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
    if not args.list:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return serve(with_demo_models(cards, settings), settings)
    if args.markdown:
        print(catalog_markdown(cards), end="")
        return 0
    rows = catalog_rows(cards, settings)
    if args.available:
        rows = [row for row in rows if row[-1] == "yes"]
    for key, name, repo, media, status in rows:
        print(f"{key:24} {name:38} {repo:48} {media:28} {status}")
    print(
        f"\n{len(cards)} model cards; this machine has {settings.gpu_count} GPU(s), remote code "
        f"{'allowed' if settings.allow_remote_code else 'not allowed'} (APP_ALLOW_REMOTE_CODE)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
