"""The episode runtime: what sits between a sandboxed workspace and the trusted evaluation.

- ``episode.py``: an ``Episode`` is a workspace, its sandbox, its broker and a pool; it keeps
  every evaluation and runs the final one (clean rebuild, best/final selection). ``run_solution``.
- ``broker.py``: the episode's unix socket; snapshots the workspace and submits it to the pool.
- ``pool.py``: ``GpuPool`` and its two implementations, ``LocalPool`` (several jobs a GPU, each
  timing run alone) and ``RayPool`` (one actor per GPU of a cluster, ``DeviceWorker``, each running a
  ``LocalPool`` of its GPU); one shared pool a kind per process (``shared_pool``).

Above it: the environments (``kernel_env.envs``) and the workloads. Below it: the workspace,
the sandboxes, the tasks and the trusted evaluators (``kernel_env.evaluators``).
"""
