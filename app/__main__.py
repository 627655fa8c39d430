"""`python -m app`: starts VLM Playground in the browser (`--list`: prints the catalog instead;
`eval`: runs a prompt set across models into a report, `app.evaluate`).

Every model card is loaded and validated first (a bad card stops it with the file name). On a
machine that can serve none of the catalog (no GPU, no remote engine), it serves the demo models
(`app.demo.models`): two tiny models trained here on drawings of shapes (weights in the
repository), and random-weight twins of two real cards built locally, which the UI labels so.

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
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from app.catalog.cards import CardError, ModelCard, load_cards, servable_cards
from app.config import Settings, SettingsError, add_flags, from_command_line
from app.demo.models import (
    DEMO_MODELS,
    default_demo_dir,
    offered,
    use_local_vllm_environment,
    with_demo_models,
)
from app.shutdown import ENGINES_CLOSE_S, Shutdown

if TYPE_CHECKING:  # SQLAlchemy is imported only to serve (not for --list)
    from app.storage.history import History

# Small, strong models to select at start on a GPU machine, best first.
PREFERRED_DEFAULTS = ("qwen2_5_vl", "qwen2_vl", "phi3_v", "llava")

log = logging.getLogger(__name__)
EVAL_HELP = "python -m app eval --help: run a prompt set across models into a report, without a browser"


def catalog_rows(cards: dict[str, ModelCard], settings: Settings) -> list[tuple[str, ...]]:
    rows = []
    for card in sorted_cards(cards):
        availability = card.availability(
            settings.gpu_count, settings.allow_remote_code, card.key in settings.remote_engines
        )
        several = card.media_limits.get("image", 0) > 1
        media = ", ".join(card.modalities) + (
            f" ({card.media_limits['image']} images a prompt)" if several else ""
        )
        status = "yes" if availability.available else f"no: {availability.reason}"
        # A twin's folder is a path on this server: named by the repository it copies.
        repository = card.source if card.made_here else card.hf_repo
        rows.append((card.key, card.display_name, repository, media, status))
    return rows


def catalog_markdown(cards: dict[str, ModelCard]) -> str:
    """The catalog as docs/CATALOG.md's table: what each model takes, whether one GPU serves it with
    the default operator settings (no remote code), and what its twin verified on the real
    engine in the tests (`app.demo.twins`). `python -m app --list --markdown`."""
    from app.demo.twins import twin_status

    settings = Settings(gpu_count=1)
    lines = [
        "| model | key | repository | media | hardware | on one GPU | twin on the real engine (CPU, CI) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row, card in zip(catalog_rows(cards, settings), sorted_cards(cards), strict=True):
        key, name, repo, media, status = row
        cells = [name, f"`{key}`", repo, media, card.hardware, status, twin_status(card)]
        lines.append("| " + " | ".join(cell.replace("|", "/").replace("\n", " ") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def sorted_cards(cards: dict[str, ModelCard]) -> list[ModelCard]:
    return sorted(cards.values(), key=lambda c: (c.family, c.display_name))


def default_model(cards: dict[str, ModelCard], settings: Settings) -> str | None:
    """The operator's choice, else a small strong model this machine can serve, else a demo model."""
    if settings.default_model:
        return settings.default_model
    servable = servable_cards(cards, settings.gpu_count, settings.allow_remote_code, settings.remote_engines)
    preferred = [k for k in (*PREFERRED_DEFAULTS, *DEMO_MODELS) if k in servable]
    return next(iter(preferred or servable), None)


def reach_from_elsewhere(settings: Settings) -> str | None:
    """How to open a page that listens on loopback from another machine (a GPU box reached from
    a laptop shows nothing otherwise), or None where it listens on the network already."""
    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        return None
    port = settings.port
    return (
        f"From another machine: ssh -L {port}:127.0.0.1:{port} {socket.gethostname()}, then open "
        f"http://127.0.0.1:{port} there; or listen on the network with --host 0.0.0.0 (APP_HOST)."
    )


def serve(cards: dict[str, ModelCard], settings: Settings, history: History | None = None) -> int:
    """Builds the manager and the page, and serves until interrupted."""
    from app.engines.manager import EngineManager
    from app.engines.vllm_engine import VllmEngineFactory
    from app.media.loading import VideoDecoderPool
    from app.views import Playground, build, launch

    if settings.gpu_count == 0:
        use_local_vllm_environment((settings.demo_dir or default_demo_dir()).parent / "vllm")
    cards = offered(cards, settings)
    settings = settings.with_overrides(default_model=default_model(cards, settings))
    shutdown = Shutdown(Path(os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()))
    shutdown.install()
    factory = VllmEngineFactory(settings)
    if settings.gpu_count:
        # Each Hub model's config and weights' size (kilobytes), so the scheduler sizes a model
        # from its own numbers before its first build; in the background: the page is up at once.
        threading.Thread(
            target=factory.read_facts_from_hub, args=(list(cards.values()),), name="model-facts", daemon=True
        ).start()
    manager = EngineManager(cards, settings, factory)
    decoder = VideoDecoderPool()
    playground = Playground(manager, settings, decoder, history)
    print(
        f"VLM Playground on http://{settings.host}:{settings.port} (default model: {settings.default_model})"
    )
    if (reach := reach_from_elsewhere(settings)) is not None:
        print(reach)
    demo = None
    engines_stopped = False
    try:
        demo = launch(build(playground), settings, block=False, quiet=False)
        playground.start_housekeeping()
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"]:  # a prompt set across models, into a report (app.evaluate)
        from app.evaluate import main as evaluate

        code = evaluate(argv[1:])
        # vLLM's AsyncLLM objects, already shut down, shut down again when the interpreter
        # collects them at exit, after their modules are gone, and print a TypeError traceback:
        # this command's work is done and written, so it ends here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if argv[:1] == ["add-user"]:  # an account for APP_SIGN_IN=password
        return add_user_command(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__, epilog=EVAL_HELP)
    parser.add_argument("--list", action="store_true", help="print the catalog and exit")
    parser.add_argument("--available", action="store_true", help="with --list: only servable models")
    parser.add_argument(
        "--markdown", action="store_true", help="with --list: the catalog table of docs/CATALOG.md"
    )
    add_flags(parser)
    args = parser.parse_args(argv)
    try:
        settings = from_command_line(args)
        cards = load_cards(settings.cards_dir)
        # The demo models are keys too (the arena's pool on a CPU machine is made of them).
        settings.check_keys([*cards, *DEMO_MODELS])
    except (CardError, SettingsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.list:
        if busy := port_in_use(settings.host, settings.port):
            print(f"error: {busy}", file=sys.stderr)
            return 2
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from app.storage.history import open_history
        from app.views.accounts import AccountError, read_users

        if settings.sign_in == "huggingface" and os.environ.get("SYSTEM") != "spaces":
            # Gradio's OAuth needs the Space's OAuth app (`hf_oauth: true`); elsewhere it would
            # stop with a traceback asking for a local Hugging Face login.
            print(
                "error: APP_SIGN_IN=huggingface works on a Hugging Face Space with `hf_oauth: true` in its "
                "README; elsewhere use proxy or password",
                file=sys.stderr,
            )
            return 2
        try:
            if settings.sign_in == "password" and settings.users_file is not None:
                read_users(settings.users_file)  # a bad line stops it here, with its number
            history = open_history(settings)
        except (SettingsError, AccountError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return serve(with_demo_models(cards, settings), settings, history)
    if args.markdown:
        print(catalog_markdown(cards), end="")
        return 0
    return print_catalog(cards, settings, available_only=args.available)


def add_user_command(argv: list[str]) -> int:
    """`python -m app add-user NAME [--users-file FILE]`: adds an account for password sign-in,
    or changes its password. The password is asked for twice on a terminal, else read from the
    first line of standard input (for scripts)."""
    import getpass

    from app.views.accounts import AccountError, add_user

    parser = argparse.ArgumentParser(prog="python -m app add-user", description=add_user_command.__doc__)
    parser.add_argument("name", help="the account's name: letters, digits and . _ @ + -")
    parser.add_argument(
        "--users-file", type=Path, default=None, help="the users file (default: APP_USERS_FILE)"
    )
    args = parser.parse_args(argv)
    path = args.users_file or (
        Path(os.environ["APP_USERS_FILE"]) if os.environ.get("APP_USERS_FILE") else None
    )
    if path is None:
        print("error: name the users file with --users-file or APP_USERS_FILE", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            print("error: the two passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\n")
    try:
        add_user(path, args.name, password)
    except (AccountError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{args.name} can sign in: start with APP_SIGN_IN=password APP_USERS_FILE={path}")
    return 0


def port_in_use(host: str, port: int) -> str | None:
    """Why the page cannot be served on `host:port`, checked before anything is built (Gradio
    would print a traceback naming its own variable), or None when the port is free."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return (
                f"port {port} on {host} cannot be used ({error.strerror or error}): stop what uses "
                "it, or pick another with --port or APP_PORT"
            )
    return None


def print_catalog(cards: dict[str, ModelCard], settings: Settings, available_only: bool = False) -> int:
    """`--list`: a header, then what the app would offer on this machine (APP_MODELS), the demo
    models first where they are what it serves, each with whether it can be served and why not."""
    offer = offered(with_demo_models(cards, settings), settings)
    demo = {k: c for k, c in offer.items() if k in DEMO_MODELS}
    rows = catalog_rows(demo, settings) + catalog_rows(
        {k: c for k, c in offer.items() if k not in demo}, settings
    )
    if available_only:
        rows = [row for row in rows if row[-1] == "yes"]
    table = [("key", "model", "repository", "media", "available"), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    if available_only and not rows:
        print("(none: see `python -m app --list` for the reasons)")
    served = sum(row[-1] == "yes" for row in catalog_rows(offer, settings))
    offered_text = f", {len(offer) - len(demo)} offered (APP_MODELS)" if settings.models else ""
    print(
        f"\n{len(cards)} model cards{offered_text}"
        + (f" and {len(demo)} demo models (APP_DEMO_MODELS)" if demo else "")
        + f"; {served} can be served here. This machine has {settings.gpu_count} GPU(s), remote code "
        f"{'allowed' if settings.allow_remote_code else 'not allowed'} (APP_ALLOW_REMOTE_CODE)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
