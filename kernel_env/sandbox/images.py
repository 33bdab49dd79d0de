"""Building the container images of sandbox_images/ with the local Docker engine (``kernel-env image build``).

Two images, one Dockerfile each: ``cuda`` (sandboxes and GPU workers: the CUDA devel base, so
nvcc, and torch's CUDA build) and ``cpu``. Both hold the toolchain the local sandbox shows
read-only (Python 3.12 in /opt/venv with the pinned torch, Triton, ninja, g++, ripgrep, bash)
and kernel_env itself, and run as uid 1000; an extension built in a sandbox of the image loads
in a worker of the same image. The docker sandbox uses one with ``image="kernel_env/cuda:…"``.

The base image comes from its registry: it is pulled first, on its own, so that a machine
without one (CI) gets a clear error instead of a failed build step. Nothing here runs in tests
except that error: a real build downloads gigabytes.
"""

from __future__ import annotations

import importlib.metadata
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

from kernel_env.resources import data_dir

IMAGES = ("cuda", "cpu")
DEFAULT_TORCH = "torch==2.13.0"  # the pin of scripts/setup.sh
TORCH_INDEX = {"cuda": "https://download.pytorch.org/whl/cu130", "cpu": "https://download.pytorch.org/whl/cpu"}
# What of a kernel_env checkout goes into an image (pyproject.toml maps these folders into the package).
_SOURCES = ("pyproject.toml", "README.md", "kernel_env", "envs", "tools", "evaluators", "skills", "workspace_template",
            "sandbox_images", "examples")


class ImageBuildError(RuntimeError):
    """An image could not be built; the message says why and what to do."""


def default_tag(kind: str) -> str:
    """``kernel_env/<kind>:<kernel_env's version>``."""
    try:
        version = importlib.metadata.version("kernel_env")
    except importlib.metadata.PackageNotFoundError:
        version = "dev"
    return f"kernel_env/{kind}:{version}"


def dockerfile(kind: str) -> Path:
    if kind not in IMAGES:
        raise ImageBuildError(f"unknown image {kind!r}; available: {', '.join(IMAGES)}")
    return data_dir("sandbox_images") / f"Dockerfile.{kind}"


def _checkout() -> Path:
    """The kernel_env checkout this package runs from (its sources go into the image)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "kernel_env").is_dir():
        raise ImageBuildError(f"building an image needs a kernel_env checkout (its sources go into the image), and "
                              f"{root} is not one; run it from a clone: pip install -e .")
    return root


def _context(kind: str) -> bytes:
    """The build context: the Dockerfile and the checkout's sources under kernel_env_src/ (no caches, no venv)."""
    root = _checkout()
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(dockerfile(kind), arcname="Dockerfile")
        for name in _SOURCES:
            if (root / name).exists():
                tar.add(root / name, arcname=f"kernel_env_src/{name}",
                        filter=lambda info: None if "__pycache__" in info.name or info.name.endswith(".pyc") else info)
    return data.getvalue()


def _base(kind: str) -> str:
    for line in dockerfile(kind).read_text().splitlines():
        if line.startswith("ARG BASE="):
            return line.split("=", 1)[1].strip()
    raise ImageBuildError(f"{dockerfile(kind)} has no `ARG BASE=` line")


def build_image(kind: str, *, tag: str | None = None, base: str | None = None, torch_spec: str | None = None,
                on_line: Callable[[str], None] = print) -> str:
    """Build one image (``cuda`` or ``cpu``) with the local engine; returns its tag.

    ``base`` replaces the Dockerfile's base image, ``torch_spec`` the pinned torch (a pip
    requirement). Build output goes to ``on_line``. Raises ImageBuildError when no engine
    answers, the base image cannot be pulled, or a build step fails.
    """
    import docker

    from kernel_env.sandbox.base import SandboxError
    from kernel_env.sandbox.docker import engine

    tag = tag or default_tag(kind)
    base = base or _base(kind)
    try:
        client = engine()
    except SandboxError as exc:
        raise ImageBuildError(str(exc)) from None
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        on_line(f"pulling the base image {base}")
        try:
            client.images.pull(base)
        except docker.errors.DockerException as exc:
            raise ImageBuildError(f"cannot pull the base image {base}: {_short(exc)}. This needs access to its registry "
                                  f"(or `docker load` it here first, or pass --base IMAGE with one this machine has).") from None
    buildargs = {"BASE": base, "TORCH_SPEC": torch_spec or DEFAULT_TORCH, "TORCH_INDEX_URL": TORCH_INDEX[kind]}
    try:
        stream = client.api.build(fileobj=io.BytesIO(_context(kind)), custom_context=True, tag=tag, buildargs=buildargs,
                                  rm=True, forcerm=True, pull=False, decode=True,
                                  labels={"kernel_env.image": kind})
        for chunk in stream:
            if "error" in chunk:
                raise ImageBuildError(f"building {tag} failed: {chunk['error'].strip()}")
            text = chunk.get("stream") or chunk.get("status") or ""
            for line in text.splitlines():
                if line.strip():
                    on_line(line.rstrip())
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"building {tag} failed: {_short(exc)}") from None
    return tag


def _short(exc: Exception) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip()
    return text if len(text) < 600 else text[:600] + " …"
