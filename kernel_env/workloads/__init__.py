"""Workloads: what is built on the environments and the episode runtime, in three folders.

- ``runs/``: the long runs, each resumable from its journal: ``agent_eval.py`` (``kernel-env
  eval``), ``generate.py`` (``kernel-env generate``), ``synth/`` (``kernel-env synth``), the
  journal they share (``journal.py``) and the model server they drive (``llm.py``).
- ``analysis/``: what a run's records say: ``metrics.py`` (the paper's metrics, pure),
  ``report.py`` (their tables and plot), ``trajectories.py`` (``kernel-env export``).
- ``ops/``: the operator's tools: ``doctor.py`` (``kernel-env doctor``).

Nothing below this folder imports it.
"""
