"""Workloads: the long runs built on the environments and the episode runtime.

- ``agent_eval.py``: KernelAgent-v0 episodes driven by a tool-calling model (``kernel-env eval``).
- ``generate.py``: the seed orchestrator, refine episodes in a FIFO queue (``kernel-env generate``).
- ``llm.py``: an OpenAI-compatible model server: checking it, choosing its model, its errors.
- ``journal.py``: the JSONL journal every resumable run appends to (durable; a torn last line cut).
- ``metrics.py``: the paper's metrics over episode records (pure); ``report.py`` renders them.
- ``doctor.py``: what this machine can run, as typed findings (``kernel-env doctor``).
- ``synth/``: the task synthesis pipeline (``kernel-env synth``).

Nothing below this folder imports it.
"""
