"""A person's interactive shell in a sandbox, on their own terminal (``kernel-env run-task``).

The promise: the shell, and everything started from it, is held as the agent's commands are.
In the local sandbox that is the sandbox's own bubblewrap mounts and namespaces
(``interactive_argv``), its rlimits, and a cgroup of the shell's own where this host allows
one; in the docker sandbox it is ``docker exec`` into the sandbox's container (the
container's limits, a terminal of its own). Because a local shell shares the person's
terminal (job control needs it), a seccomp filter blocks ``ioctl(TIOCSTI)``: nothing run in
there can type commands into the terminal for the host shell to run after it exits. Where no
filter exists for this architecture, ``warn`` is told before the shell starts. Ctrl-C and
Ctrl-\\ reach the shell's foreground job and never the calling process. When the shell
exits, whatever it left in its cgroup is killed.

This module never opens or closes the sandbox: the caller owns it, and its workspace.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from kernel_env.sandbox.base import Sandbox
from kernel_env.sandbox.limits import Cgroup
from kernel_env.sandbox.local import LocalSandbox
from kernel_env.sandbox.seccomp import no_terminal_injection_filter


def run_shell(box: Sandbox, cwd: Path, *, warn: Callable[[str], None]) -> int:
    """Run ``box``'s interactive shell on this process's terminal until it exits; its exit status.

    ``box`` is started; ``cwd`` is the workspace on the host. Raises SandboxError where the
    backend cannot give a shell (docker without its command-line client)."""
    isolated = getattr(box, "isolated", True)
    local = isinstance(box, LocalSandbox)  # a docker shell is `docker exec`: the container has the limits and its own terminal
    argv = box.interactive_argv()
    group = Cgroup.create(box.limits) if local else None

    def in_child() -> None:  # the person's shell: the sandbox's limits, and Ctrl-C for the shell, not for us
        if group is not None:
            group.enter()
        if local:
            box.limits.apply_rlimits()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    seccomp_fd = None
    if isolated and local:
        program = no_terminal_injection_filter()
        if program is None:
            warn("no seccomp filter for this architecture: code run in this shell could type into your terminal "
                 "(TIOCSTI) where the kernel allows it")
        else:
            seccomp_fd, write_end = os.pipe()  # bubblewrap reads the program from this descriptor
            os.write(write_end, program)
            os.close(write_end)
            argv = [argv[0], "--seccomp", str(seccomp_fd), *argv[1:]]

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # Unisolated, the shell is a plain bash on this host: only the prompt says where it is.
        env = None if isolated else {**os.environ, "PS1": r"[kernel-env \W]\$ "}
        return subprocess.run(argv, cwd=cwd, env=env, preexec_fn=in_child,
                              pass_fds=(seccomp_fd,) if seccomp_fd is not None else ()).returncode
    finally:
        signal.signal(signal.SIGINT, previous)
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if group is not None:
            group.destroy()
