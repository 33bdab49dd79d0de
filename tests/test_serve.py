"""``kernel-env serve`` end to end on the CPU: a real server process driven by openenv-core's own
client (``GenericEnvClient``, which knows nothing of kernel_env) and by the typed one
(``KernelEnvClient``), real sandboxes, the real pool and harness.

The task is relu(x + y) on 4096 elements in cpp, the protocol shortened (few timed calls, no
torch.compile baseline). The agents are scripted: most call Finish at once (kernels/ is empty, so
the final build fails: -1, the candidate's fault, in under a second), one writes the bundled cpp
solution first (its clean rebuild is most of this file's time). Each server gets a
KERNEL_ENV_HOME and a TMPDIR of its own, so what it leaves behind is its alone to answer for.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import bubblewrap_skip_reason

import kernel_env
from kernel_env.evaluators.records import EvalSettings
from kernel_env.resources import example_dir
from kernel_env.tools import tool_schemas

openenv = pytest.importorskip("openenv.core",
                              reason="the serve extra (pip install -e '.[serve]') is not installed")
GenericEnvClient = openenv.GenericEnvClient
from kernel_env.integrations.openenv_client import (
    KernelAgentAction,
    KernelEnvClient,
    KernelEnvObservation,
    KernelRefineAction,
    ServerError,
)

pytestmark = [pytest.mark.slow,  # end to end: real sandboxes, episodes and trusted evaluations
              pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")]

TASK_CODE = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 12")
SOLUTION = example_dir() / "solutions" / "cpp"
SETTINGS = EvalSettings.short().model_dump()
FINISH = {"name": "Finish", "arguments": {}}
ROOT = Path(__file__).resolve().parents[1]


def bash(command: str) -> KernelAgentAction:
    return KernelAgentAction(tool_calls=[{"name": "Bash", "arguments": {"command": command}}])


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    home: Path
    tmp: Path
    log: Path
    started: str  # the line it printed once listening

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=10) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as answer:  # 503 while draining
            return answer.code, json.load(answer)

    def client(self) -> GenericEnvClient:
        return GenericEnvClient(base_url=self.url, message_timeout_s=600)

    def typed(self) -> KernelEnvClient:
        return KernelEnvClient(base_url=self.url, message_timeout_s=600)

    def workspaces(self) -> list[Path]:
        folder = self.home / "workspaces"
        return sorted(folder.iterdir()) if folder.is_dir() else []

    def stop(self) -> int:
        """SIGTERM, and the exit code once it has drained."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def start_server(folder: Path, *options: str) -> Server:
    """``kernel-env serve`` on a free port, once it says where it listens."""
    home, tmp, log = folder / "home", folder / "tmp", folder / "server.log"
    tmp.mkdir(parents=True)
    task = folder / "relu_add_4k.py"
    task.write_text(TASK_CODE)
    argv = [sys.executable, "-m", "kernel_env.cli", "serve", "--port", "0", "--language", "cpp", "--device", "cpu",
            "--task", str(task), "--settings", json.dumps(SETTINGS), *options]
    with log.open("w") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   env={**os.environ, "KERNEL_ENV_HOME": str(home), "TMPDIR": str(tmp)})
    line = process.stdout.readline()
    if " listening on " not in line:
        process.kill()
        raise AssertionError(f"the server did not start: {line!r}\n{log.read_text()}")
    return Server(process, line.split(" listening on ")[1].split()[0], home, tmp, log, line)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """The local pool on the CPU, named (--devices cpu)."""
    running = start_server(tmp_path, "--max-sessions", "32", "--devices", "cpu")
    yield running
    running.process.kill()  # a no-op once the test drained it


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two sessions at most, and an episode idle for 2 s is closed."""
    running = start_server(tmp_path_factory.mktemp("small_server"), "--max-sessions", "2", "--idle-timeout", "2")
    yield running
    assert running.stop() == 0, running.log.read_text()


def post(server: Server, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as answer:
        return answer.code, json.load(answer)


def eventually(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def processes_mentioning(text: str) -> list[str]:
    """Processes whose command line or environment holds ``text`` (this server's home or temp folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if any(text.encode() in (entry / part).read_bytes() for part in ("cmdline", "environ")):
                    found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes().replace(b'\0', b' ')[:200]!r}")
            except OSError:  # gone, or not ours to read
                pass
    return found


# ----------------------------------------------------------------------------- episodes


async def finish_at_once(server: Server, index: int) -> tuple[KernelEnvObservation, KernelEnvObservation]:
    """Reset, one command in the session's own workspace, Finish (or truncate), on the typed client:
    the reset's and the last step's observations."""
    async with server.typed() as env:
        reset = await env.reset(episode_id=f"trivial-{index}")
        mine = await env.step(bash(f"echo {index} > mine.txt && cat *.txt"))
        assert mine.observation.text.strip() == str(index) and not mine.done
        state = await env.state()
        assert state.episode_id == f"trivial-{index}" and state.step_count == 1 and state.episode_open
        # Half of them end as a trainer whose budget ran out ends one: truncated, evaluated the same way.
        action = KernelAgentAction(truncate="the budget ran out") if index % 2 else KernelAgentAction(tool_calls=[FINISH])
        finish = await env.step(action)
        assert (finish.reward, finish.done) == (finish.observation.reward, finish.observation.done)
        return reset.observation, finish.observation


async def solve(server: Server) -> dict:
    """Write the bundled cpp solution (reading the starter first, as Write asks), then Finish."""
    files = {"model_new.py": SOLUTION / "model_new.py",
             **{f"kernels/{path.name}": path for path in (SOLUTION / "kernels").iterdir()}}
    async with server.client() as env:
        await env.reset()
        await env.step({"tool_calls": [{"name": "Read", "arguments": {"file_path": "model_new.py"}}]})
        writes = [{"name": "Write", "arguments": {"file_path": name, "content": path.read_text()}}
                  for name, path in files.items()]
        wrote = await env.step({"tool_calls": writes})
        assert not any(result["is_error"] for result in wrote.observation["info"]["tool_results"]), wrote.observation
        finish = await env.step({"tool_calls": [FINISH]})
        return {**finish.observation, "reward": finish.reward, "done": finish.done}


#: A client with nothing but websockets, killed by the test without closing its session: between
#: messages ("idle"), or with a step in flight ("step").
KILLED_CLIENT = """
import json, sys, time
from websockets.sync.client import connect

with connect(sys.argv[1].replace("http", "ws", 1) + "/ws") as ws:
    ws.send(json.dumps({"type": "reset", "data": {"episode_id": "killed-" + sys.argv[2]}}))
    assert json.loads(ws.recv())["type"] == "observation"
    if sys.argv[2] == "step":
        ws.send(json.dumps({"type": "step", "data": {"tool_calls": [{"name": "Bash", "arguments": {"command": "sleep 2"}}]}}))
    print("ready", flush=True)
    time.sleep(600)
"""


def kill_a_client(server: Server, when: str) -> None:
    client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, server.url, when], stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "ready"
    if when == "step":
        assert eventually(lambda: server.health()[1]["in_flight"] == 1)
    client.kill()
    client.wait()


def test_sixteen_concurrent_episodes_killed_clients_and_a_drain_leave_nothing_behind(server: Server):
    assert " (cpp on cpu, local sandbox, local pool on cpu) " in server.started
    assert server.health()[1]["pool_devices"] == ["cpu"]

    # Clients killed between messages and with a step in flight: each is one line on stderr, naming
    # its session; the episode is closed (once the step returns); nothing is sent to the dead client.
    for when in ("idle", "step"):
        kill_a_client(server, when)
        assert eventually(lambda: server.health()[1]["sessions"] == 0 and not server.workspaces()), server.health()
    dropped = [line for line in server.log.read_text().splitlines() if "the client went away" in line]
    assert len(dropped) == 2, server.log.read_text()
    assert "(episode killed-idle of " in dropped[0] and "went away without closing it" in dropped[0]
    assert "(episode killed-step of " in dropped[1] and "before the answer to its last message" in dropped[1]
    assert "Traceback" not in server.log.read_text()

    async def episodes():
        return await asyncio.gather(solve(server), *(finish_at_once(server, i) for i in range(15)))

    solved, *trivial = asyncio.run(episodes())
    assert solved["done"] and solved["terminated"] and solved["info"]["final"]["correct"], solved["info"].get("final")
    assert solved["reward"] == solved["info"]["final"]["reward"] >= 1.0 and solved["info"]["fault"] is None
    assert "FINAL EVALUATION" in solved["text"] and solved["info"]["rollout"]["tool_calls"]["Write"] == 3
    for index, (reset, finish) in enumerate(trivial):
        assert reset.info["tools"] == tool_schemas() and "# Task " in reset.text  # the schemas in-process has
        assert finish.done and finish.reward == -1.0
        assert (finish.terminated, finish.truncated) == ((False, True) if index % 2 else (True, False))
        assert finish.info["fault"] == "candidate" and finish.info["final"]["mode"] == "final"
    assert eventually(lambda: [server.health()[1][key] for key in ("sessions", "episodes", "in_flight")] == [0, 0, 0])
    assert not server.workspaces()

    # The drain: the step in flight runs on and is answered; a new session is refused; the server exits 0.
    async def drain() -> tuple[str, ServerError, tuple[int, dict]]:
        async with server.typed() as env:
            await env.reset()
            step = asyncio.create_task(env.step(bash("sleep 3; echo ran to its end")))
            assert await asyncio.to_thread(eventually, lambda: server.health()[1]["in_flight"] == 1)
            server.process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(eventually, lambda: server.health()[0] == 503)
            async with server.typed() as late:
                with pytest.raises(ServerError) as refused:
                    await late.reset()
            http = await asyncio.to_thread(post, server, "/reset", {})
            return (await step).observation.text, refused.value, http

    answered, refusal, (http_status, http_refusal) = asyncio.run(drain())
    assert answered.strip() == "ran to its end"
    assert refusal.code == "SERVER_DRAINING" and "shutting down" in refusal.message
    assert http_status == 503 and http_refusal["code"] == "SERVER_DRAINING" and "shutting down" in http_refusal["detail"]
    assert server.process.wait(timeout=120) == 0, server.log.read_text()
    assert "drained in" in server.log.read_text() and "Traceback" not in server.log.read_text()
    assert len([line for line in server.log.read_text().splitlines() if "went away" in line]) == 2
    assert not server.workspaces() and not list(server.tmp.glob("ke-broker-*"))
    assert eventually(lambda: not processes_mentioning(str(server.home)) and not processes_mentioning(str(server.tmp)),
                      timeout=10), processes_mentioning(str(server.home)) + processes_mentioning(str(server.tmp))


# ----------------------------------------------------------------------------- limits


def test_a_session_over_the_limit_is_refused_until_one_closes(small_server: Server):
    async def main() -> ServerError:
        first, second = small_server.client(), small_server.client()
        await first.reset()
        await second.reset()
        async with small_server.typed() as third:
            with pytest.raises(ServerError) as refused:
                await third.reset()
        await first.close()
        assert await asyncio.to_thread(eventually, lambda: small_server.health()[1]["sessions"] == 1)
        async with small_server.client() as fourth:
            assert "# Task " in (await fourth.reset()).observation["text"]
        await second.close()
        return refused.value

    refusal = asyncio.run(main())
    assert refusal.code == "CAPACITY_REACHED" and "2/2 sessions" in refusal.message
    assert str(refusal).endswith("(code: CAPACITY_REACHED)")  # a RuntimeError with openenv-core's text
    assert eventually(lambda: not small_server.workspaces())


def test_an_idle_episode_is_closed_but_a_long_step_is_not_idle(small_server: Server):
    with small_server.typed().sync() as env:  # the typed client without await
        env.reset()
        long = env.step(bash("sleep 4; echo still here"))  # twice the idle timeout, and not idle
        assert long.observation.text.strip() == "still here" and env.state().episode_open
        assert eventually(lambda: not small_server.workspaces())
        assert not env.state().episode_open
        with pytest.raises(ServerError) as refused:
            env.step(bash("true"))
        again = env.reset()  # a reset starts a new episode
    assert refused.value.code == "SESSION_IDLE_TIMEOUT"
    assert "closed after 2 s without a message" in refused.value.message and "reset to start" in refused.value.message
    assert "# Task " in again.observation.text
    assert eventually(lambda: not small_server.workspaces())


def test_the_stateless_http_transport_answers_with_a_fresh_environment_each_time(small_server: Server):
    status, reset = post(small_server, "/reset", {"seed": 1})
    assert status == 200 and "# Task " in reset["observation"]["text"] and reset["done"] is False
    assert reset["observation"]["info"]["tools"] == tool_schemas()
    status, step = post(small_server, "/step", {"action": {"tool_calls": [FINISH]}})  # a fresh environment: no episode
    assert status == 200 and step["done"] is True and step["observation"]["text"].startswith("The episode has ended")
    with urllib.request.urlopen(f"{small_server.url}/schema", timeout=10) as answer:
        schema = json.load(answer)
    # The types the typed client parses with are the server's.
    assert schema["action"] == KernelAgentAction.model_json_schema()
    assert schema["observation"] == KernelEnvObservation.model_json_schema()
    assert not small_server.workspaces()  # the reset's episode closed with its request


# ----------------------------------------------------------------------------- the refine loop, the command line


def test_kernel_refine_is_served_with_a_completion_as_the_action(tmp_path: Path):
    server = start_server(tmp_path, "--env", "refine", "--max-turns", "1")

    async def main():
        async with server.typed() as env:
            reset = await env.reset()
            return reset, await env.step(KernelRefineAction(content="I would rather think about it first."))

    try:
        reset, answer = asyncio.run(main())
        assert [message["role"] for message in reset.observation.info["messages"]] == ["system", "user"]
        assert answer.done and answer.observation.truncated and answer.reward == -1.0
        assert answer.observation.info["stop_reason"] == "max_turns_reached" and answer.observation.info["trace"]
    finally:
        assert server.stop() == 0, server.log.read_text()


@pytest.mark.parametrize("options, message", [
    (["--pool", "slurm"], "unknown --pool 'slurm'"),
    (["--language", "cuda", "--device", "cpu"], "cuda kernels need a CUDA GPU"),
    (["--devices", "cpu,cuda:7"], "this machine has no device 'cuda:7' (it has cpu"),
])
def test_usage_errors_exit_2_with_the_reason(options, message):
    run = subprocess.run([sys.executable, "-m", "kernel_env.cli", "serve", "--port", "0", *options], check=False,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and message in run.stderr, run.stderr


@pytest.mark.parametrize("server_options, message", [
    ({"pool": "ray", "devices": ["cpu"]}, "--devices chooses the local pool's devices; a ray pool (--pool ray)"),
    ({"devices": ["cpu", "cpu"]}, "--devices cpu,cpu: name each device once"),
])
def test_pool_devices_are_the_machines_each_once_and_never_with_a_ray_pool(server_options, message):
    from kernel_env.integrations.openenv import KernelEnvServer, check_pool_devices

    with pytest.raises(ValueError) as refused:
        KernelEnvServer(language="cpp", device="cpu", **server_options)
    assert message in str(refused.value)
    with pytest.raises(ValueError, match="the episodes evaluate on cuda, and none of these is a cuda device"):
        check_pool_devices(["cpu"], "cuda")


# ----------------------------------------------------------------------------- the manifest


def test_the_openenv_manifest_names_what_the_code_has():
    import yaml  # openenv-core's, as uvicorn is
    from uvicorn.importer import import_from_string

    from kernel_env.cli.serve import serve
    from kernel_env.integrations import openenv_client
    from kernel_env.integrations.openenv import ENVIRONMENTS

    manifest = yaml.safe_load((ROOT / "openenv.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert manifest["spec_version"] == 1 and manifest["name"] == "kernel_env"
    assert manifest["version"] == version == kernel_env.__version__
    assert manifest["port"] == inspect.signature(serve).parameters["port"].default.default
    client = manifest["client"]
    assert client["module"] == openenv_client.__name__ and client["class_name"] == KernelEnvClient.__name__
    assert getattr(openenv_client, manifest["action"]) is ENVIRONMENTS["agent"][1] is KernelAgentAction
    assert getattr(openenv_client, manifest["observation"]) is KernelEnvObservation
    # The app it names serves: built here with the defaults (the process's shared pool), not run.
    app = import_from_string(manifest["app"])
    assert {"/ws", "/reset", "/step", "/health"} <= {route.path for route in app.routes}
