"""README.md's and docs/*.md's examples run as written, or say in their first line what they need.

Every ```bash (sh, shell) and ```python block of README.md and docs/*.md is one of two kinds:

- **run**: run here as written, on the CPU, from the top of a scratch checkout (its entries link
  to this one's, so what a block writes lands in the scratch folder) with the venv active (its
  bin/ first on PATH), HOME in the scratch folder; it must exit 0. Python blocks run in the
  venv's python, shell blocks in ``bash -euo pipefail``. Two kinds of line are run as a reader
  would not want a test to: a ``make`` line is dry-run (``make -n``: ``make test`` is this
  suite; the targets must exist), and a block whose last command is ``kernel-env serve`` starts
  the server on a free port, which must answer ``/health`` and drain to exit 0 on SIGTERM.
- **needs**: the block's first line is a comment ``# needs ...`` that says what it needs (a GPU,
  a model server, KernelBench's checkout, a terminal) and how to get it. It is not run, but a
  Python block's imports are (a renamed module or function fails here), and it must parse.

docs/trainers.md's shell blocks are run by tests/test_trainers_doc.py (the ``<!-- doc-test -->``
comment above each); here its skipped ones (``<!-- doc-test: skip: ... -->``) need the first
line too, so a reader sees why. A block that takes tens of seconds on a CPU (an evaluation of the
bundled example: its first on a machine times torch.compile too) is marked slow (``SLOW``).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import (
    ROOT,
    active_venv,
    assert_serves_and_drains,
    bubblewrap_skip_reason,
    scratch_checkout,
    shell_commands,
)

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "shell")
PYTHON = ("python", "py")
#: Blocks that take minutes on a 2-core CPU, by a piece of their code: each must match exactly one block.
SLOW = {
    "README.md": ["kernel_env.run_solution("],  # about 90-150 s: the bundled example graded (final evaluation)
    "docs/refine.md": ['"KernelRefine-v0"'],  # about 130 s: the cpp solution built and profiled
}


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the checkout
    line: int  # of the opening fence
    language: str
    code: str
    marker: str  # trainers.md's <!-- doc-test: KIND ... --> above it, else ""

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def needs(self) -> bool:
        return self.code.lstrip().startswith("# needs ")

    @property
    def tested_elsewhere(self) -> bool:
        """trainers.md's shell blocks that test_trainers_doc.py runs (all but its skipped ones)."""
        return self.doc == "docs/trainers.md" and self.language in SHELL and not self.marker.startswith("skip")

    @property
    def slow(self) -> bool:
        return any(piece in self.code for piece in SLOW.get(self.doc, []))


def blocks(path: Path) -> list[Block]:
    found, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(```+)(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, language = fence.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(ticks))
        if language in SHELL + PYTHON:
            code = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                             for line in lines[i + 1:end]) + "\n"
            above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = re.match(r"^<!-- doc-test: (.*?) -->$", above)
            found.append(Block(str(path.relative_to(ROOT)), i + 1, language, code, marker.group(1) if marker else ""))
        i = end + 1
    return found


BLOCKS = [block for doc in DOCS for block in blocks(doc)]
RUN = [block for block in BLOCKS if not block.needs and not block.tested_elsewhere]
NEEDS = [block for block in BLOCKS if block.needs]


def _param(block: Block):
    return pytest.param(block, id=str(block), marks=[pytest.mark.slow] if block.slow else [])


def test_the_pages_have_blocks_of_both_kinds():
    assert any(block.doc == "docs/refine.md" for block in RUN) and any(block.doc == "README.md" for block in RUN)
    assert any(block.language in PYTHON for block in RUN) and any(block.language in SHELL for block in RUN)
    assert NEEDS


def test_every_slow_entry_names_exactly_one_block():
    for doc, pieces in SLOW.items():
        for piece in pieces:
            matching = [str(block) for block in BLOCKS if block.doc == doc and piece in block.code]
            assert len(matching) == 1, f"SLOW[{doc!r}]: {piece!r} matches {matching or 'no block'}"


def test_a_needs_line_says_what_and_how():
    """``# needs WHAT (HOW)`` or ``# needs WHAT: HOW``: more than a word, so a reader can get it going."""
    for block in NEEDS:
        first = block.code.lstrip().splitlines()[0]
        assert len(first.split()) >= 6, f"{block}: {first!r} says too little of what it needs and how to get it"


def dry_make(code: str) -> str:
    """``make TARGET ...`` lines as ``make -n TARGET ...``: the targets must exist; nothing is built or run."""
    return re.sub(r"^make ", "make -n ", code, flags=re.MULTILINE)


def _serves(block: Block) -> bool:
    """A shell block whose last command starts ``kernel-env serve`` (which runs until stopped)."""
    commands = shell_commands(block.code) if block.language in SHELL else []
    return bool(commands) and re.match(r"^(\S*/)?kernel-env serve\b", commands[-1]) is not None


@pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")
@pytest.mark.parametrize("block", [_param(b) for b in RUN if not _serves(b)])
def test_a_block_runs_as_written(block: Block, tmp_path: Path):
    folder, env = scratch_checkout(tmp_path / "checkout"), active_venv(tmp_path / "home")
    if block.language in PYTHON:
        script = tmp_path / "block.py"
        script.write_text(block.code)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", dry_make(block.code)]
    run = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, f"{block} exited {run.returncode}:\n{block.code}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


@pytest.mark.slow  # 6 s on a 2-core machine: the server's start and drain
@pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")
@pytest.mark.parametrize("block", [_param(b) for b in RUN if _serves(b)])
def test_a_server_block_starts_answers_and_drains(block: Block, tmp_path: Path):
    *before, server = shell_commands(block.code)
    folder, env = scratch_checkout(tmp_path / "checkout"), active_venv(tmp_path / "home")
    for command in before:
        subprocess.run(["bash", "-euo", "pipefail", "-c", dry_make(command)], cwd=folder, env=env, check=True, timeout=600)
    assert_serves_and_drains(server, folder, env, tmp_path / "server.err", str(block))


@pytest.mark.slow  # 10 s on a 2-core machine: the integrations' imports (OpenHands, TRL, Ray, ...)
def test_the_python_blocks_that_need_more_parse_and_their_imports_import():
    """One child imports every such block's imports in turn (openhands-sdk alone takes 13 s to import)."""
    imports = {}
    for block in (b for b in NEEDS if b.language in PYTHON):
        tree = compile(block.code, str(block), "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        imports[str(block)] = "\n".join(ast.unparse(node) for node in tree.body
                                        if isinstance(node, ast.Import | ast.ImportFrom))  # a fragment may have none
    assert any(imports.values()), imports
    check = ("import json, sys, traceback\nfailed = {}\nfor name, code in json.load(sys.stdin).items():\n"
             "    try:\n        exec(code, {})\n    except Exception:\n        failed[name] = traceback.format_exc()\n"
             "print(json.dumps(failed))\n")
    run = subprocess.run([sys.executable, "-c", check], input=json.dumps(imports), cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    failed = json.loads(run.stdout.splitlines()[-1])
    assert not failed, "\n".join(f"{name}: its imports fail:\n{imports[name]}\n{why}" for name, why in failed.items())


@pytest.mark.parametrize("block", [b for b in NEEDS if b.language in SHELL], ids=str)
def test_a_shell_block_that_needs_more_is_valid_bash(block: Block):
    run = subprocess.run(["bash", "-n", "-c", block.code], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, f"{block}: not valid bash:\n{run.stderr}"
