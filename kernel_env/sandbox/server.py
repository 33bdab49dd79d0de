"""The server that runs *inside* every sandbox and does the agent's work there.

It speaks JSON lines on stdin/stdout: one request ``{"id", "op", ...}`` in, one response
``{"id", "ok", ...}`` out. Commands and file operations both run here, with the sandbox's
uid and view of the file system, so nothing the agent plants (a symlink, a fifo, a huge
file) can make the host touch anything outside the workspace.

Rules for this file: standard library only (it starts before anything else and must start
fast); never trust the workspace; never block on a command's pipe after the command ended
(a background grandchild may hold it open forever); never buffer unbounded output.

Shell persistence: each command runs in a fresh ``bash`` in its own process group, which
first restores the state saved by the previous command (cwd, variables, functions,
aliases) and saves its own on exit. A timed-out command is killed with its whole group and
the state stays as it was; the session survives anything a command does.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time

WORKDIR = os.environ.get("KE_WORKDIR", "/workspace")
STATE = os.environ.get("KE_STATE", "/run/kernel_env/state")
PROTECTED = tuple(filter(None, os.environ.get("KE_PROTECTED", "").split(":")))
SHELL_STATE = os.path.join(STATE, "shell.sh")
JOBS_DIR = os.path.join(STATE, "jobs")

# Variables bash manages itself (or that would confuse a restored shell): never saved.
_SKIP_VARS = (
    "BASH[A-Z_]*|PWD|OLDPWD|SHLVL|PPID|UID|EUID|RANDOM|SRANDOM|SECONDS|LINENO|HISTCMD|FUNCNAME|GROUPS|"
    "PIPESTATUS|_|EPOCHREALTIME|EPOCHSECONDS|SHELLOPTS|BASHOPTS|DIRSTACK|COMP_WORDBREAKS|OPTIND|OPTERR|"
    "__ke_[a-z_]*"
)
# Absolute paths, resolved once: the agent may set a PATH without them.
_GREP = shutil.which("grep") or "/bin/grep"
_MV = shutil.which("mv") or "/bin/mv"
_PRELUDE = f"""
__ke_save() {{
  __ke_rc=$?
  {{
    builtin declare -p 2>/dev/null | {_GREP} -Ev '^declare -[-a-zA-Z]* ({_SKIP_VARS})(=|$)'
    builtin declare -f
    builtin alias -p
    builtin printf 'builtin cd -- %q 2>/dev/null\\n' "$PWD"
  }} > {shlex.quote(SHELL_STATE)}.tmp 2>/dev/null && {_MV} -f {shlex.quote(SHELL_STATE)}.tmp {shlex.quote(SHELL_STATE)}
  return $__ke_rc
}}
builtin cd {shlex.quote(WORKDIR)} 2>/dev/null
[ -f {shlex.quote(SHELL_STATE)} ] && builtin source {shlex.quote(SHELL_STATE)} >/dev/null 2>&1
builtin shopt -s expand_aliases
"""


class RequestError(Exception):
    """A bad request from the host or a refused operation; the message is for the agent."""


# ----------------------------------------------------------------------------- paths


def resolve(path: str, *, must_exist: bool = False) -> str:
    if not isinstance(path, str) or not path or "\x00" in path:
        raise RequestError("the path must be a non-empty string")
    full = path if os.path.isabs(path) else os.path.join(WORKDIR, path)
    real = os.path.realpath(full)
    if real != WORKDIR and not real.startswith(WORKDIR + os.sep):
        shown = path if os.path.normpath(full) == real else f"{path} (which resolves to {real})"
        raise RequestError(f"{shown} is outside the workspace {WORKDIR}; only files under it can be used")
    if must_exist and not os.path.exists(real):
        raise RequestError(f"{relative(real)} does not exist")
    return real


def relative(real: str) -> str:
    return os.path.relpath(real, WORKDIR) if real != WORKDIR else "."


def protected_name(real: str) -> str | None:
    rel = relative(real)
    for name in PROTECTED:
        if rel == name or rel.startswith(name + "/"):
            return name
    return None


# ----------------------------------------------------------------------------- processes


def _limit_output(chunks_head: bytearray, tail: bytearray, data: bytes, cap: int) -> None:
    half = cap // 2
    room = half - len(chunks_head)
    if room > 0:
        chunks_head += data[:room]
        data = data[room:]
    if data:
        tail += data
        if len(tail) > half:
            del tail[: len(tail) - half]


def _render(head: bytearray, tail: bytearray, total: int) -> tuple[str, bool]:
    if total <= len(head) + len(tail):
        return (bytes(head) + bytes(tail)).decode("utf-8", "replace"), False
    dropped = total - len(head) - len(tail)
    marker = f"\n[... {dropped} bytes of output truncated ...]\n"
    return bytes(head).decode("utf-8", "replace") + marker + bytes(tail).decode("utf-8", "replace"), True


def _spawn(script: str, stdout) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "--noprofile", "--norc", "-c", script],
        stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
        cwd=WORKDIR, start_new_session=True, close_fds=True,
    )


def _session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (this sandbox's /proc shows only its own)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 3 and int(fields[3]) == sid:  # state, ppid, pgrp, session
                members.append(int(name))
    return members


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a command and everything it started. Its session, not only its process group: ninja
    puts each compiler it runs in a process group of its own (a timed-out build left its cc1plus
    processes running). Until none is left, as a dying process's children may still fork."""
    for _ in range(20):
        members = _session_members(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
        if not members:
            break
        time.sleep(0.01)
    proc.wait()


def _command_script(command: str) -> str:
    return _PRELUDE + "trap __ke_save EXIT\n" + command + "\n"


def op_exec(req: dict) -> dict:
    command = req["command"]
    timeout = float(req.get("timeout", 180))
    cap = int(req.get("max_output", 30_000))
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    proc = _spawn(_command_script(command), write_fd)
    os.close(write_fd)
    head, tail, total = bytearray(), bytearray(), 0
    timed_out = False
    deadline = start + timeout
    exited_at = None
    try:
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # After the command exits, drain what is already buffered, then stop: a background
            # grandchild may keep the pipe open for ever.
            if exited_at is not None and now - exited_at > 0.05:
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                _kill_group(proc)
                break
            ready, _, _ = select.select([read_fd], [], [], 0.02 if exited_at else min(0.5, max(0.0, deadline - now)))
            if ready:
                data = os.read(read_fd, 1 << 16)
                if not data:
                    if exited_at is None:
                        proc.wait()
                        exited_at = time.monotonic()
                    break
                total += len(data)
                _limit_output(head, tail, data, cap)
    finally:
        os.close(read_fd)
    output, truncated = _render(head, tail, total)
    return {
        "output": output, "exit_code": None if timed_out else proc.returncode, "timed_out": timed_out,
        "truncated": truncated, "output_bytes": total, "duration_s": round(time.monotonic() - start, 4),
    }


_jobs: dict[str, dict] = {}


def op_bg_start(req: dict) -> dict:
    os.makedirs(JOBS_DIR, exist_ok=True)
    job_id = f"bash_{len(_jobs) + 1}"
    log_path = os.path.join(JOBS_DIR, job_id + ".log")
    with open(log_path, "wb") as log:
        proc = _spawn(_PRELUDE + req["command"] + "\n", log)
    _jobs[job_id] = {"proc": proc, "log": log_path, "offset": 0, "command": req["command"]}
    return {"job_id": job_id}


def _job(job_id: str) -> dict:
    if job_id not in _jobs:
        known = ", ".join(_jobs) or "none"
        raise RequestError(f"no background job {job_id!r} (known: {known})")
    return _jobs[job_id]


def op_bg_output(req: dict) -> dict:
    job = _job(req["job_id"])
    cap = int(req.get("max_output", 30_000))
    proc = job["proc"]
    running = proc.poll() is None
    with open(job["log"], "rb") as log:
        # The size first, then exactly the bytes up to it: what the job writes meanwhile is
        # left for the next look (reading first and taking the size after lost it).
        size = os.fstat(log.fileno()).st_size
        new_bytes = size - job["offset"]
        # Keep the newest output when a job wrote more than the cap since the last look.
        truncated = new_bytes > cap
        log.seek(size - cap if truncated else job["offset"])
        data = log.read(min(new_bytes, cap))
    job["offset"] = size
    text = data.decode("utf-8", "replace")
    if truncated:
        text = f"[... {new_bytes - cap} earlier bytes of output truncated ...]\n" + text
    return {"job_id": req["job_id"], "command": job["command"], "running": running,
            "exit_code": None if running else proc.returncode, "new_output": text, "truncated": truncated}


def op_bg_kill(req: dict) -> dict:
    job = _job(req["job_id"])
    if job["proc"].poll() is None:
        _kill_group(job["proc"])
    return op_bg_output(req)


# ----------------------------------------------------------------------------- files


def op_read(req: dict) -> dict:
    real = resolve(req["path"], must_exist=True)
    if os.path.isdir(real):
        raise RequestError(f"{relative(real)} is a directory, not a file")
    limit = int(req.get("limit", 10_000_000))
    if not os.path.isfile(real):
        raise RequestError(f"{relative(real)} is not a regular file")
    size = os.path.getsize(real)
    if size > limit:
        raise RequestError(f"{relative(real)} is {size} bytes, more than the {limit}-byte limit for reading")
    with open(real, "rb") as handle:
        data = handle.read(limit + 1)
    return {"data": base64.b64encode(data).decode(), "mtime": os.path.getmtime(real)}


def op_write(req: dict) -> dict:
    real = resolve(req["path"])
    name = protected_name(real)
    if name:
        raise RequestError(f"{relative(real)} is protected ({name} is read-only); write your code in kernels/ and model_new.py")
    if os.path.isdir(real):
        raise RequestError(f"{relative(real)} is a directory")
    os.makedirs(os.path.dirname(real), exist_ok=True)
    tmp = f"{real}.ke-tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as handle:
            handle.write(base64.b64decode(req["data"]))
        os.replace(tmp, real)
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise RequestError(f"cannot write {relative(real)}: {exc.strerror}") from None
    return {"mtime": os.path.getmtime(real)}


def _info(real: str) -> dict:
    st = os.stat(real)
    return {"path": real, "is_dir": os.path.isdir(real), "size": st.st_size, "mtime": st.st_mtime}


def op_stat(req: dict) -> dict:
    real = resolve(req["path"])
    return {"info": _info(real) if os.path.exists(real) else None}


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob as a regex over '/'-separated relative paths: ** spans directories, * and ? do not."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1:]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1:end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def op_glob(req: dict) -> dict:
    """Files under the base matching the pattern; symlinked directories are not descended into."""
    base = resolve(req.get("base") or ".", must_exist=True)
    pattern = req["pattern"]
    if os.path.isabs(pattern) or ".." in pattern.split("/"):
        raise RequestError("the glob pattern must be relative to the search path and must not contain '..'")
    regex = _glob_regex(pattern)
    limit = int(req.get("limit", 10_000))
    found = []
    for directory, dirs, files in os.walk(base, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in [*dirs, *files]:
            full = os.path.join(directory, name)
            if regex.match(os.path.relpath(full, base)):
                real = os.path.realpath(full)
                if (real == WORKDIR or real.startswith(WORKDIR + os.sep)) and os.path.exists(real):
                    found.append(_info(full))
        if len(found) >= limit:
            break
    found.sort(key=lambda item: item["mtime"], reverse=True)
    return {"files": found[:limit]}


OPS = {
    "exec": op_exec, "bg_start": op_bg_start, "bg_output": op_bg_output, "bg_kill": op_bg_kill,
    "read": op_read, "write": op_write, "stat": op_stat, "glob": op_glob,
    "ping": lambda req: {"pid": os.getpid()},
}


def _run_as_init() -> None:
    """Be the pid namespace's init (pid 1 of a container): the server goes on in a child, and this
    process reaps every orphan and exits when the server does (its exit ends the namespace).

    Without this the server itself would be pid 1: the kernel ignores signals an agent sends to
    pid 1, so a killed server could not be restarted like anywhere else, and nobody would reap
    double-forked processes, whose zombies would fill the sandbox's process limit.
    """
    server = os.fork()
    if server == 0:
        return
    os.close(0)  # the server's channel is the server's alone
    os.close(1)
    while True:
        pid, status = os.wait()
        if pid == server:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def main() -> None:
    if os.getpid() == 1:
        _run_as_init()
    os.makedirs(STATE, exist_ok=True)
    try:  # a sandbox whose /tmp is a fresh tmpfs has no home yet
        os.makedirs(os.environ.get("HOME") or "/tmp/home", exist_ok=True)
    except OSError:
        pass
    out = sys.stdout
    for line in sys.stdin:
        req: dict = {}
        try:
            req = json.loads(line)
            handler = OPS[req["op"]]
            response = {"id": req.get("id"), "ok": True, **handler(req)}
        except RequestError as exc:
            response = {"id": req.get("id"), "ok": False, "error": str(exc)}
        except Exception as exc:  # a bug or a bad request: answer, never die
            response = {"id": None, "ok": False, "error": f"sandbox server error: {type(exc).__name__}: {exc}"}
        out.write(json.dumps(response) + "\n")
        out.flush()
    for job in _jobs.values():
        if job["proc"].poll() is None:
            _kill_group(job["proc"])


if __name__ == "__main__":
    main()
