"""vLLM's facts about model classes, gathered once for the whole suite.

Before a model's first build vLLM inspects its class (which interfaces it has: images, videos,
multimodal embeddings...) in a fresh Python process, about 8 s each on these machines: a third
of a twin's time in the suite. vLLM keeps what it finds under `VLLM_CACHE_ROOT/modelinfos`,
keyed by a hash of the model's source file, and reads it back instead of inspecting again. Here
one process inspects every architecture the tests build, into one cache folder that both test
workers share: about 10 s for all of them, where each worker paid 8 s per architecture.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import warnings
from pathlib import Path

# Run in a child process, so that the tests' own process never imports every model's code. It
# calls vLLM's own inspection, which computes the hash and writes the cache entry; only where it
# would start one more process per class, it runs the inspection in this one instead.
INSPECT = """
import sys
from vllm.model_executor.models import registry
registry._run_in_subprocess = lambda inspect: inspect()
for architecture in sys.argv[1:]:
    model = registry.ModelRegistry.models.get(architecture)
    try:
        model.inspect_model_cls()
    except Exception as error:  # that model's build inspects it again; the others are kept
        print(f"could not inspect {architecture}: {error!r}", file=sys.stderr)
"""
DONE = "inspected"


def inspect_once(architectures: set[str], cache_root: Path) -> None:
    """Fills `cache_root` with vLLM's model infos of `architectures`, once across processes: the
    first worker to ask inspects, the other waits on the lock and finds them there."""
    cache_root.mkdir(parents=True, exist_ok=True)
    with (cache_root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (cache_root / DONE).exists():
            return
        # The environment is the tests' (offline, VLLM_CACHE_ROOT pointing at cache_root). A
        # failure here only makes the suite slower: each build inspects its model as usual.
        try:
            subprocess.run([sys.executable, "-c", INSPECT, *sorted(architectures)], check=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
            warnings.warn(f"vLLM's model infos were not gathered at once: {error}", stacklevel=2)
        (cache_root / DONE).touch()
