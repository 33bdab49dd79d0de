"""Synthesis of training tasks, after the CUDA-Agent-Ops-6K pipeline (one module per stage).

    crawl.py      seed operators: torch.nn classes with shape recipes (and transformers' where installed)
    compose.py    1–5 seeds stacked into one KernelBench-format Model: deterministic (shape-checked
                  chaining, no model needed) or by an LLM behind an OpenAI-compatible endpoint
    decontam.py   AST structural similarity of Model against an evaluation set; drop above 0.9
    filter.py     run each candidate in the evaluation's isolated processes: eager and compile,
                  deterministic, input-dependent, not constant, eager time within bounds
    stats.py      Table 3 of the paper: the share of 1- … 5-operator compositions
    pipeline.py   the resumable run that ties the stages together (`kernel-env synth`)

Generated code is never executed in the calling process: only parsed here, and run by the
filter in isolated child processes.
"""

from __future__ import annotations
