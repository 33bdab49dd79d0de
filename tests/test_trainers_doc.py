"""docs/trainers.md runs as written: every shell block there says, in the comment just above it,
whether this test runs it on the CPU and how, or why not (``<!-- doc-test: skip: needs a GPU -->``).

- ``run``: the block is run whole by bash (``-euo pipefail``), and must exit 0.
- ``serve``: the block's last line starts a server: it must print its listening line, answer
  ``/health``, and drain to exit 0 on SIGTERM.
- ``model``: the block talks to a model server at the first ``http://localhost:PORT/v1`` it names:
  a scripted one answers there (every reply calls Finish), the API key variable it names is set,
  and the block must exit 0.
- ``installed``: the block's ``pip install -e '.[extra,...]'`` lines name extras that pyproject.toml
  has, and this environment has their requirements (CI installs the test extras, which hold them
  all; running pip again would test pip). The other kinds check their ``pip install`` lines so too,
  and run the rest.

Blocks run the way the page tells a reader to: from the top of a checkout with its venv active
(the venv's bin/ first on PATH). The checkout is a scratch folder whose entries link to this one's,
so what a command writes (trl_grpo_output/, a parquet, a log) lands in the scratch folder.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from scripted_llm import Reply, ScriptedLLM
from support import active_venv, assert_serves_and_drains, bubblewrap_skip_reason, scratch_checkout, shell_commands

pytestmark = pytest.mark.slow  # end to end: docs/trainers.md's blocks run, servers started

ROOT = Path(__file__).resolve().parents[1]
#: What earlier runs of the blocks leave at the top of the checkout: not linked into a scratch one.
_SCRATCH = ("trl_grpo_output", "outputs")
DOC = ROOT / "docs" / "trainers.md"
KINDS = ("run", "serve", "model", "installed", "skip")


@dataclass(frozen=True)
class Block:
    kind: str
    why: str  # a skip's reason
    code: str
    line: int  # where the block starts in the page

    def __str__(self) -> str:
        return f"{self.kind}@{DOC.name}:{self.line}"


def blocks(text: str) -> list[Block]:
    """The page's shell blocks, each with the doc-test comment above it (``kind`` "" when there is none)."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(```+)(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        if fence.group(2) in ("bash", "sh", "shell"):
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = re.match(r"^<!-- doc-test: (\w+)(?::\s*(.*?))? -->$", above.strip())
            kind, why = (marker.group(1), marker.group(2) or "") if marker else ("", "")
            found.append(Block(kind, why, "\n".join(lines[i + 1:end]) + "\n", i + 1))
        i = end + 1
    return found


BLOCKS = blocks(DOC.read_text())


def test_every_shell_block_says_whether_it_is_run_and_a_skip_says_why():
    unmarked = [str(block) for block in BLOCKS if block.kind not in KINDS]
    assert not unmarked, f"shell blocks without a <!-- doc-test: {'|'.join(KINDS)} --> comment above: {unmarked}"
    assert all(block.why for block in BLOCKS if block.kind == "skip"), "a skipped block must say why"
    assert any(block.kind in ("run", "serve") for block in BLOCKS)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "installed"], ids=str)
def test_the_extras_a_block_installs_exist_and_are_installed(block: Block):
    assert extras_installed(block), f"{block}: no `pip install -e '.[extra]'` line"


def extras_installed(block: Block) -> list[str]:
    """The extras the block's ``pip install -e '.[...]'`` lines name, each checked: pyproject.toml has it and
    this environment satisfies its requirements."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [extra for command in shell_commands(block.code) if command.startswith("pip install")
             for group in re.findall(r"-e '\.\[([\w,-]+)\]'", command) for extra in group.split(",")]
    for extra in named:
        assert extra in extras, f"{block}: pyproject.toml has no extra {extra!r}"
        for requirement in map(Requirement, extras[extra]):
            version = metadata.version(requirement.name)
            assert requirement.specifier.contains(version, prereleases=True), (block, requirement, version)
    return named


@pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run"], ids=str)
def test_a_block_runs_as_written(block: Block, tmp_path: Path):
    run_block(block, tmp_path)


@pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "model"], ids=str)
def test_a_block_talking_to_a_model_server_runs_as_written_against_a_scripted_one(block: Block, tmp_path: Path):
    written = re.search(r"http://localhost:(\d+)/v1", block.code).group(0)
    key = re.search(r"(?:-k|--api-key-var) (\w+)", block.code)
    finish = Reply(tool_calls=[{"name": "Finish", "arguments": {}}])
    with ScriptedLLM(lambda request: finish, port=0) as llm:  # the page's port may be taken on this host: a free one
        block = dataclasses.replace(block, code=block.code.replace(written, llm.base_url))
        run_block(block, tmp_path, **({key.group(1): "scripted"} if key else {}))
    assert llm.requests, f"{block}: the model server was never asked"


def run_block(block: Block, tmp_path: Path, **env: str) -> None:
    """Run the block whole in a scratch checkout (HOME in the scratch folder too: ``~/data/...`` lands there);
    its ``pip install`` lines are checked (``extras_installed``), not run."""
    extras_installed(block)
    code = "\n".join(line for line in block.code.splitlines() if not line.startswith("pip install"))
    env = {**active_venv(), "HOME": str(tmp_path / "home"), **env}
    folder = scratch_checkout(tmp_path / "checkout", skip=_SCRATCH)
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=900, check=False)
    assert run.returncode == 0, f"{block} exited {run.returncode}:\n{block.code}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


@pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "serve"], ids=str)
def test_a_server_block_starts_answers_and_drains(block: Block, tmp_path: Path):
    extras_installed(block)
    *before, server = [c for c in shell_commands(block.code) if not c.startswith("pip install")]
    folder, env = scratch_checkout(tmp_path / "checkout", skip=_SCRATCH), active_venv()
    for command in before:
        subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=folder, env=env, check=True, timeout=600)
    assert_serves_and_drains(server, folder, env, tmp_path / "server.err", str(block))
