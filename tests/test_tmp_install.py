"""Grading works wherever the interpreter lives: a checkout and a venv under /tmp.

Containers and CI runners commonly build under /tmp, and every evaluation child gets a private
/tmp: a venv there was hidden from whatever the child imported after its fork (torch imports
``torch.utils.serialization`` only in ``torch.save``), and every grade failed.

The venv under /tmp is this test run's own venv, hard-linked (no copy of torch's gigabytes) with
its editable install pointed at a copy of the checkout under /tmp, so ``kernel_env`` and torch
both come from /tmp, and a real grade runs there end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support import bubblewrap_skip_reason

pytestmark = pytest.mark.slow  # end to end: a venv and checkout under /tmp, a real grade

ROOT = Path(__file__).resolve().parents[1]
_CHECKOUT_PARTS = ("kernel_env", "envs", "tools", "evaluators", "skills", "workspace_template", "examples",
                   "sandbox_images", "pyproject.toml")


def _venv_under(folder: Path, checkout: Path) -> Path:
    """This run's venv at ``folder``: hard links where the file system allows (a copy elsewhere),
    with the editable install's finder (a new file, not a link) mapping kernel_env to ``checkout``."""
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.fail("the test suite must run in a venv (make test sets one up)")
    target = folder / "venv"
    try:
        subprocess.run(["cp", "-al", str(venv), str(target)], check=True, capture_output=True)
    except subprocess.CalledProcessError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(venv, target, symlinks=True)
    finders = list(target.glob("lib/python*/site-packages/__editable___kernel_env_*_finder.py"))
    assert finders, f"no editable install of kernel_env in {venv} (make test installs it with pip install -e)"
    for finder in finders:
        text = finder.read_text()
        finder.unlink()  # the link's other name is this run's own venv: never write through it
        finder.write_text(text.replace(str(ROOT), str(checkout)))
    return target


def test_a_checkout_and_venv_under_tmp_grade_the_example_correct():
    if bubblewrap_skip_reason():
        pytest.skip(f"the children are isolated (and /tmp private) only under bubblewrap: {bubblewrap_skip_reason()}")
    folder = Path(tempfile.mkdtemp(prefix="kernel_env-under-tmp-", dir="/tmp"))
    try:
        checkout = folder / "checkout"
        for part in _CHECKOUT_PARTS:
            source = ROOT / part
            if source.is_dir():
                shutil.copytree(source, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, checkout / part)
        venv = _venv_under(folder, checkout)
        script = (
            "import json, kernel_env\n"
            "task = kernel_env.resolve_task('example/relu_add')\n"
            f"build, result = kernel_env.run_solution(task, {str(checkout / 'examples/relu_add/solutions/cpp')!r}, "
            "language='cpp', device='cpu')\n"
            "print(json.dumps({'module': kernel_env.__file__, 'correct': result.correct, 'error': result.error}))\n"
        )
        env = {**os.environ, "KERNEL_ENV_PRECOMPILED_HEADERS": "0"}
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=540)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no result (exit {proc.returncode}): {proc.stderr[-3000:]}"
        report = json.loads(lines[-1])
        assert report["module"].startswith(str(checkout)), report
        assert report["correct"], report["error"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
