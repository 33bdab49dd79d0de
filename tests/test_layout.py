"""The layout is the architecture (docs/design.md, Layout): each folder is one level, and a
module imports only from its own level or the levels below it; the evaluation children's
folder imports nothing of kernel_env; no import cycle; no long module without its reason.

Imports are read from the sources (every ``import`` statement, at any depth, except those
under ``if TYPE_CHECKING:``), so an import hidden inside a function counts as well.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Levels, lowest first; a module belongs to the first prefix it starts with (longest prefixes
#: are listed before their parents).
LEVELS: list[tuple[str, list[str]]] = [
    ("evaluation children", ["kernel_env.evaluators.child"]),
    ("basics", ["kernel_env.config", "kernel_env.languages", "kernel_env.resources", "kernel_env.headers",
                "kernel_env.workspace", "kernel_env.tasks", "kernel_env.sandbox"]),
    ("trusted evaluation", ["kernel_env.evaluators"]),
    ("agent tools", ["kernel_env.tools"]),
    ("episode runtime", ["kernel_env.runtime"]),
    ("environments", ["kernel_env.envs"]),
    ("workloads and plug-ins", ["kernel_env.workloads", "kernel_env.integrations"]),
    ("command line", ["kernel_env.cli"]),
]
#: Siblings on one level that must not import each other.
SIBLINGS = [("kernel_env.evaluators", "kernel_env.tools")]
#: Modules over this many lines say why at their top (a line starting "Why" in the docstring).
LONG_MODULE_LINES = 500


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name, from pyproject's package-dir mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    modules = {}
    for package in config["packages"]:
        top = next(p for p in sorted(mapping, key=len, reverse=True) if package == p or package.startswith(p + "."))
        folder = ROOT / mapping[top] / package[len(top) + 1:].replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports (sibling bare imports in child/ resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    type_checking = {id(node) for node in ast.walk(tree) if isinstance(node, ast.If)
                     and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"}
    skipped = {id(inner) for node in ast.walk(tree) if id(node) in type_checking for inner in ast.walk(node)}
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            if name.startswith("kernel_env.evaluators.child.") and f"kernel_env.evaluators.child.{target}" in MODULES:
                target = f"kernel_env.evaluators.child.{target}"  # `import timing` beside it
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not (target == "kernel_env" and isinstance(node, ast.ImportFrom)):
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _level(name: str) -> int | None:
    for index, (_, prefixes) in enumerate(LEVELS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    return None


def test_every_module_has_a_level_and_imports_only_its_own_or_lower_ones():
    unplaced = [name for name in MODULES if _level(name) is None and name != "kernel_env"
                and not name.startswith(("kernel_env.skills", "kernel_env.workspace_template",
                                         "kernel_env.sandbox_images", "kernel_env.examples"))]
    assert not unplaced, f"modules with no level in docs/design.md's Layout: {unplaced}"
    upward = [f"{name} ({LEVELS[_level(name)][0]}) imports {target} ({LEVELS[_level(target)][0]})"
              for name, targets in GRAPH.items() if _level(name) is not None
              for target in targets if _level(target) is not None and _level(target) > _level(name)]
    assert not upward, "imports that reach up a level:\n" + "\n".join(upward)


def test_siblings_on_one_level_do_not_import_each_other():
    crossing = [f"{name} imports {target}" for a, b in SIBLINGS for name, targets in GRAPH.items()
                for target in targets
                if (name.startswith(a + ".") and target.startswith(b + ".")) or (name.startswith(b + ".") and target.startswith(a + "."))]
    assert not crossing, "\n".join(crossing)


def test_the_evaluation_children_import_nothing_of_kernel_env():
    # Only evaluators/child/ is bound into the fork server and its children: an import of any
    # other kernel_env module would fail there (and would widen what the children hold).
    child = "kernel_env.evaluators.child"
    outside = [f"{name} imports {target}" for name, targets in GRAPH.items() if name == child or name.startswith(child + ".")
               for target in targets if not (target == child or target.startswith(child + "."))]
    assert not outside, "\n".join(outside)


def test_there_is_no_import_cycle():
    # Package __init__ modules re-export their submodules by design; a cycle is between modules.
    graph = {name: {t for t in targets if not MODULES[t].name == "__init__.py"}
             for name, targets in GRAPH.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_long_module_says_why_at_its_top(name):
    path = MODULES[name]
    lines = path.read_text().count("\n")
    if lines <= LONG_MODULE_LINES:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert any(line.startswith("Why") for line in docstring.splitlines()), (
        f"{path.relative_to(ROOT)} has {lines} lines and its docstring gives no reason (a line starting 'Why')")
