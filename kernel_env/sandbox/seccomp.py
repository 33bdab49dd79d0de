"""A seccomp filter that stops code in a sandbox from typing into the terminal it shares.

The agent's sandbox starts with ``bwrap --new-session``: no controlling terminal, so the
TIOCSTI ioctl (push characters into the terminal's input, which the host shell then reads
and runs once the sandbox exits: CVE-2017-5226) cannot reach anything. A person's interactive
shell (``kernel-env run-task``) needs the terminal for job control, so there the same
protection comes from this filter instead: ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)`` fail
with EPERM, everything else is allowed. bubblewrap loads it with ``--seccomp FD``.

The program is classic BPF written out by hand (no libseccomp): a handful of instructions.
"""

from __future__ import annotations

import platform
import struct
import termios

_TIOCLINUX = 0x541C
# Per machine: every syscall ABI a process there can use, as (AUDIT_ARCH_*, its ioctl numbers).
# On x86_64 that includes i386 (int 0x80 works from 64-bit code) and x32 (nr | 0x40000000).
_ABIS = {
    "x86_64": [(0xC000003E, [16, 0x40000000 | 514]), (0x40000003, [54])],
    "aarch64": [(0xC00000B7, [29]), (0x40000028, [54])],
}

_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
_ALLOW, _ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1
_NR, _ARCH, _ARG1_LOW = 0, 4, 24  # offsets in struct seccomp_data (little-endian)


def no_terminal_injection_filter() -> bytes | None:
    """The compiled filter for this machine, or None where its architecture is not known here.

    ioctl(TIOCSTI) and ioctl(TIOCLINUX) fail with EPERM; a syscall through an ABI not listed
    fails with EPERM too (so no other ABI can go around the check); everything else is allowed.
    """
    abis = _ABIS.get(platform.machine())
    if abis is None:
        return None
    # (op, jump-if-true label, jump-if-false label, k); labels are resolved below.
    program: list[tuple] = [("label", "start"), (_LD_W_ABS, None, None, _ARCH)]
    for i, (audit_arch, _) in enumerate(abis):
        program.append((_JEQ_K, f"abi{i}", None, audit_arch))
    program.append((_RET_K, None, None, _ERRNO_EPERM))  # an ABI we do not check
    for i, (_, ioctl_numbers) in enumerate(abis):
        program += [("label", f"abi{i}"), (_LD_W_ABS, None, None, _NR)]
        program += [(_JEQ_K, "request", None, nr) for nr in ioctl_numbers]
        program.append((_RET_K, None, None, _ALLOW))
    program += [
        ("label", "request"), (_LD_W_ABS, None, None, _ARG1_LOW),  # the ioctl request, an unsigned int
        (_JEQ_K, "deny", None, termios.TIOCSTI), (_JEQ_K, "deny", None, _TIOCLINUX),
        (_RET_K, None, None, _ALLOW),
        ("label", "deny"), (_RET_K, None, None, _ERRNO_EPERM),
    ]
    return _assemble(program)


def _assemble(program: list[tuple]) -> bytes:
    labels, index = {}, 0
    for item in program:
        if item[0] == "label":
            labels[item[1]] = index
        else:
            index += 1
    out, index = [], 0
    for item in program:
        if item[0] == "label":
            continue
        op, true_label, false_label, k = item
        jt = labels[true_label] - index - 1 if true_label else 0
        jf = labels[false_label] - index - 1 if false_label else 0
        out.append(struct.pack("<HBBI", op, jt, jf, k))
        index += 1
    return b"".join(out)
