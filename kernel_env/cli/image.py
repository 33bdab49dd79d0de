"""``kernel-env image build cuda|cpu``: the images of sandbox_images/ for the docker sandbox and GPU workers.

The build is ``kernel_env.sandbox.images.build_image``; its log goes to stderr and the tag to
stdout. The docker sandbox's default image needs no build.
"""

from __future__ import annotations

import enum

import typer
from rich.markup import escape

from kernel_env.cli.common import Command, Group, err, fail, out

app = typer.Typer(help="Container images for the docker sandbox and GPU workers (sandbox_images/).",
                  no_args_is_help=True, cls=Group)
ImageKind = enum.Enum("ImageKind", {"cuda": "cuda", "cpu": "cpu"}, type=str)


@app.command("build", cls=Command)
def build(
    kind: ImageKind = typer.Argument(..., help="cuda (CUDA devel base: sandboxes and GPU workers) or cpu."),
    tag: str | None = typer.Option(None, "--tag", help="Image tag (default: kernel_env/<kind>:<version>)."),
    base: str | None = typer.Option(None, "--base", help="Base image instead of the Dockerfile's (pulled if not here)."),
    torch: str | None = typer.Option(None, "--torch", help="pip requirement for torch instead of the pin (torch==2.13.0)."),
) -> None:
    """Build an image with the local Docker engine; prints its tag. Use it with DockerSandbox(image=TAG)."""
    from kernel_env.sandbox.images import ImageBuildError, build_image

    try:
        built = build_image(kind.value, tag=tag, base=base, torch_spec=torch,
                            on_line=lambda line: err.print(escape(line), soft_wrap=True))
    except ImageBuildError as exc:
        fail(str(exc))
    out.print(built)
