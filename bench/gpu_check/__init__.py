"""The GPU check: vLLM's engine lifecycle on real model sizes, on one NVIDIA GPU, with nothing
downloaded. Run it as `python bench/gpu_check` (`--help`, and the docstring of `cli.py`, say
what it measures and how; docs/BENCHMARKS.md has the details).

One module a job, each readable on its own:

- `common`: the engine limits, the two models' sizes, the smoke test's hooks, logging;
- `folders`: the two model folders (config, tokenizer, processor; no weights) and their cards;
- `dry_run`: `--dry-run`, the folders checked with transformers and vLLM's model config;
- `machine`: whether this machine can run the check, what it is, and its GPU memory (NVML);
- `engines`: one vLLM engine built, asked, put to sleep, woken and shut down;
- `phase`: what a phase is given, and how it records its steps and cleans up its engines;
- `lifecycle`, `two_resident`, `swaps` (sleep/wake and build/shutdown) and `manager`: the
  phases, one measurement each;
- `engine_check`: the phases in order, with the GPU memory at the start and the end;
- `readings`: `--readings`, the app's own GPU readings against processes holding known amounts
  (torch's CUDA build and NVML, no vLLM);
- `report`: the summary, markdown on stdout and JSON (or markdown) in `--out`;
- `cli`: the command line; `__main__`: the entry point.
"""
