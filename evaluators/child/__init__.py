"""The process boundary: everything an evaluation child imports, and nothing else.

This folder alone is bound (read-only) into the fork server and the children it forks, which
import its modules by their bare names (``import judge``): ``zygote.py`` the fork server,
``runner.py`` a child's main loop (role judge or worker), ``protocol.py`` every message across the
boundary, ``reference.py`` and ``judge.py`` the trusted side of a job (the task, its calls and the
clock), ``worker.py`` the untrusted side (the model under test), ``exchange.py`` the memory they
share, ``guards.py`` the worker's run-time rules, ``compare.py`` the output comparison,
``precision.py`` the precision contract (the judge's). They import torch and Triton, never
``kernel_env``. The host side (the harness, ``forkserver.py``,
``children.py``) imports the same modules as ``kernel_env.evaluators.child.*`` where it shares
their code (the protocol, the comparison, the screen).
"""
