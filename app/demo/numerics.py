"""The seeing models' training arithmetic, pinned so that one seed should make the same weights on
any x86-64 machine with AVX2, Intel's or AMD's (issue 29: "reproducible").

Left to themselves, torch's own kernels (softmax, norms, attention, sums), MKL's matrix products
and oneDNN's convolutions each take the widest instructions the CPU has, and a sum taken in
another order rounds otherwise; training carries the difference on. Run H1's recipe, run again on
an AMD EPYC, gave other weights (docs/SEEING_MODEL_RUNS.md, run H1E). On that machine, 30 steps of
the recipe gave other bytes with torch's kernels held to AVX2, with oneDNN's held to AVX2, with
MKL's reproducible mode and on two threads instead of one; with the pins below, holding oneDNN's,
MKL's or numpy's instructions to AVX2 on top changed nothing. A second CPU, an AMD EPYC without
AVX-512, made the same bytes as that machine from the seed, the whole vision lesson pinned; and
`make test` trains a few steps pinned on x86-64 machines with AVX2 and compares them with bytes
recorded on that second CPU (`tests/test_training_script.py`). No Intel CPU has been seen yet; an
ARM machine computes otherwise whatever is pinned.

torch reads `ATEN_CPU_CAPABILITY` once, as it loads, so a process that has loaded torch cannot be
pinned after: `scripts/train_seeing_model.py` starts itself again with `pinned_environ`, calls
`pin_torch` before it trains, and evaluates in a process started again as it was first (`unpin`),
as the app serves. A test that trains again in its own process, where the committed weights' stamp
no longer matches the code, trains unpinned.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

PINNED = {
    # torch's own kernels as compiled for AVX2, which x86-64 machines of the last decade have (the
    # AVX-512 ones add in another order).
    "ATEN_CPU_CAPABILITY": "avx2",
    # MKL's conditional numerical reproducibility: the one mode MKL documents as the same on Intel
    # and other vendors' CPUs (its AVX2 mode is documented for Intel's alone, and on others falls
    # back to the CPU's own path). It is most of what the pins cost: a few steps of each lesson on
    # two threads took 67 s pinned, 46 s with MKL's AVX2 mode instead, 41 s unpinned (measured while
    # the patches were still convolved).
    "MKL_CBWR": "COMPATIBLE",
    # A sum split among threads is added in another order: two, the project's machines' cores,
    # and never fewer when the machine is busy (MKL and OpenMP would otherwise choose).
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
}
# Where `pinned_environ` keeps what the pins replaced, for `unpin`.
REPLACED = "SEEING_UNPINNED"


def pinned(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a process with `environ` trains with the pins."""
    return all(environ.get(name) == value for name, value in PINNED.items())


def pinned_environ(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`environ` with the pins, and a note of what they replaced."""
    if pinned(environ) and environ.get(REPLACED):
        return dict(environ)
    replaced = {name: environ.get(name) for name in PINNED}
    return {**environ, **PINNED, REPLACED: json.dumps(replaced)}


def unpin(environ: MutableMapping[str, str] = os.environ) -> None:
    """`environ` back as it was before `pinned_environ`: what the script's evaluation, started
    again, runs under, as the app serves."""
    replaced = environ.pop(REPLACED, None)
    for name, value in json.loads(replaced).items() if replaced else ():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def pin_torch(report: Callable[[str], None]) -> None:
    """What is pinned in a pinned process itself, before it trains: oneDNN left out (its
    convolution kernels are generated for the CPU at hand; without it torch convolves with MKL's
    matrix products), the first model's patches embedded in one product (`patches_as_one_product`),
    the threads checked, and a line where the CPU cannot do as pinned."""
    import torch

    if not pinned():
        raise RuntimeError("training's arithmetic is pinned only in a process started with pinned_environ")
    torch.backends.mkldnn.enabled = False
    patches_as_one_product()
    if torch.get_num_threads() != int(PINNED["OMP_NUM_THREADS"]):
        raise RuntimeError(f"training's arithmetic is pinned to {PINNED['OMP_NUM_THREADS']} threads")
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX2":
        report(
            f"this CPU computes with {capability}, not AVX2: the weights will differ from those "
            "another machine makes from the same seed"
        )


def patches_as_one_product() -> None:
    """Qwen3-VL's patch embedding (the first seeing model's) computed as the one matrix product it
    is: a convolution whose kernel is the patch, over an input of one patch, is a linear map of the
    patch's pixels. Without oneDNN, torch convolves one patch at a time, a small product for each of
    a batch's 1,000 to 3,000 patches: under the profiler, 145 ms of a 490 ms vision step. 300 steps
    of the vision lesson pinned on two cores took 120 and 119 s convolving, 89 and 83 s with one
    product (docs/SEEING_MODEL_RUNS.md, run PW). The weights keep the convolution's shape, as
    served. The LLaVA's tower convolves whole pictures, a product per picture, and is left as it is."""
    import torch
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    def embedded(self: Any, pixels: Any) -> Any:
        weight = self.proj.weight
        flat = pixels.to(weight.dtype).reshape(-1, weight[0].numel())
        return torch.nn.functional.linear(flat, weight.flatten(1), self.proj.bias)

    modeling_qwen3_vl.Qwen3VLVisionPatchEmbed.forward = embedded
