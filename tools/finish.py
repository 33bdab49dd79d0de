"""Finish: the agent says it is done; the environment then runs the trusted final evaluation."""

from __future__ import annotations

from pydantic import Field

from kernel_env.tools.base import Tool, ToolArgs, ToolContext, ToolResult


class FinishArgs(ToolArgs):
    summary: str = Field("", description="Optional: what the final solution does and how fast it was when you last profiled it.")


class Finish(Tool):
    name = "Finish"
    Args = FinishArgs
    description = """\
End the session. Call it once kernels/ and model_new.py hold your final solution: it is then rebuilt
from scratch and evaluated by the trusted harness (correctness on fresh inputs, then timing against
eager PyTorch and torch.compile), and that evaluation is your result. Nothing runs after Finish."""

    def run(self, args: FinishArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult(output="Finished: the final solution will now be built and evaluated.",
                          data={"finish": True, "summary": args.summary})
