"""The set-up (scripts/setup.sh, the Makefile): `make demo` installs kernel_env without extras and
`make test` with the `test` extra. So every module but the integrations imports with the base
dependencies alone, and imports only packages that pyproject.toml's dependencies name themselves (not
through another package's requirements, which change); the `test` extra holds every other extra; and
the stamp counts a venv set up for the tests as set up for the demo.

The import checks see what a module imports when it is imported; a package that a function imports
when called is not checked here (the integrations and commands that do so say which extra to install).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Run in a child: makes the distributions outside kernel_env's base requirements (with their own
# requirements, as installed here) unimportable, then imports every module of the packages listed.
BASE_ONLY_IMPORTS = r"""
import importlib, importlib.abc, importlib.metadata as md, pkgutil, re, sys
from packaging.requirements import Requirement

def key(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def closure(name, extras, seen):
    if key(name) in seen:
        return
    seen.add(key(name))
    for text in md.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            try:
                closure(req.name, tuple(req.extras), seen)
            except md.PackageNotFoundError:  # a requirement for another platform or Python
                pass

base = set()
closure("kernel_env", (), base)
blocked = {top for top, dists in md.packages_distributions().items() if not any(key(d) in base for d in dists)}
for name in [name for name in sys.modules if name.split(".")[0] in blocked]:  # packaging, imported above
    del sys.modules[name]

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (not a base dependency)", name=name)

sys.meta_path.insert(0, NotInstalled())
failed = []
for package in sys.argv[1:]:
    names = [package] + [info.name for info in pkgutil.iter_modules(importlib.import_module(package).__path__,
                                                                    package + ".")
                         if not info.ispkg and not info.name.endswith(".__main__")]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed.append(f"{name}: {exc}")
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""

# Plug-ins for the extras (each says which extra it needs when imported without it), the evaluation
# children (imported by bare name inside their sandbox) and data folders that ship as packages.
NOT_BASE = ("kernel_env.integrations", "kernel_env.evaluators.child", "kernel_env.skills",
            "kernel_env.workspace_template", "kernel_env.sandbox_images", "kernel_env.examples")


def test_every_module_but_the_integrations_imports_with_the_base_dependencies_alone():
    packages = [p for p in PYPROJECT["tool"]["setuptools"]["packages"] if not p.startswith(NOT_BASE)]
    result = subprocess.run([sys.executable, "-c", BASE_ONLY_IMPORTS, *packages], check=False,
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, f"modules that need more than `pip install -e .`:\n{result.stdout}{result.stderr}"


def _module_level_imports(path: Path) -> set[str]:
    """The top-level names a module imports when it is imported: not in functions, not for TYPE_CHECKING."""
    found: set[str] = set()
    pending = list(ast.parse(path.read_text(), filename=str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            pending.extend(node.orelse)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return found


def test_what_a_module_imports_at_import_time_is_a_base_dependency_itself():
    """Not only through another package's requirements: openai 3 dropped httpx, which llm.py imports."""
    config = PYPROJECT["tool"]["setuptools"]
    mapping, direct = config["package-dir"], {_key(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for package in (p for p in config["packages"] if not p.startswith(NOT_BASE)):
        top = next(p for p in sorted(mapping, key=len, reverse=True) if package == p or package.startswith(p + "."))
        for path in sorted((ROOT / mapping[top] / package[len(top) + 1:].replace(".", "/")).glob("*.py")):
            for name in _module_level_imports(path) - set(sys.stdlib_module_names) - {"kernel_env", "__future__"}:
                if not any(_key(dist) in direct for dist in distributions.get(name, [])):
                    undeclared.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not undeclared, f"imported at import time but not in pyproject.toml's dependencies: {undeclared}"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_test_extra_holds_every_other_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    missing = {name: sorted(set(requirements) - set(extras["test"]))
               for name, requirements in extras.items() if name != "test"}
    assert not any(missing.values()), f"`make test` and `make setup` would not install: {missing}"


def _setup(tmp_path: Path, stamp_extras: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/setup.sh on a venv whose stamp is current and lists stamp_extras (its python: this one)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    if not (venv / "bin" / "python").exists():
        (venv / "bin" / "python").symlink_to(sys.executable)
    spec = "torch==2.13.0"
    key = f"{hashlib.sha256((ROOT / 'pyproject.toml').read_bytes()).hexdigest()} {sys.executable} {spec}"
    (venv / ".kernel_env-setup").write_text(f"{key}\n{stamp_extras}\n")
    env = {**os.environ, "VENV": str(venv), "PYTHON": sys.executable, "TORCH_SPEC": spec}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), *args], check=False, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.skipif(sys.version_info[:2] != (3, 12), reason="scripts/setup.sh takes only a Python 3.12")
@pytest.mark.parametrize(("stamp_extras", "args"), [("", ()), ("test", ()), ("test", ("test",)),
                                                     ("serve test", ("test",))])
def test_a_venv_with_the_extras_asked_for_or_more_is_up_to_date(tmp_path, stamp_extras, args):
    result = _setup(tmp_path, stamp_extras, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "set-up is up to date" in result.stdout


@pytest.mark.skipif(sys.version_info[:2] != (3, 12), reason="scripts/setup.sh takes only a Python 3.12")
def test_an_extra_pyproject_lacks_is_refused_before_anything_is_installed(tmp_path):
    result = _setup(tmp_path, "test", "tests")
    assert result.returncode == 2
    assert "pyproject.toml has no extra 'tests'" in result.stderr


@pytest.mark.skipif(sys.version_info[:2] != (3, 12), reason="scripts/setup.sh takes only a Python 3.12")
def test_torch_spec_is_pips_arguments_so_the_cpu_wheels_index_can_be_named(tmp_path):
    """README's CPU-only route: TORCH_SPEC='torch==2.13.0 --index-url .../whl/cpu' reaches pip as three
    arguments. The venv's python here records what pip is asked (nothing is downloaded) and is this one
    otherwise; TORCH_MIN above any torch makes the set-up install torch."""
    venv, calls = tmp_path / "venv", tmp_path / "pip-calls"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/bash\nif [ "$1 $2" = "-m pip" ]; then printf "[%s]" "$@" >> {calls}; echo >> {calls}; exit 0; fi\n'
                      f'exec {sys.executable} "$@"\n')  # each argument in brackets
    (venv / "bin" / "kernel-env").write_text("#!/bin/sh\necho kernel-env 0\n")
    for script in (python, venv / "bin" / "kernel-env"):
        script.chmod(0o755)
    spec = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    env = {**os.environ, "VENV": str(venv), "PYTHON": sys.executable, "TORCH_SPEC": spec, "TORCH_MIN": "99.0"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=120,
                            env=env, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    torch_install, kernel_env_install = calls.read_text().splitlines()
    assert torch_install.endswith("[install][--disable-pip-version-check][--progress-bar][off]"
                                  "[torch==2.13.0][--index-url][https://download.pytorch.org/whl/cpu]"), torch_install
    assert kernel_env_install.endswith("[-e][.]"), kernel_env_install
    assert (venv / ".kernel_env-setup").read_text().splitlines()[0].endswith(spec)  # the stamp's key names it
