"""The demo models, so the app runs on a machine with no GPU and no weights: two tiny models
trained here on drawings of shapes (`app.demo.seeing_model`, a Qwen3-VL, and
`app.demo.seeing_llava`, a LLaVA-1.5, smaller), whose weights are in the repository and whose
answers mean something, and random-weight twins of two catalog cards (`app.demo.twins`). Each
twin is the real card (prompt format, media limits, engine arguments) served from its twin's
folder with vLLM's random weights: the answers are nonsense, everything around them is the real
model's path.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from app.catalog.cards import ModelCard, servable_cards
from app.config import Settings
from app.demo.seeing_llava import SECOND_KEY, SECOND_KINDS
from app.demo.seeing_model import SEEING_KEY
from app.demo.shapes import KINDS

# Demo card key -> the catalog card it is a twin of.
DEMO_TWINS = {"demo_qwen2_vl": "qwen2_vl", "demo_llava": "llava"}
# The seeing demo model (`app.demo.seeing_model`), trained by `scripts/train_seeing_model.py`; its
# weights are in the repository (a few MB), so the app starts without training it.
SEEING_FOLDER = Path(__file__).resolve().parents[2] / "static" / "seeing-model"
# The second seeing model (`app.demo.seeing_llava`), a tiny LLaVA: compare and the arena pit the two.
SECOND_FOLDER = Path(__file__).resolve().parents[2] / "static" / "seeing-model-llava"
# The two trained demo models, the better first: what compare and the arena offer on a CPU box.
SEEING_MODELS = (SEEING_KEY, SECOND_KEY)
# The kinds of question (`app.demo.shapes.KINDS`) the page offers each seeing model as examples
# (`app.views.widgets`): those it was taught and gets right at least half the time held out
# (docs/BENCHMARKS.md; the tests hold each model to it and ask it every example it is offered),
# boxes aside. The first: every kind (of the tests' 36 held out in run H1, counts of a colour 29,
# the bigger shape 31, descriptions, the colour of a shape named by its kind, the kind of one named
# by its colour and a clip's last colour 32); boxes are offered though about half land within a
# tenth of the picture (18 of 36): they are the only boxes a CPU page draws, each named as asked.
# The second takes no clips and writes no boxes, was not taught a shape named among several, and
# is offered neither the kind of shape (45%), counts of a colour (42%), the bigger of two (35%) nor
# descriptions (13%): asked to describe the page's three shapes, it named two.
EXAMPLE_KINDS = {
    SEEING_KEY: KINDS,
    SECOND_KEY: tuple(
        kind for kind in SECOND_KINDS if kind not in ("shape", "colour count", "bigger", "describe")
    ),
}
# Every demo model, those that answer meaningfully first.
DEMO_MODELS = (*SEEING_MODELS, *DEMO_TWINS)


def default_demo_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "vlm-playground" / "demo-models"


def twin_card(card: ModelCard, folder: Path, key: str | None = None) -> ModelCard:
    """`card` served from its twin in `folder` with random weights, runnable on the CPU and
    labelled so: only the key, the names and where the model comes from change."""
    folder_text = str(folder)
    args = dict(card.reference_engine_args)
    args.update({name: folder_text for name, value in args.items() if value == card.hf_repo})
    fields = card.model_dump()
    fields.update(
        key=key or f"demo_{card.key}",
        display_name=f"{card.display_name}: random-weight twin",
        family="Demo",
        hf_repo=folder_text,
        made_here=f"a random-weight twin of {card.hf_repo}",
        reference=f"twin of {card.key} ({card.hf_repo}) built by app.demo.twins; {card.reference}",
        reference_engine_args={**args, "load_format": "dummy"},
        runs_on_cpu=True,
        hardware="Runs anywhere, CPU included: a twin of a few MB.",
        notes=(
            f"A twin of {card.hf_repo} with random weights: the answers are nonsense. The prompt "
            "format, media handling and engine are the real model's; it exists to try the app "
            "without a GPU."
        ),
    )
    return ModelCard.model_validate(fields)


def demo_cards(cards: dict[str, ModelCard], root: Path) -> dict[str, ModelCard]:
    """The demo models' cards: the two seeing models, and the twins built into `root` once
    (about a second each)."""
    from app.demo.seeing_llava import SECOND_BASE_CARD, second_card
    from app.demo.seeing_model import BASE_CARD, seeing_card
    from app.demo.twins import build_twin  # transformers is imported only here

    twins = {key: twin_card(cards[of], build_twin(cards[of], root), key) for key, of in DEMO_TWINS.items()}
    return {
        SEEING_KEY: seeing_card(cards[BASE_CARD], SEEING_FOLDER),
        SECOND_KEY: second_card(cards[SECOND_BASE_CARD], SECOND_FOLDER),
        **twins,
    }


def use_local_vllm_environment(scratch: Path, environ: MutableMapping[str, str] = os.environ) -> None:
    """What the CPU app, the tests and benchmarks run vLLM under; call before importing it.
    Offline, no usage stats, one engine process per engine instead of two (half the start-up
    time and memory), and vLLM's sockets in `scratch` instead of `/tmp`; its caches there too,
    unless the environment names its own (`VLLM_CACHE_ROOT`, `TORCHINDUCTOR_CACHE_DIR`: what vLLM
    learns about a model class there saves about 8 s of its first build, so a cache one already
    keeps is kept). `VLLM_CPU_KVCACHE_SPACE` is removed because it overrides each engine's own KV
    cache size. oneDNN's cache of compiled kernels is bounded (`ONEDNN_KERNELS_KEPT`), and each
    engine takes half the cores (`engine_threads`).
    """
    environ.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_RPC_BASE_PATH=str(socket_folder(scratch)),
    )
    for name, folder in (("VLLM_CACHE_ROOT", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        if not environ.get(name):  # unset or empty (an empty path is the current folder)
            environ[name] = str(scratch / folder)
    environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    # oneDNN keeps a compiled kernel for every new shape of a matrix product (each new prompt
    # length's prefill), 1,024 of them by default: a CPU engine grew by about 0.9 MiB for each
    # chat of a new length, with no end in a 30-minute run (`bench/bench_engine_memory.py`). A
    # few dozen keep the answers' shapes; an operator's own value is kept.
    environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_KERNELS_KEPT))
    # Each engine's torch would take every core, so two engines answering at once (compare, the
    # arena, two visitors on two models) ran two threads each on two cores, about three times
    # slower than one each (`bench/bench_engine_threads.py`, docs/BENCHMARKS.md). Half the cores
    # each keeps two at once within the machine; an operator's own value is kept.
    environ.setdefault("OMP_NUM_THREADS", str(engine_threads()))


def engine_threads() -> int:
    """OpenMP threads for each CPU engine: half the cores this process may run on (where the
    system says which: Linux; elsewhere all of them), at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


ONEDNN_KERNELS_KEPT = 64

# A Unix socket's path holds at most 107 bytes, and vLLM names its sockets `<folder>/<uuid4>`
# (37 more): in a deeper folder every engine build fails with a ZMQ error about the path.
SOCKET_FOLDER_MAX_BYTES = 107 - 37


def fits_sockets(folder: Path) -> bool:
    return len(os.fsencode(folder.resolve())) <= SOCKET_FOLDER_MAX_BYTES


def socket_folder(scratch: Path) -> Path:
    """`scratch` where vLLM's socket names fit under it, else a private folder of the system's
    temporary folder (a deep home, a long `APP_DEMO_DIR`, a test's own temporary folder), or of
    /tmp where that one is deep too (a cluster job's or a test worker's TMPDIR)."""
    if fits_sockets(scratch):
        # vLLM binds its sockets here without making the folder.
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch
    # mkdtemp's folder is named "vllm-" and 8 random characters, and only its owner may enter it.
    deep = not fits_sockets(Path(tempfile.gettempdir()) / ("x" * 13))
    folder = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp" if deep else None))  # noqa: S108 (private)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the engines are gone by then
    return folder


def with_demo_models(cards: dict[str, ModelCard], settings: Settings) -> dict[str, ModelCard]:
    """The catalog, plus the demo models (the seeing models and the twins) where the settings
    ask for them or where this machine can serve nothing else. Built once into the demo folder."""
    servable = servable_cards(
        offered(cards, settings), settings.gpu_count, settings.allow_remote_code, settings.remote_engines
    )
    wanted = settings.demo_models if settings.demo_models is not None else not servable
    if not wanted:
        return cards
    return demo_cards(cards, settings.demo_dir or default_demo_dir()) | cards


def offered(cards: dict[str, ModelCard], settings: Settings) -> dict[str, ModelCard]:
    """The cards the operator offers (APP_MODELS; all when empty), the demo models included."""
    return {k: c for k, c in cards.items() if not settings.models or k in settings.models or k in DEMO_MODELS}
