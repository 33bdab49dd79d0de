"""Where the data that ships with kernel_env lives (skills, workspace template, examples).

The data directories sit at the top of the checkout and are mapped into the package by
pyproject.toml: a wheel has them at ``kernel_env/<name>``, a checkout or an editable
install at ``<checkout>/<name>``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Filesystem path of a shipped data directory: skills, workspace_template, examples, sandbox_images."""
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kernel_env data directory {name!r} is missing next to {_PACKAGE}; reinstall kernel_env")


def skill_file(language: str) -> Path:
    return data_dir("skills") / language / "SKILL.md"


def example_dir(name: str = "relu_add") -> Path:
    return data_dir("examples") / name
