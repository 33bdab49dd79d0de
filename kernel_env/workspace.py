"""Workspaces: the directory an agent works in, laid out as in the CUDA Agent paper.

::

    SKILL.md             protected: the language's skill
    binding_registry.h   protected (C++ languages): REGISTER_BINDING
    binding.cpp          protected (C++ languages): builds the ``cuda_extension`` module
    kernels/             the agent's kernels
    utils/               protected: compile.sh (build.py and its modules), verification.py, profiling.py, the broker's client
    model.py             protected: the reference Model
    model_new.py         the agent's ModelNew

``Workspace.create`` makes one, stating the evaluations' checks (``Checks``, ``state_checks``);
``PROTECTED`` and ``AGENT_OWNED`` name its parts. A workspace lives in a host directory of its
own (``root``) that also holds the sandbox's private state; only ``root/workspace`` is the
agent's. Protected files are read-only (the sandbox mounts them read-only as well) and hashed at
creation, so tampering is detected even where a backend could not enforce it. The trusted
harness never runs the workspace's copies of protected files: it uses its own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kernel_env.config import DEFAULT_SPEEDUP_MARGIN, workspaces_dir
from kernel_env.languages import LANGUAGES, Language, get_language
from kernel_env.resources import data_dir
from kernel_env.tasks import Task

PROTECTED = ("SKILL.md", "binding.cpp", "binding_registry.h", "utils", "model.py")
AGENT_OWNED = ("kernels", "model_new.py")
_ALL_TEMPLATE_LANGUAGE_FILES = {f for lang in LANGUAGES.values() for f in lang.template_files}


@dataclass
class Workspace:
    root: Path
    task: Task
    language: Language
    protected_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        """The directory the agent sees (mounted at /workspace in a sandbox)."""
        return self.root / "workspace"

    @property
    def state_dir(self) -> Path:
        """Private, writable state of the sandbox (shell state, background job logs)."""
        return self.root / "state"

    @classmethod
    def create(cls, task: Task, language: str | Language = "cuda", root: str | Path | None = None, *,
               checks: Checks | None = None) -> Workspace:
        """Materialise template + task + SKILL.md into a fresh directory and protect it.

        Args:
            task: the task; its code becomes ``model.py``.
            language: cuda | cpp | triton (or a Language): which skill, starter ``model_new.py``
                and template files (triton has no binding files).
            root: the folder the workspace's own directory is made in; None:
                ``$KERNEL_ENV_HOME/workspaces``.
            checks: what the evaluations of this workspace's solutions check, which SKILL.md and
                ``utils/verification.py`` state; None: general words and the default margin.

        Returns:
            The workspace, its protected files read-only and hashed.

        Raises:
            ValueError: an unknown language."""
        lang = get_language(language) if isinstance(language, str) else language
        base = Path(root) if root else workspaces_dir()
        base.mkdir(parents=True, exist_ok=True)
        slug = task.id.replace("/", "_")[:60]
        episode_root = Path(tempfile.mkdtemp(prefix=f"{slug}-{lang.name}-", dir=base))
        ws = cls(root=episode_root, task=task, language=lang)
        ws.path.mkdir()
        ws.state_dir.mkdir()

        template = data_dir("workspace_template")
        for entry in template.iterdir():
            if entry.name in _ALL_TEMPLATE_LANGUAGE_FILES and entry.name not in lang.template_files:
                continue
            if entry.name == "__pycache__":
                continue
            target = ws.path / entry.name
            if entry.is_dir():
                shutil.copytree(entry, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(entry, target)
        skill_dir = data_dir("skills") / lang.name
        shutil.copy2(skill_dir / "SKILL.md", ws.path / "SKILL.md")
        (ws.path / "kernels").mkdir(exist_ok=True)
        starter = skill_dir / "model_new.py"
        shutil.copy2(starter, ws.path / "model_new.py")
        (ws.path / "model.py").write_text(task.code)
        for text in (ws.path / "SKILL.md", ws.path / "utils" / "verification.py"):
            text.write_text(state_checks(text.read_text(), checks))
        ws.protected_hashes = ws.hash_protected()
        ws._lock_protected()
        return ws

    # ------------------------------------------------------------------ protection

    def protected_paths(self) -> list[Path]:
        return [self.path / name for name in PROTECTED if (self.path / name).exists()]

    def hash_protected(self) -> dict[str, str]:
        hashes = {}
        for top in self.protected_paths():
            files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            for file in files:
                hashes[str(file.relative_to(self.path))] = hashlib.sha256(file.read_bytes()).hexdigest()
        return hashes

    def tampered_files(self) -> list[str]:
        """Protected files that were changed, added or removed since creation."""
        now = self.hash_protected()
        names = set(now) | set(self.protected_hashes)
        return sorted(n for n in names if now.get(n) != self.protected_hashes.get(n))

    def _lock_protected(self) -> None:
        for top in self.protected_paths():
            for p in [top, *top.rglob("*")] if top.is_dir() else [top]:
                mode = p.stat().st_mode
                p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))

    def hand_over(self, uid: int, gid: int) -> None:
        """Make the agent's part of the episode owned by ``uid:gid``: the workspace folder and
        everything in it except the protected files (they stay the host's, read-only), and the
        sandbox's state folder. For a backend whose sandbox user is that uid on the host (docker
        when the host is root). Links are changed themselves, never followed. Raises OSError
        where this process may not change owners (it is not root)."""
        for top, skip in ((self.path, PROTECTED), (self.state_dir, ())):
            top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                _chown_if_needed(None, top_fd, uid, gid)
                for name in os.listdir(top_fd):
                    if name in skip:
                        continue
                    _chown_if_needed(name, top_fd, uid, gid)
                    if stat.S_ISDIR(os.lstat(name, dir_fd=top_fd).st_mode):
                        for _, dirs, files, dir_fd in os.fwalk(name, dir_fd=top_fd, follow_symlinks=False):
                            for entry in (*dirs, *files):
                                _chown_if_needed(entry, dir_fd, uid, gid)
            finally:
                os.close(top_fd)

    # ------------------------------------------------------------------ agent files

    def copy_solution(self, source: str | Path) -> list[str]:
        """Copy a solution directory (model_new.py, kernels/…) into the workspace; returns what was copied."""
        source = Path(source)
        if not (source / "model_new.py").is_file():
            raise FileNotFoundError(f"solution {source}: no model_new.py")
        copied = []
        for name in AGENT_OWNED:
            src = source / name
            if not src.exists():
                continue
            dst = self.path / name
            if src.is_dir():
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build"))
                # Report what landed, not what the source holds: the ignored build/ and caches stay out.
                copied += [str(p.relative_to(self.path)) for p in sorted(dst.rglob("*")) if p.is_file()]
            else:
                shutil.copy2(src, dst)
                copied.append(name)
        return copied

    def destroy(self) -> None:
        """Remove the episode directory, read-only files included."""
        def make_writable_and_retry(func, path, _exc):
            os.chmod(os.path.dirname(path), 0o755)
            if os.path.exists(path) and not os.path.islink(path):
                os.chmod(path, 0o755)
            func(path)

        if self.root.exists():
            shutil.rmtree(self.root, onexc=make_writable_and_retry)


def _chown_if_needed(name: str | None, dir_fd: int, uid: int, gid: int) -> None:
    """chown ``name`` (relative to ``dir_fd``; None: the folder itself) without following a link."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False) if name is not None else os.fstat(dir_fd)
    if (info.st_uid, info.st_gid) == (uid, gid):
        return
    if name is None:
        os.fchown(dir_fd, uid, gid)
    else:
        os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)


class Checks(NamedTuple):
    """What the evaluations of a workspace's solutions check, as SKILL.md and ``utils/verification.py``
    state it: the trials, the tolerance, and the speed-up margin of the rewards' milestones."""

    trials: int
    atol: float
    rtol: float
    margin: float = DEFAULT_SPEEDUP_MARGIN


def state_checks(text: str, checks: Checks | None) -> str:
    """``text`` with the evaluations' checks filled in: ``{trials}``, ``{all_trials}``,
    ``{tolerance}``, ``{margin}`` ("5%") and ``{target}`` (the share of torch.compile's time to reach:
    "0.95"). Without ``checks``, general words and the default margin."""
    margin = checks.margin if checks is not None else DEFAULT_SPEEDUP_MARGIN
    if checks is None:
        count, all_trials, tolerance = "several", "every trial", "the evaluator's tolerance"
    else:
        trials, atol, rtol = checks.trials, checks.atol, checks.rtol
        count, all_trials = str(trials), (f"all {trials} trials" if trials != 1 else "its one trial")
        tolerance = f"atol = rtol = {atol:g}" if atol == rtol else f"atol = {atol:g}, rtol = {rtol:g}"
    filled = {"{trials}": count, "{all_trials}": all_trials, "{tolerance}": tolerance,
              "{margin}": f"{margin * 100:g}%", "{target}": f"{1 - margin:g}"}
    for mark, words in filled.items():
        text = text.replace(mark, words)
    return text
