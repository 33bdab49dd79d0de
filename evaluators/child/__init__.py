"""The process boundary: everything an evaluation child imports, and nothing else.

This folder alone is bound (read-only) into the fork server and the children it forks, which
import its modules by their bare names (``import timing``): ``zygote.py`` the fork server,
``runner.py`` a child's role (reference or candidate), ``timing.py`` the one timing function and
its bench, ``guards.py`` the run-time rules and the device record, ``compare.py`` the output
comparison. They import torch and Triton, never ``kernel_env``. The host side (the harness,
``forkserver.py``, ``children.py``) imports the same modules as ``kernel_env.evaluators.child.*``
where it shares their code (timing baselines, the rules' names).
"""
