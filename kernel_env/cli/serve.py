"""``kernel-env serve``: KernelAgent-v0 (or KernelRefine-v0) as an OpenEnv environment server.

The server is ``kernel_env.integrations.openenv`` (the optional extra kernel_env[serve]):
openenv-core's HTTP and WebSocket protocol, an environment per session over this process's one
evaluation pool, a session limit, idle timeouts, ``/health``, and a drain on SIGTERM or SIGINT.
Prints where it listens on stdout once it accepts connections; on stderr, a line for each client
gone without closing its session, and one when it has drained. Exit codes: 0 drained and stopped;
2 usage or environment error (the extra missing, bad options, a language the device cannot run,
pool devices this machine has not, an address that cannot be listened on).
"""

from __future__ import annotations

import enum
import logging

import typer
from rich.markup import escape

from kernel_env.cli import options
from kernel_env.cli.common import EXIT_OK, err, fail, out
from kernel_env.cli.sources import resolve
from kernel_env.config import DEFAULT_POOL, DEFAULT_SANDBOX


class EnvName(str, enum.Enum):
    agent = "agent"
    refine = "refine"


def serve(
    env: EnvName = typer.Option(EnvName.agent, "--env", help="agent: KernelAgent-v0 (tool calls); refine: "
                                                            "KernelRefine-v0 (completions answered with feedback)."),
    task: str | None = typer.Option(None, "--task", help="The task of an episode whose reset names none "
                                                        "(example/relu_add, a task .py, FILE.jsonl#ID, "
                                                        "kernelbench/L<level>/<id>; default: none, every reset "
                                                        "names its task)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; the server "
                                                         "trusts its clients, keep it on a private network)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: a free one, printed)."),
    max_sessions: int = typer.Option(64, "--max-sessions", min=1, help="WebSocket sessions at once; one more is "
                                                                       "refused (CAPACITY_REACHED)."),
    idle_timeout: float = typer.Option(1800.0, "--idle-timeout", min=0.0, help="Seconds without a message after "
                                                                               "which a session's episode is closed, "
                                                                               "its sandbox and workspace freed "
                                                                               "(0: never)."),
    drain_grace: float = typer.Option(60.0, "--drain-grace", min=0.0, help="On SIGTERM, seconds the steps in flight "
                                                                           "may run on and be answered; then every "
                                                                           "connection and episode is closed."),
    max_turns: int | None = typer.Option(None, "--max-turns", min=1, help="Steps per episode (default: the "
                                                                          "environment's: agent 150, refine 4)."),
    language: options.LanguageOrAuto = None,
    device: options.Device = None,
    sandbox: options.Sandbox = options.SandboxKind(DEFAULT_SANDBOX),
    pool: str = typer.Option(DEFAULT_POOL, "--pool", help="Evaluation pool, one for every session: local (this "
                                                     "machine's GPUs, or its CPU) or ray (a Ray cluster: ray.init's "
                                                     "default address)."),
    devices: str | None = typer.Option(None, "--devices", help="The local pool's devices, e.g. cuda:1,cuda:2 "
                                                               "(default: every visible GPU, else the CPU): keep "
                                                               "the evaluations off the trainer's GPUs."),
    settings_json: options.Settings = None,
    kernelbench: options.KernelBench = None,
) -> None:
    """Serve KernelAgent-v0 (or KernelRefine-v0) over OpenEnv's HTTP and WebSocket protocol until SIGTERM."""
    if pool not in ("local", "ray"):
        fail(f"unknown --pool {pool!r}; choose local or ray")
    settings = options.parse_settings(settings_json)
    default_task = resolve(task, kernelbench) if task is not None else None
    try:
        from kernel_env.integrations.openenv import KernelEnvServer, listen
    except ModuleNotFoundError as exc:
        fail(f"kernel-env serve needs its extra ({exc.name or exc} is missing): pip install -e '.[serve]' "
             "(in the checkout)")
    from kernel_env.runtime.episode import EpisodeError

    env_options = {"task": default_task, "language": language.value if language else None,
                   "device": device.value if device else None, "sandbox": sandbox.value, "settings": settings,
                   "kernelbench_root": str(kernelbench) if kernelbench else None}
    if max_turns is not None:
        env_options["max_turns"] = max_turns
    try:
        server = KernelEnvServer(env.value, max_sessions=max_sessions, idle_timeout_s=idle_timeout or None,
                                 drain_grace_s=drain_grace, pool=pool,
                                 devices=devices.split(",") if devices is not None else None, **env_options)
    except (EpisodeError, ValueError) as exc:
        fail(str(exc))
    try:
        sock = listen(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kernel_env.integrations.openenv").setLevel(logging.INFO)

    def listening(url: str) -> None:
        idle = f"idle timeout {idle_timeout:g} s" if idle_timeout else "no idle timeout"
        named = escape(default_task.id) if default_task else "each reset names one"
        on = f" on {', '.join(server.pool_devices)}" if server.pool_devices else ""
        out.print(f"kernel-env serve: {server.name} ({server.language} on {server.device}, {sandbox.value} sandbox, "
                  f"{pool} pool{on}) listening on {url} (WebSocket sessions at {url.replace('http', 'ws', 1)}/ws); "
                  f"at most {max_sessions} sessions, {idle}; task: {named}", soft_wrap=True)

    report = server.run(sock, on_listening=listening)
    cut = f"; {report.steps_cut} step(s) were still running at the end of the {drain_grace:g} s grace" \
        if report.steps_cut else ""
    err.print(f"kernel-env serve: drained in {report.seconds:.1f} s, {report.episodes} open episode(s) closed{cut}",
              soft_wrap=True)
    raise typer.Exit(EXIT_OK)
