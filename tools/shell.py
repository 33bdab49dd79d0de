"""Bash, BashOutput, KillBash: the agent's persistent shell and its background jobs.

Commands run through ``Sandbox.exec`` (one persistent session: cwd, variables, functions and
aliases carry over) or ``Sandbox.start_background``. These tools never run anything on the
host and never interpret the command: quoting and isolation are the sandbox's job.
"""

from __future__ import annotations

import re

from pydantic import Field

from kernel_env.tools.base import Tool, ToolArgs, ToolContext, ToolError, ToolResult, plural
from kernel_env.sandbox.base import BackgroundJob

DEFAULT_TIMEOUT_MS = 120_000
MAX_TIMEOUT_MS = 600_000


class BashArgs(ToolArgs):
    command: str = Field(description="The command to run (bash). Quote paths that contain spaces.")
    timeout: int | None = Field(
        None, ge=1, le=MAX_TIMEOUT_MS,
        description=f"Timeout in milliseconds (default {DEFAULT_TIMEOUT_MS}, at most {MAX_TIMEOUT_MS}).",
    )
    description: str | None = Field(None, description="A short (5-10 word) description of what the command does.")
    run_in_background: bool = Field(
        False, description="Run the command in the background and return its id at once; read its output with BashOutput."
    )


class Bash(Tool):
    name = "Bash"
    Args = BashArgs
    description = f"""\
Run a bash command in a persistent shell session inside the sandbox. The working directory,
environment variables, functions and aliases persist between calls; the session starts in the
workspace. There is no network access.
- Compile with `bash utils/compile.sh`; check correctness with `python3 -m utils.verification`;
  time with `python3 -m utils.profiling`.
- A command is killed after `timeout` ms (default {DEFAULT_TIMEOUT_MS // 1000} s, max {MAX_TIMEOUT_MS // 1000} s). For long-running
  commands (servers, long builds) set run_in_background and poll with BashOutput.
- Output (stdout and stderr together) is truncated in the middle when very long; the exit code is
  shown when it is not 0.
- Prefer Read, Edit, Write, Glob and Grep over cat, sed, echo > file, find and grep."""

    def run(self, args: BashArgs, ctx: ToolContext) -> ToolResult:
        if not args.command.strip():
            raise ToolError("the command is empty")
        if args.run_in_background:
            job_id = ctx.sandbox.start_background(args.command)
            ctx.background_jobs[job_id] = args.command
            return ToolResult(
                output=(f"Started background job {job_id}. Read its output with BashOutput(bash_id={job_id!r}); "
                        f"stop it with KillBash(shell_id={job_id!r})."),
                data={"bash_id": job_id, "background": True},
            )

        timeout_ms = args.timeout or DEFAULT_TIMEOUT_MS
        # Leave room for our status lines so the result is not cut a second time.
        result = ctx.sandbox.exec(args.command, timeout=timeout_ms / 1000, max_output=max(1_000, ctx.max_output_chars - 300))
        lines = [result.output.rstrip("\n")] if result.output.strip() else []
        if result.timed_out:
            lines.append(
                f"[timed out after {timeout_ms / 1000:g} s; the command was killed. "
                "Use run_in_background=true for commands that take longer, or raise timeout (max "
                f"{MAX_TIMEOUT_MS // 1000} s).]"
            )
        elif result.exit_code is None:
            lines.append("[the command was killed]")
        elif result.exit_code != 0:
            lines.append(f"[exit code {result.exit_code}]")
        if result.note:
            lines.append(f"[note: {result.note}]")
        if not lines:
            lines.append("(no output)")
        return ToolResult(
            output="\n".join(lines),
            data={
                "exit_code": result.exit_code, "timed_out": result.timed_out, "truncated": result.truncated,
                "output_bytes": result.output_bytes, "duration_s": result.duration_s,
            },
        )


class BashOutputArgs(ToolArgs):
    bash_id: str = Field(description="The id of the background job (returned by Bash with run_in_background).")
    filter: str | None = Field(
        None, description="Optional regular expression: only new output lines matching it are shown (the others are discarded)."
    )


class BashOutput(Tool):
    name = "BashOutput"
    Args = BashOutputArgs
    description = """\
Read the output a background job (started by Bash with run_in_background) wrote since the last
BashOutput call for it, and whether it is still running or its exit code."""

    def run(self, args: BashOutputArgs, ctx: ToolContext) -> ToolResult:
        pattern = _compile_filter(args.filter)
        job = ctx.sandbox.background_output(args.bash_id.strip(), max_output=max(1_000, ctx.max_output_chars - 300))
        return _render_job(job, pattern, header=None)


class KillBashArgs(ToolArgs):
    shell_id: str = Field(description="The id of the background job to kill.")


class KillBash(Tool):
    name = "KillBash"
    Args = KillBashArgs
    description = "Kill a background job started by Bash with run_in_background (its whole process group), and show its last output."

    def run(self, args: KillBashArgs, ctx: ToolContext) -> ToolResult:
        job_id = args.shell_id.strip()
        before = ctx.sandbox.background_output(job_id, max_output=max(1_000, ctx.max_output_chars - 300))
        if not before.running:
            result = _render_job(before, None, header=f"Job {job_id} had already finished (exit code {before.exit_code}); nothing to kill.")
            return result
        job = ctx.sandbox.kill_background(job_id)
        combined = BackgroundJob(
            job_id=job.job_id, command=job.command, running=job.running, exit_code=job.exit_code,
            new_output=before.new_output + job.new_output, truncated=before.truncated or job.truncated,
        )
        return _render_job(combined, None, header=f"Killed background job {job_id}.")


def _compile_filter(pattern: str | None) -> re.Pattern[str] | None:
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"filter {pattern!r} is not a valid regular expression: {exc}") from None


def _render_job(job: BackgroundJob, pattern: re.Pattern[str] | None, header: str | None) -> ToolResult:
    if job.running:
        status = "running"
    elif job.exit_code is None or job.exit_code < 0:
        status = "killed"
    else:
        status = f"exited with code {job.exit_code}"
    output = job.new_output
    shown_lines = None
    if pattern is not None:
        kept = [line for line in output.splitlines() if pattern.search(line)]
        shown_lines = len(kept)
        output = "\n".join(kept)
    parts = [header] if header else []
    parts.append(f"[job {job.job_id}: {status}]")
    if output.strip():
        parts.append(output.rstrip("\n"))
    else:
        parts.append("(no new output matching the filter)" if pattern is not None else "(no new output)")
    if pattern is not None:
        parts.append(f"[filter kept {plural(shown_lines or 0, 'line')}]")
    return ToolResult(
        output="\n".join(parts),
        data={"bash_id": job.job_id, "running": job.running, "exit_code": job.exit_code, "truncated": job.truncated},
    )
