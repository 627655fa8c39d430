"""Entry point of the GPU check: `python bench/gpu_check` (the command the docs and the Docker
image give), or `python -m bench.gpu_check` from the repository root."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    if __package__:
        from .cli import main
    else:
        # Run as a folder, Python knows no package and puts the folder itself first on sys.path,
        # where its modules (`common`, `machine`...) would shadow top-level ones. In its place:
        # bench/, so that the package imports as `gpu_check` (as pytest's pythonpath has it), and
        # the repository root, for `app`.
        bench = Path(__file__).resolve().parent.parent
        sys.path[0:1] = [str(bench), str(bench.parent)]
        from gpu_check.cli import main

    main()
