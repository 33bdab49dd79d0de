"""The broker: the only door from a sandbox to the GPU pool.

Each episode's sandbox gets a unix socket (mounted read-only at /run/kernel_env/broker).
``python3 -m utils.verification`` / ``utils.profiling`` inside the sandbox send one line,
``{"op": "verify"|"profile"}``; the broker snapshots the workspace, checks the protected
files, submits a job to the pool, and answers with the report text and the result.

The broker never imports or runs candidate code, and never follows a link out of the
workspace: the snapshot copies regular files only, opened relative to directory handles
with O_NOFOLLOW, so a symlink or a swapped directory cannot make it read a host file.
The request says *what* to do; *which* workspace is fixed by the socket it arrived on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from kernel_env.evaluators.records import EvalJob, EvalResult, EvalSettings, Mode
from kernel_env.evaluators.report import model_report
from kernel_env.evaluators.verdict import failed
from kernel_env.runtime.pool import GpuPool
from kernel_env.workspace import Workspace

log = logging.getLogger(__name__)

SANDBOX_BROKER_DIR = "/run/kernel_env/broker"
SOCKET_NAME = "broker.sock"
MAX_SNAPSHOT_BYTES = 256 << 20
_REQUEST_LIMIT = 4096


#: build/build_info.json, written by utils/build.py: the torch the module was built against, and its sources.
BUILD_INFO = "build_info.json"


class SnapshotError(Exception):
    pass


def _open_dir(name: str, dir_fd: int | None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)


def _copy_regular(name: str, dir_fd: int, dest: Path, budget: list[int]) -> bytes | None:
    """Copy one regular file (never a link, fifo or device); returns its bytes, None if skipped."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        budget[0] -= info.st_size
        if budget[0] < 0:
            raise SnapshotError(f"the workspace files to evaluate exceed {MAX_SNAPSHOT_BYTES >> 20} MB")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read()
    finally:
        os.close(fd)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    os.utime(dest, ns=(info.st_atime_ns, info.st_mtime_ns))
    return data


def snapshot_workspace(workspace: Workspace, dest: Path) -> tuple[str, list[str]]:
    """Copy model_new.py, kernels/ and the built module into ``dest``; returns (content hash, notes)."""
    dest.mkdir(parents=True)
    digest = hashlib.sha256()
    notes: list[str] = []
    budget = [MAX_SNAPSHOT_BYTES]
    root_fd = _open_dir(str(workspace.path), None)
    try:
        data = _copy_regular("model_new.py", root_fd, dest / "model_new.py", budget)
        if data is not None:
            digest.update(b"model_new.py\0" + data)
        for top in ("kernels", "build"):
            try:
                top_fd = _open_dir(top, root_fd)
            except OSError:
                continue
            try:
                _walk(top_fd, Path(top), dest, digest, notes, budget, depth=0, only_module=top == "build")
            finally:
                os.close(top_fd)
    finally:
        os.close(root_fd)
    return digest.hexdigest()[:16], notes


def _walk(dir_fd: int, rel: Path, dest: Path, digest, notes: list[str], budget: list[int], depth: int, only_module: bool) -> None:
    if depth > 8:
        return
    for name in sorted(os.listdir(dir_fd)):
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        path = rel / name
        if stat.S_ISLNK(info.st_mode):
            notes.append(f"ignored the symbolic link {path}")
        elif stat.S_ISDIR(info.st_mode) and not only_module and name != "__pycache__":
            try:
                child = _open_dir(name, dir_fd)
            except OSError:
                continue
            try:
                _walk(child, path, dest, digest, notes, budget, depth + 1, only_module)
            finally:
                os.close(child)
        elif stat.S_ISREG(info.st_mode) and (not only_module or (name.startswith("cuda_extension") and name.endswith(".so"))):
            data = _copy_regular(name, dir_fd, dest / path, budget)
            if data is not None:
                digest.update(str(path).encode() + b"\0" + data)
        elif stat.S_ISREG(info.st_mode) and only_module and name == BUILD_INFO:
            # What the module says it was built against (not part of the hash: it changes with every build).
            _copy_regular(name, dir_fd, dest / path, budget)


def _stale_build_note(snapshot: Path) -> str | None:
    modules = list((snapshot / "build").glob("cuda_extension*.so"))
    sources = [p for p in (snapshot / "kernels").rglob("*") if p.suffix in (".cu", ".cpp", ".cuh", ".h")]
    if not sources:
        return None
    if not modules:
        return "there is no built module in build/: run `bash utils/compile.sh` first"
    built = max(m.stat().st_mtime for m in modules)
    newer = [str(p.relative_to(snapshot)) for p in sources if p.stat().st_mtime > built]
    if newer:
        return f"{', '.join(newer[:3])} changed after the last build: run `bash utils/compile.sh` again"
    return None


class Broker:
    """Evaluates workspaces through a pool; serves each sandbox on its own socket."""

    def __init__(self, pool: GpuPool, *, device: str = "cuda", settings: EvalSettings | None = None,
                 on_result: Callable[[EvalResult, Path], None] | None = None):
        """``on_result(result, snapshot_dir)`` is called after every evaluation (from the thread that
        ran it), while the snapshot of what was evaluated still exists."""
        self.pool = pool
        self.device = device
        self.settings = settings or EvalSettings()
        self.on_result = on_result
        #: Seconds spent in evaluations so far, from the request to the answer (the pool's queue included).
        self.evaluation_s = 0.0
        self._servers: dict[Path, socket.socket] = {}
        self._timing_lock = threading.Lock()

    def evaluate_workspace(self, workspace: Workspace, mode: Mode = Mode.VERIFY) -> EvalResult:
        """Snapshot, check, evaluate; every problem becomes a failed result, never an exception."""
        job_id = uuid.uuid4().hex[:12]
        snapshot = workspace.root / "snapshots" / job_id
        started = time.monotonic()
        try:
            result = self._evaluate(workspace, mode, job_id, snapshot)
            if self.on_result is not None:
                self.on_result(result, snapshot)
            return result
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)
            with self._timing_lock:
                self.evaluation_s += time.monotonic() - started

    def _evaluate(self, workspace: Workspace, mode: Mode, job_id: str, snapshot: Path) -> EvalResult:
        base = dict(job_id=job_id, task_id=workspace.task.id, language=workspace.language.name, device=self.device, mode=mode)
        margin = self.settings.speedup_margin
        try:
            digest, notes = snapshot_workspace(workspace, snapshot)
        except (SnapshotError, OSError) as exc:
            return failed(**base, margin=margin, compiled=False, error=f"could not read the workspace: {exc}", fault="candidate")
        tampered = workspace.tampered_files()
        if tampered:
            return failed(**base, margin=margin, error="protected files were modified", fault="candidate",
                          snapshot_hash=digest, violations=[f"protected file changed: {name}" for name in tampered[:10]])
        stale = _stale_build_note(snapshot) if workspace.language.builds_extension else None
        if stale and not list((snapshot / "build").glob("cuda_extension*.so")):
            return failed(**base, margin=margin, compiled=False, error=stale, fault="candidate", snapshot_hash=digest)
        job = EvalJob(**base, task_code=workspace.task.code, snapshot_dir=snapshot, snapshot_hash=digest, settings=self.settings)
        result = self.pool.submit(job).result()
        if stale:
            notes.append(stale)
        if notes:
            result.log_tail = "\n".join(["notes: " + "; ".join(notes), result.log_tail]).strip()
        return result

    # ------------------------------------------------------------------ sockets

    def serve(self, workspace: Workspace) -> Path:
        """Start answering requests for one workspace; returns the host directory holding the socket."""
        # Unix socket paths are limited to 107 bytes, so the socket lives in a short temp path.
        directory = Path(tempfile.mkdtemp(prefix="ke-broker-"))
        path = directory / SOCKET_NAME
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        os.chmod(path, 0o777)
        server.listen(4)
        self._servers[directory] = server
        lock = threading.Lock()
        threading.Thread(target=self._accept, args=(server, workspace, lock), daemon=True,
                         name=f"kernel_env-broker-{workspace.task.id}").start()
        return directory

    def close(self) -> None:
        """Stop serving every workspace and remove the sockets."""
        for directory, server in self._servers.items():
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept(); close() alone does not
            server.close()
            shutil.rmtree(directory, ignore_errors=True)
        self._servers.clear()

    def _accept(self, server: socket.socket, workspace: Workspace, lock: threading.Lock) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn, workspace, lock), daemon=True).start()

    def _handle(self, conn: socket.socket, workspace: Workspace, lock: threading.Lock) -> None:
        with conn:
            try:
                conn.settimeout(10)
                raw = conn.recv(_REQUEST_LIMIT).split(b"\n", 1)[0]
                request = json.loads(raw)
                mode = {"verify": Mode.VERIFY, "profile": Mode.PROFILE}[request["op"]]
            except (OSError, ValueError, KeyError, TypeError):
                _send(conn, {"ok": False, "report": 'bad request: send {"op": "verify"} or {"op": "profile"}'})
                return
            conn.settimeout(None)
            # One evaluation at a time per workspace: a flood of requests queues here, not in the pool.
            with lock:
                result = self.evaluate_workspace(workspace, mode)
            _send(conn, {"ok": True, "report": model_report(result), "result": result.summary()})


def _send(conn: socket.socket, payload: dict) -> None:
    try:
        conn.sendall(json.dumps(payload).encode() + b"\n")
    except OSError:
        pass
