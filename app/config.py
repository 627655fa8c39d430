"""Settings: one object, validated once, from the environment (`APP_*`) and the command line.

`Settings` is a pydantic-settings model. `Settings.from_env` reads the `APP_*` variables;
`python -m app` adds one flag per field (`add_flags`) and `from_command_line` lays the flags given
on top of the environment, then validates the whole once, so a bad value is refused the same way
whichever source wrote it: one line naming the variable or flag and what to write
(`SettingsError`). `Settings(...)` in code reads no environment and is validated the same way.
Nothing else in the app reads the environment for its own settings.
"""

from __future__ import annotations

import argparse
import glob
import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


class SettingsError(ValueError):
    """A setting the operator wrote that cannot be used; the message names the variable or flag."""


def detect_gpu_count(env: Mapping[str, str], devices: Sequence[str] | None = None) -> int:
    """NVIDIA GPUs visible to this process, without importing torch: the device files,
    narrowed by CUDA_VISIBLE_DEVICES where it is set."""
    present = len(glob.glob("/dev/nvidia[0-9]*") if devices is None else devices)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    return min(present, len(cuda_visible_entries(visible, present)))


def cuda_visible_entries(text: str, present: int | None = None) -> list[str]:
    """CUDA_VISIBLE_DEVICES's entries as CUDA reads them, up to the first it cannot read (it sees
    none after it). The rules are CUDA's as torch mirrors them (`torch.cuda._parse_visible_devices`,
    read from torch 2.13): the first entry decides the list's kind; UUIDs ("GPU-..." whole or a
    prefix, or "MIG-...") run until an entry of another kind; numbers (their leading digits, as C's
    strtoul reads them) until one that is empty, negative or, where the GPUs' count is known
    (`present`), past the last GPU; a number or UUID given twice leaves CUDA no GPU at all. Seen on
    an H200, one GPU: "1", "GPU-" alone and a UUID without "GPU-" left CUDA none; "GPU-c002ef2a" (a
    prefix) found it."""
    entries: list[str] = []
    items = [item.strip() for item in text.split(",")]
    kind = next((prefix for prefix in ("GPU-", "MIG-") if items[0].startswith(prefix)), None)
    for item in items:
        if kind is not None:
            if not item.startswith(kind) or item == kind:
                break
            entry = item
        else:
            digits = re.match(r"\+?[0-9]+", item)
            if digits is None or (present is not None and int(digits.group()) >= present):
                break
            entry = str(int(digits.group()))
        if entry in entries:
            return []
        entries.append(entry)
    return entries


@dataclass(frozen=True)
class MemoryBudget:
    """What all resident engines may use together: a fraction of each GPU, or bytes."""

    fraction: float | None = 0.9
    bytes: int | None = None

    @classmethod
    def parse(cls, text: str) -> MemoryBudget:
        text = text.strip().lower().replace(" ", "")
        if re.fullmatch(r"0?\.\d+|1(\.0*)?", text) and float(text) > 0:
            return cls(fraction=float(text))
        try:
            if size := parse_bytes("APP_MEMORY_BUDGET", text, 0):
                return cls(fraction=None, bytes=size)
        except SettingsError:
            pass
        raise SettingsError(f"APP_MEMORY_BUDGET={text!r}: write a fraction like 0.9 or bytes like 40GiB")

    def describe(self) -> str:
        if self.bytes is not None:
            return f"{self.bytes / 2**30:.1f} GiB"
        return f"{self.fraction:.0%} of GPU memory"


def parse_bytes(name: str, text: str, default: int) -> int:
    """`200MB`, `1.5GiB` or a plain number of bytes; `default` when empty."""
    text = text.strip().lower().replace(" ", "")
    if not text:
        return default
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", text)
    if not match or match.group(2) not in UNITS:
        raise SettingsError(f"{name}={text!r}: write bytes like 200MB or 1GiB")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def parse_mapping(name: str, text: str) -> dict[str, str]:
    """`key=value,key=value` (spaces allowed) into a dict; the variable name is in errors."""
    mapping = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SettingsError(f"{name}: {item!r} is not of the form card_key=value")
        mapping[key.strip()] = value.strip()
    return mapping


# --- how text (a variable, a flag) becomes a value; the same for both sources ---


def _bytes(value: Any) -> Any:
    return parse_bytes("", value, -1) if isinstance(value, str) else value


def _budget(value: Any) -> Any:
    return MemoryBudget.parse(value) if isinstance(value, str) else value


def _mapping(value: Any) -> Any:
    return parse_mapping("", value) if isinstance(value, str) else value


def _keys(value: Any) -> Any:
    return tuple(k.strip() for k in value.split(",") if k.strip()) if isinstance(value, str) else value


def _networks(value: Any) -> Any:
    """Addresses or ranges (`10.0.0.0/8`), each checked as one."""
    entries = _keys(value)
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"{entry!r} is not an IP address or range (like 10.0.0.7 or 10.0.0.0/8)"
            ) from None
    return entries


def _blank_is_none(value: Any) -> Any:
    return None if isinstance(value, str) and not value.strip() else value


def _zero_is_none(value: Any) -> Any:
    return None if _bytes(value) == 0 else value


def _nonblank(text: str) -> str:
    if not text.strip():
        raise ValueError("empty")
    return text.strip()


def _header_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", text):
        raise ValueError("not a header name")
    return text


def _http_url(text: str | None) -> str | None:
    if text is not None and not (urlsplit(text).scheme in ("http", "https") and urlsplit(text).hostname):
        raise ValueError("not an http(s) URL")
    return text


@dataclass(frozen=True)
class Doc:
    """A field's line in `--help` and in errors: what it means, its default as the operator reads
    it, what to write when a value is refused, and its variable and flag where not derived from
    the field's name (`APP_` + NAME, `--name`)."""

    help: str
    write: str
    default: str | None = None
    env: str | None = None
    flag: str | None = None
    metavar: str = "VALUE"
    repeat: bool = False
    group: str = "engines"


def doc(field_name: str) -> Doc:
    return next(m for m in Settings.model_fields[field_name].metadata if isinstance(m, Doc))


def env_name(field_name: str) -> str:
    return doc(field_name).env or f"APP_{field_name.upper()}"


def flag_name(field_name: str) -> str:
    return doc(field_name).flag or "--" + field_name.replace("_", "-")


FLAG = "1 or 0 (also yes/no, true/false, on/off)"
SECONDS = "seconds, a number of 0 or more"
COUNT = "a whole number of at least 1"
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1)]
Bytes = Annotated[int, BeforeValidator(_bytes), Field(ge=1)]
BytesOrZero = Annotated[int, BeforeValidator(_bytes), Field(ge=0)]  # 0 turns the thing off
OptionalPath = Annotated[Path | None, BeforeValidator(_blank_is_none)]
OptionalText = Annotated[str | None, BeforeValidator(_blank_is_none)]


class _Environment(EnvSettingsSource):
    """pydantic-settings' reading of the `APP_*` variables, from a given mapping, by their exact
    names (`env_name`: `APP_MAX_UPLOAD` is `max_upload_bytes`'s)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = {
            f"app_{name}": env[env_name(name)] for name in settings_cls.model_fields if env_name(name) in env
        }
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._given, False, self.env_ignore_empty, self.env_parse_none_str)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="APP_",
        env_ignore_empty=True,
        frozen=True,
        extra="forbid",
    )

    cards_dir: Annotated[
        OptionalPath,
        Doc("folder of model cards", "a folder", default="the bundled model_cards/", metavar="DIR"),
    ] = None
    allow_remote_code: Annotated[
        bool, Doc("offer the models that run code from their repository", FLAG, default="off")
    ] = False
    gpu_count: Annotated[
        int,
        Field(ge=0),
        Doc(
            "GPUs this app may use",
            "a whole number of 0 or more",
            default="the GPUs this process sees",
            metavar="N",
        ),
    ] = 0
    default_model: Annotated[
        OptionalText,
        Doc(
            "card key selected at start",
            "a card key",
            default="a small strong model served here",
            metavar="KEY",
        ),
    ] = None
    memory_budget: Annotated[
        MemoryBudget,
        NoDecode,
        BeforeValidator(_budget),
        Doc(
            "GPU memory all resident engines may use",
            "a fraction like 0.9 or bytes like 40GiB",
            default="0.9",
            metavar="BUDGET",
        ),
    ] = MemoryBudget()
    # An optional cap on engines awake at once; None: as many as fit in the memory budget.
    max_resident: Annotated[
        Count | None,
        BeforeValidator(_blank_is_none),
        Doc(
            "cap on engines awake at once", COUNT, default="as many as fit in the memory budget", metavar="N"
        ),
    ] = None
    # Seconds a model in use keeps the GPU while another model's requests wait for it.
    quantum_s: Annotated[
        Seconds,
        Doc(
            "seconds a model in use keeps the GPU while other models' requests wait",
            SECONDS,
            metavar="SECONDS",
        ),
    ] = 30.0
    # Host memory for sleeping engines' weights (CUDA sleep mode); None: half the machine's RAM.
    host_memory_budget: Annotated[
        Bytes | None,
        BeforeValidator(_zero_is_none),
        Doc(
            "host memory for sleeping engines' weights",
            "bytes like 64GiB",
            default="half the RAM",
            metavar="BYTES",
        ),
    ] = None
    # Seconds an engine may sit unused before it is unloaded (0: never).
    idle_unload_s: Annotated[
        Seconds, Doc("unload an engine unused this many seconds (0: never)", SECONDS, metavar="SECONDS")
    ] = 1800.0
    # Seconds a swap waits for answers in flight on the engine it evicts before stopping them.
    drain_timeout_s: Annotated[
        Seconds,
        Doc(
            "seconds a swap waits for the answers in flight on the engine it evicts",
            SECONDS,
            metavar="SECONDS",
        ),
    ] = 60.0
    # None: eager on CPU (compiling costs more than it gains for a demo), compiled on GPU.
    enforce_eager: Annotated[
        bool | None, Doc("vLLM's eager mode", FLAG, default="on without a GPU, off with one", flag="--eager")
    ] = None
    # The references' single-image examples give 2,048-8,192 tokens of context; a chat with
    # several pictures needs more. On a GPU a model whose config allows it gets this many.
    chat_context: Annotated[
        Count,
        Doc(
            "tokens of context a chat gets on a GPU where the model's config allows them "
            "(never fewer than its card's; see docs/MEMORY.md)",
            COUNT,
            metavar="TOKENS",
        ),
    ] = 16384
    # KV cache per engine where no GPU sizes it (CPU); vLLM would otherwise take half the RAM.
    cpu_kv_cache_bytes: Annotated[
        Bytes,
        Doc("KV cache per engine without a GPU", "bytes like 256MiB", default="256MiB", metavar="BYTES"),
    ] = 256 * 2**20
    # vLLM keeps each picture and video it processed, to skip the work when a chat sends it again
    # (every turn resends the chat's media), in the engine's process (the app's keeps only their
    # keys): by default up to 4 GiB an engine, so distinct pictures from strangers grew a server
    # by about 1 MiB each. Bounded here; a card's own `mm_processor_cache_gb` is kept.
    media_cache_bytes: Annotated[
        BytesOrZero,
        Doc(
            "vLLM's cache of processed pictures and videos, per engine process (0: none)",
            "bytes like 512MiB",
            default="512MiB",
            metavar="BYTES",
        ),
    ] = 512 * 2**20
    model_folders: Annotated[
        dict[str, Path],
        NoDecode,
        BeforeValidator(_mapping),
        Doc(
            "a card's model from a local folder (repeat the flag for more)",
            "card_key=path pairs separated by commas",
            default="none",
            flag="--model-folder",
            metavar="KEY=PATH",
            repeat=True,
        ),
    ] = {}
    # vLLM's load_format for local engines: "dummy" makes random weights (twins, benchmarks).
    load_format: Annotated[
        OptionalText,
        Doc(
            "vLLM's load_format (dummy: random weights)",
            "a vLLM load format",
            default="vLLM's",
            metavar="FORMAT",
        ),
    ] = None
    # Overrides every card's tensor_parallel_size (twins on CPU run at 1); None: the card's.
    tensor_parallel_size: Annotated[
        Count | None,
        BeforeValidator(_blank_is_none),
        Doc("GPUs per engine, for every card", COUNT, default="the card's", metavar="N"),
    ] = None
    remote_engines: Annotated[
        dict[str, str],
        NoDecode,
        BeforeValidator(_mapping),
        Doc(
            "a card served by a vLLM server elsewhere (repeat the flag for more)",
            "card_key=url pairs separated by commas",
            default="none",
            flag="--remote-engine",
            metavar="KEY=URL",
            repeat=True,
        ),
    ] = {}
    hf_cache: Annotated[
        OptionalPath,
        Doc("where weights are downloaded", "a folder", default="Hugging Face's cache", metavar="DIR"),
    ] = None
    # --- the web app ---
    host: Annotated[
        str,
        AfterValidator(_nonblank),
        Doc(
            "address to listen on (0.0.0.0: every interface)",
            "an address like 127.0.0.1",
            metavar="ADDRESS",
            group="web",
        ),
    ] = "127.0.0.1"
    port: Annotated[
        int, Field(ge=0, le=65535), Doc("port", "a port number, 0 to 65535", metavar="PORT", group="web")
    ] = 7860
    share: Annotated[bool, Doc("Gradio share link", FLAG, default="off", group="web")] = False
    # Where users reach the page (behind a proxy, on a Space): its address is never taken from
    # request headers, and requests for other host names are refused.
    public_url: Annotated[
        OptionalText,
        AfterValidator(_http_url),
        Doc(
            "the page's public address, like https://vlm.example.org",
            "an http(s) URL",
            default="on a Hugging Face Space, https://$SPACE_HOST; else none",
            metavar="URL",
            group="web",
        ),
    ] = None
    # Card keys offered in the UI (empty: the whole catalog).
    models: Annotated[
        tuple[str, ...],
        NoDecode,
        BeforeValidator(_keys),
        Doc(
            "card keys to offer, separated by commas",
            "card keys separated by commas",
            default="all",
            metavar="KEYS",
            group="web",
        ),
    ] = ()
    # The demo models (two trained on shapes here, two random-weight twins) for trying the
    # interface; None: only when nothing else is servable.
    demo_models: Annotated[
        bool | None,
        Doc(
            "offer the demo models (two trained on shapes here, two random-weight twins)",
            FLAG,
            default="when nothing else is servable",
            group="web",
        ),
    ] = None
    demo_dir: Annotated[
        OptionalPath,
        Doc(
            "where the demo models are built",
            "a folder",
            default="~/.cache/vlm-playground/demo-models",
            metavar="DIR",
            group="web",
        ),
    ] = None
    # Events waiting in the queue before new ones are refused, and answers generated at once per view.
    queue_size: Annotated[
        Count, Doc("events waiting before new ones are refused", COUNT, metavar="N", group="web")
    ] = 64
    concurrency: Annotated[
        Count, Doc("answers generated at once per view", COUNT, metavar="N", group="web")
    ] = 16
    # So that one client cannot hold every slot above (`app.views.fairness`).
    answers_per_visitor: Annotated[
        Count,
        Doc(
            "answers one visitor may have running at once (chat, compare, arena and /chat together)",
            COUNT,
            metavar="N",
            group="web",
        ),
    ] = 4
    # A cookie costs a script nothing: one client address's answers are bounded too, below the
    # answers per view, so that the rest are refused at once rather than wait in the queue.
    answers_per_address: Annotated[
        Count,
        Doc(
            "answers one client address may have running at once (behind a proxy, list it in "
            "APP_TRUSTED_PROXIES)",
            COUNT,
            metavar="N",
            group="web",
        ),
    ] = 8
    # Every request that starts work (a POST: a send, an upload, an API call, an open tab's
    # model-state check each second) from one address draws on a bucket of
    # `request_burst_per_address`, refilled at this rate (about 20 open tabs), so that a script
    # cannot keep the server busy refusing it (`app.views.doorway`; an address's places in the
    # queue are bounded there too, by a quarter of the queue).
    requests_per_address_per_minute: Annotated[
        Count,
        Doc(
            "requests (sends, uploads, API calls) one client address may start a minute, past its burst",
            COUNT,
            metavar="N",
            group="web",
        ),
    ] = 1200
    request_burst_per_address: Annotated[
        Count,
        Doc(
            "requests one client address may start at once, before its rate applies",
            COUNT,
            metavar="N",
            group="web",
        ),
    ] = 120
    # Where the queue does not move (every answering slot busy), a rate alone lets a slow script
    # fill it: one address's requests waiting in it are bounded too (`app.views.doorway`).
    waiting_per_address: Annotated[
        Count | None,
        BeforeValidator(_blank_is_none),
        Doc(
            "requests one client address may have waiting in a queue past half full (APP_QUEUE_SIZE or "
            "more: no share)",
            COUNT,
            default="a quarter of APP_QUEUE_SIZE",
            metavar="N",
            group="web",
        ),
    ] = None
    # A closed tab's files are deleted after this; a reload within it finds its conversation.
    reload_grace_s: Annotated[
        Seconds,
        Doc(
            "seconds a closed tab's conversation waits for a reload before it is deleted",
            SECONDS,
            metavar="SECONDS",
            group="web",
        ),
    ] = 300.0
    # A tab unused this long is deleted even if its page never said it closed.
    session_ttl_s: Annotated[
        Seconds,
        Doc(
            "seconds an unused tab's conversation and files are kept", SECONDS, metavar="SECONDS", group="web"
        ),
    ] = 6 * 3600.0
    # --- history (app.storage.history) ---
    data_dir: Annotated[
        OptionalPath,
        Doc(
            "where the history database and the media users sent are kept",
            "a folder",
            default="~/.local/share/vlm-playground (/data in Docker)",
            metavar="DIR",
            group="history",
        ),
    ] = None
    database_url: Annotated[
        OptionalText,
        Doc(
            "the history database (PostgreSQL for several app processes)",
            "a SQLAlchemy URL like postgresql+psycopg://user:password@host/db",
            default="SQLite in the data folder",
            metavar="URL",
            group="history",
        ),
    ] = None
    history: Annotated[
        bool, Doc("store conversations (the sidebar's history)", FLAG, default="on", group="history")
    ] = True
    store_media: Annotated[
        bool,
        Doc("keep the files users send with stored conversations", FLAG, default="on", group="history"),
    ] = True
    media_retention_days: Annotated[
        float,
        Field(gt=0, allow_inf_nan=False),
        Doc(
            "days a sent file is kept (its thumbnail stays with the conversation)",
            "days, a number above 0",
            metavar="DAYS",
            group="history",
        ),
    ] = 30.0
    # --- the arena (app.domain.arena) ---
    arena: Annotated[
        bool,
        Doc(
            "the arena: blind battles between two models, votes and a leaderboard",
            FLAG,
            default="on",
            group="arena",
        ),
    ] = True
    arena_models: Annotated[
        tuple[str, ...],
        NoDecode,
        BeforeValidator(_keys),
        Doc(
            "card keys the arena draws its two models from, separated by commas",
            "card keys separated by commas",
            default="every model served here but those with random weights",
            metavar="KEYS",
            group="arena",
        ),
    ] = ()
    arena_votes_per_hour: Annotated[
        Count,
        Doc("votes one browser may cast in an hour", COUNT, metavar="N", group="arena"),
    ] = 30
    # A script can be a new browser at every request: the client's address bounds it too (a
    # household or an office behind one address shares this).
    arena_votes_per_address_per_hour: Annotated[
        Count,
        Doc(
            "votes all browsers at one client address may cast in an hour", COUNT, metavar="N", group="arena"
        ),
    ] = 60
    arena_signed_in_only: Annotated[
        bool,
        Doc(
            "the arena takes votes from signed-in visitors only (see APP_SIGN_IN)",
            FLAG,
            default="off",
            group="arena",
        ),
    ] = False
    # Behind a reverse proxy every request comes from the proxy: its X-Forwarded-For is believed
    # only when the request comes from one of these addresses.
    trusted_proxies: Annotated[
        tuple[str, ...],
        NoDecode,
        BeforeValidator(_networks),
        Doc(
            "addresses or ranges of reverse proxies whose X-Forwarded-For header names the client, "
            "separated by commas",
            "IP addresses or ranges (10.0.0.0/8) separated by commas",
            default="none: the address a request comes from is the client's (on a Space, the private ranges)",
            metavar="ADDRESSES",
            group="web",
        ),
    ] = ()
    # An operator's view of the box; off by default, as a public page has no business showing
    # who uses which model.
    metrics: Annotated[
        bool,
        Doc(
            "Prometheus metrics at /metrics: engine states, builds, sleeps, waits, speed, memory, "
            "visitors, and vLLM's own",
            FLAG,
            default="off",
            group="web",
        ),
    ] = False
    # Identity is an anonymous cookie by default (`app.views.identity`); a team or a Space can
    # have visitors sign in, so that their history and votes follow the account.
    sign_in: Annotated[
        Literal["off", "huggingface", "proxy", "password"],
        Doc(
            'how visitors sign in: off (anonymous), huggingface (a Space\'s "Sign in with Hugging Face"), '
            "proxy (a header a trusted reverse proxy sets) or password (accounts in APP_USERS_FILE)",
            "off, huggingface, proxy or password",
            metavar="MODE",
            group="web",
        ),
    ] = "off"
    sign_in_header: Annotated[
        str,
        AfterValidator(_header_name),
        Doc(
            "with APP_SIGN_IN=proxy: the header the proxy names the signed-in user in",
            "a header name like X-Forwarded-User",
            metavar="HEADER",
            group="web",
        ),
    ] = "X-Forwarded-User"
    users_file: Annotated[
        OptionalPath,
        Doc(
            "with APP_SIGN_IN=password: the accounts, one `name:hash` line each "
            "(python -m app add-user NAME writes one)",
            "a file's path",
            default="none",
            metavar="FILE",
            group="web",
        ),
    ] = None
    max_upload_bytes: Annotated[
        Bytes,
        Doc(
            "largest upload",
            "bytes like 200MB",
            default="200MB",
            env="APP_MAX_UPLOAD",
            flag="--max-upload",
            metavar="BYTES",
            group="web",
        ),
    ] = 200 * 10**6

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # `Settings(...)` is what the code passes, nothing else; the environment is read only by
        # `from_env` (so a variable exported in a shell cannot change what a test constructs).
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        return cls.from_sources(os.environ if env is None else env)

    @classmethod
    def from_sources(cls, env: Mapping[str, str], flags: Mapping[str, Any] | None = None) -> Settings:
        """The variables in `env`, with the flags given (field name: value as typed) on top,
        validated once; a refused value names the variable or flag it came from."""
        flags = {k: v for k, v in (flags or {}).items() if v is not None}
        values = {**_Environment(cls, env)(), **flags}
        if "gpu_count" not in values:
            values["gpu_count"] = detect_gpu_count(env)
        try:
            return cls(**values)
        except ValidationError as error:
            raise settings_error(error, values, flags) from None

    def with_overrides(self, **values: Any) -> Settings:
        """These settings with the given fields replaced; `None` values (flags not given) are
        skipped. The result is validated like any settings."""
        unknown = set(values) - set(type(self).model_fields)
        if unknown:
            raise SettingsError(f"unknown settings: {sorted(unknown)}")
        current = {name: getattr(self, name) for name in type(self).model_fields}
        given = {k: v for k, v in values.items() if v is not None}
        try:
            return type(self)(**(current | given))
        except ValidationError as error:
            raise settings_error(error, given, given) from None

    @model_validator(mode="after")
    def _sign_in_has_what_it_needs(self) -> Settings:
        """Each way of signing in with what it cannot work without, said at start."""
        if self.sign_in == "proxy" and not self.trusted_proxies:
            # Without it, any visitor could name themselves in the header.
            raise ValueError(
                "APP_SIGN_IN=proxy needs APP_TRUSTED_PROXIES: the proxies whose "
                f"{self.sign_in_header} header is believed"
            )
        if self.sign_in == "password" and self.users_file is None:
            raise ValueError(
                "APP_SIGN_IN=password needs APP_USERS_FILE (python -m app add-user NAME writes it)"
            )
        if self.arena_signed_in_only and self.sign_in == "off":
            raise ValueError("APP_ARENA_SIGNED_IN_ONLY needs a way to sign in: set APP_SIGN_IN")
        return self

    def history_folder(self) -> Path:
        """The data folder: the setting, else the XDG data home's `vlm-playground`."""
        if self.data_dir is not None:
            return self.data_dir.expanduser()
        home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(home) / "vlm-playground"

    def history_url(self) -> str:
        return self.database_url or f"sqlite:///{self.history_folder() / 'playground.db'}"

    def check_keys(self, catalog: Iterable[str]) -> None:
        """Refuses settings that name models the catalog does not have (a typo would otherwise
        silently leave a model on the wrong engine)."""
        known = set(catalog)
        named = {
            "APP_DEFAULT_MODEL": {self.default_model} - {None},
            "APP_MODEL_FOLDERS": set(self.model_folders),
            "APP_REMOTE_ENGINES": set(self.remote_engines),
            "APP_MODELS": set(self.models),
            "APP_ARENA_MODELS": set(self.arena_models),
        }
        for variable, keys in named.items():
            if unknown := sorted(keys - known):
                raise SettingsError(f"{variable} names {unknown}, not in the catalog")

    @property
    def eager(self) -> bool:
        return self.gpu_count == 0 if self.enforce_eager is None else self.enforce_eager


def settings_error(
    error: ValidationError, values: Mapping[str, Any], flags: Mapping[str, Any]
) -> SettingsError:
    """The first refused value as one line: its variable or flag, what was written, what to write."""
    first = error.errors()[0]
    if not first["loc"] and first["type"] == "value_error":  # settings that do not go together
        return SettingsError(str(first["ctx"]["error"]))
    name = next((str(part) for part in first["loc"] if str(part) in Settings.model_fields), None)
    if name is None:  # an unknown field: a programming error, said plainly
        return SettingsError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}")
    source = flag_name(name) if name in flags else env_name(name)
    written = values.get(name, first.get("input"))
    if isinstance(written, bool):
        written = "on" if written else "off"
    elif not isinstance(written, str):
        written = ",".join(map(str, written)) if isinstance(written, tuple | list) else str(written)
    return SettingsError(f"{source}={written!r}: write {doc(name).write}")


# --- the command line: one flag per field ---


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, in groups, each with its variable and its default in the help."""
    groups = {
        "web": parser.add_argument_group("web app (each flag overrides its APP_* variable)"),
        "history": parser.add_argument_group("history (each flag overrides its APP_* variable)"),
        "arena": parser.add_argument_group("arena (each flag overrides its APP_* variable)"),
        "engines": parser.add_argument_group("engines (each flag overrides its APP_* variable)"),
    }
    for name, field in Settings.model_fields.items():
        about = doc(name)
        default = about.default if about.default is not None else _shown(field.default)
        text = f"{about.help} ({env_name(name)}; default: {default})".replace("%", "%%")
        options: dict[str, Any] = {"dest": name, "help": text, "default": None}
        if field.annotation in (bool, bool | None):
            options["action"] = argparse.BooleanOptionalAction
        else:
            options.update(action="append" if about.repeat else "store", metavar=about.metavar)
        groups[about.group].add_argument(flag_name(name), **options)


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def from_command_line(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """The environment's settings with the flags given on top (`add_flags`), validated once."""
    flags: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = getattr(args, name, None)
        if isinstance(value, list):  # a repeated KEY=VALUE flag
            value = ",".join(value)
        flags[name] = value
    return Settings.from_sources(os.environ if env is None else env, flags)
