"""The trainer recipes of examples/train/ (prime_rl/, skyrl/, verl/) on the CPU: each recipe's own files
(TOMLs, launch scripts, data scripts, the verl agent loop) fed to the framework's own code as far as
this machine goes, and one real KernelAgent-v0 episode per framework, paid by the trusted final
evaluation (the task relu(x + y) at 4096 elements, cpp, the shortened protocol).

The episodes are the cheapest honest ones: the scripted model calls Finish with kernels/ empty, the
final build fails and the episode pays -1 (the candidate's fault), in about a second. What the
episodes change from a recipe for this machine is named where it happens (its task, the shortened
protocol, and language, device and pool where the recipe names the GPU's).

Without the frameworks (CI installs none of them) the checks that need only kernel_env's extras run:
the TOMLs' shape and their env arguments through ``verifiers.load_environment`` and a rollout, and
SkyRL's data set and options through ``skyrl_gym.make`` and an episode. With them on the path (the
recipes' README.md say how: skyrl 0.4.0, verl 0.9.1, prime-rl v0.8.1.dev7's configs and env server
with its verifiers) the rest runs: prime-rl's config classes and its own env-server process, SkyRL's
config and its generator's agent loop, verl's hydra config and the agent loop against ``kernel-env serve``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import skyrl_gym
import verifiers as vf
from scripted_llm import Reply, ScriptedLLM
from support import bubblewrap_skip_reason
from test_trainer_adapters import API_KEY_VAR, SETTINGS, call, evaluate, hermes

from kernel_env.resources import example_dir

pytestmark = [pytest.mark.slow,  # end to end: real sandboxes, episodes and trusted evaluations
              pytest.mark.skipif(bool(bubblewrap_skip_reason()), reason=bubblewrap_skip_reason() or "")]

RECIPES = Path(__file__).resolve().parents[1] / "examples" / "train"
TASK_CODE = (example_dir() / "task.py").read_text().replace("1 << 24", "1 << 12")
FINISH = call("Finish")
#: What this machine runs in place of a recipe's GPU options.
CPU = {"language": "cpp", "device": "cpu", "pool": "local"}


def load(path: Path, name: str) -> ModuleType:
    """A recipe's Python file as a module (the recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launched_arguments(script: Path, tmp_path: Path, **env: str) -> list[str]:
    """The arguments a launch script hands its trainer: the script run by bash with ``PYTHON`` a
    program that writes them down."""
    record = tmp_path / f"{script.stem}.argv.json"
    recorder = tmp_path / "record_argv"
    recorder.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    recorder.chmod(0o755)
    subprocess.run(["bash", str(script)], env={**os.environ, "PYTHON": str(recorder), **env}, check=True, timeout=60)
    return json.loads(record.read_text())


def options_of(overrides: list[str], prefix: str) -> dict[str, str]:
    """The key=value overrides under ``prefix.``, the later winning (as SkyRL and hydra read them)."""
    found = {}
    for override in overrides:
        key, _, value = override.partition("=")
        if key.startswith(prefix + "."):
            found[key[len(prefix) + 1:]] = value
    return found


def runs(mask: list[int]) -> list[tuple[int, object]]:
    """A mask as (value, length) runs, the length of a run of 0s left out (``...``): how long the
    environment's answer renders depends on the tokenizer."""
    found: list[list[int]] = []
    for value in mask:
        if found and found[-1][0] == value:
            found[-1][1] += 1
        else:
            found.append([value, 1])
    return [(value, length if value else ...) for value, length in found]


def toml(*names: str) -> dict:
    """prime_rl/ TOML files merged as prime-rl's ``@ a.toml @ b.toml`` merges them (tables deeply)."""
    def merge(base: dict, extra: dict) -> dict:
        return {**base, **{key: merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict)
                           else value for key, value in extra.items()}}
    merged: dict = {}
    for name in names:
        merged = merge(merged, tomllib.loads((RECIPES / "prime_rl" / name).read_text()))
    return merged


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "relu_add_4k.py"
    path.write_text(TASK_CODE)
    return path


@pytest.fixture(autouse=True)
def _api_key(monkeypatch):
    monkeypatch.setenv(API_KEY_VAR, "test")


@pytest.fixture(scope="module")
def tiny() -> tuple[object, list[list[int]]]:
    """The tiny tokenizer of examples/train/trl_grpo.py (whole tool calls are single tokens, other text
    reads as [UNK]) with a Read call added, and a scripted model's three replies in it: Read model.py,
    text without a call, Finish (each ending with the end-of-turn token)."""
    pytest.importorskip("trl", reason="the train extra (pip install 'kernel_env[train]') is not installed")
    trl_grpo = load(RECIPES / "trl_grpo.py", "trl_grpo")
    tokenizer = trl_grpo.tiny_model()[1]
    read, finish = trl_grpo.tool_call("Read", file_path="model.py"), trl_grpo.tool_call("Finish", summary="")
    tokenizer.add_tokens([read])
    replies = [tokenizer.convert_tokens_to_ids(read), tokenizer.unk_token_id, tokenizer.convert_tokens_to_ids(finish)]
    return tokenizer, [[reply, tokenizer.eos_token_id] for reply in replies]


# ----------------------------------------------------------------------------- prime-rl


@pytest.mark.parametrize(("run_files", "server_files"), [
    (("rl.toml",), ("env_server.toml",)),
    (("rl.toml", "tiny.toml"), ("env_server.toml", "env_server_tiny.toml")),
], ids=["full", "tiny"])
def test_prime_rl_run_and_env_server_agree_on_the_classic_env_and_its_address(run_files, server_files):
    run, server = toml(*run_files), toml(*server_files)
    [source] = run["orchestrator"]["train"]["source"]
    assert source["legacy"]["id"] == server["legacy"]["id"] == "kernel_env.integrations.verifiers"
    assert source["serve"]["address"] == server["serve"]["address"]
    # What prime-rl's launcher would hand a server it started (max_seq_len = seq_len), set by hand.
    assert server["legacy"]["extra_env_kwargs"]["max_seq_len"] == run["seq_len"]
    assert server["serve"]["pool"] == {"type": "static", "num_workers": 1}


def test_prime_rls_config_classes_accept_the_recipe():
    configs = pytest.importorskip("prime_rl.configs.rl", reason="prime-rl's configs (v0.8.1.dev7) are not installed")
    from prime_rl.configs.env_server import EnvServerConfig
    from prime_rl.utils.config import cli

    folder = RECIPES / "prime_rl"
    run = cli(configs.RLConfig, args=["@", str(folder / "rl.toml"), "@", str(folder / "tiny.toml")])
    [source] = run.orchestrator.train.source
    assert source.is_legacy and source.legacy.id == "kernel_env.integrations.verifiers"
    assert run.orchestrator.env_addresses == {("train", "kernel-env"): "tcp://127.0.0.1:5000"}
    assert run.model.name == "Qwen/Qwen3-0.6B" and run.max_steps == 2
    server = cli(EnvServerConfig, args=["@", str(folder / "env_server.toml"), "@", str(folder / "env_server_tiny.toml")])
    assert server.is_legacy and server.legacy.args == {"tasks": "examples", "max_turns": 20, "selection": "best"}
    assert server.legacy.extra_env_kwargs == {"max_seq_len": run.seq_len, "timeout_seconds": 1800}
    with pytest.raises(Exception, match="Extra inputs are not permitted"):  # prime-rl's config is strict
        cli(configs.RLConfig, args=["@", str(folder / "rl.toml"), "--orchestrator.bogus", "1"])


def test_prime_rls_launcher_resolves_the_run_into_vllm_trainer_and_orchestrator_configs(tmp_path):
    """``rl @ rl.toml --dry-run``: prime-rl's launcher writes each process's config and stops. vLLM's is
    there (the launcher starts it only for an ``[inference]`` table); no env server's (it is external)."""
    pytest.importorskip("prime_rl.entrypoints.rl", reason="prime-rl's launcher (v0.8.1.dev7) is not installed")
    subprocess.run([sys.executable, "-m", "prime_rl.entrypoints.rl", "@", str(RECIPES / "prime_rl" / "rl.toml"),
                    "--dry-run", "--output-dir", str(tmp_path)], check=True, capture_output=True, timeout=120)
    configs = tmp_path / "configs"
    assert sorted(path.name for path in configs.iterdir()) == ["inference.toml", "orchestrator.toml", "trainer.toml"]
    assert tomllib.loads((configs / "inference.toml").read_text())["vllm"]["model"] == "Qwen/Qwen3-8B"
    [source] = tomllib.loads((configs / "orchestrator.toml").read_text())["train"]["source"]
    assert source["legacy"]["id"] == "kernel_env.integrations.verifiers"
    assert source["serve"]["address"] == "tcp://127.0.0.1:5000"


def test_the_env_servers_arguments_load_the_environment_and_a_rollout_is_paid(task_file):
    """What prime-rl's legacy bridge does with env_server.toml (verifiers/v1/legacy.py): load the
    environment by its id and arguments, then ``set_kwargs`` the extra ones. Changed for this machine:
    the task and the shortened protocol."""
    legacy = toml("env_server.toml")["legacy"]
    env = vf.load_environment(legacy["id"], **{**legacy["args"], "tasks": [str(task_file)],
                                               "settings": SETTINGS.model_dump()})
    env.set_kwargs(**legacy["extra_env_kwargs"])
    assert env.max_seq_len == legacy["extra_env_kwargs"]["max_seq_len"]
    assert env.agent_options["max_turns"] == legacy["args"]["max_turns"] == 150
    with ScriptedLLM.sequence([Reply(tool_calls=[FINISH])]) as llm:
        output = evaluate(env, llm)
    final = output["kernel_env_info"]["final"]
    assert output["error"] is None and final["mode"] == "final" and not final["correct"]
    assert output["reward"] == -1.0 and output["kernel_env_info"]["fault"] == "candidate"


def test_prime_rls_env_server_serves_the_recipe_and_its_rollout_is_paid(tmp_path, task_file):
    """prime-rl's own ``env-server`` process (``python -m prime_rl.entrypoints.env_server @ env_server.toml``)
    driven by the client its orchestrator uses (verifiers' v1 ``EnvClient``), the model a scripted
    chat server (an eval client: the training one needs vLLM's token endpoint)."""
    pytest.importorskip("prime_rl.entrypoints.env_server", reason="prime-rl's env server (v0.8.1.dev7) is not installed")
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.serve.client import EnvClient
    from verifiers.v1.types import SamplingConfig

    with socket.socket() as probe:  # a free port for the server's ZMQ socket
        probe.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    machine = tmp_path / "this_machine.toml"
    settings = "\n".join(f"{key} = {json.dumps(value)}" for key, value in SETTINGS.model_dump().items()
                         if value is not None)
    machine.write_text(f'[legacy.args]\ntasks = ["{task_file}"]\n[legacy.args.settings]\n{settings}\n'
                       f'[serve]\naddress = "{address}"\n')
    log = tmp_path / "env_server.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "prime_rl.entrypoints.env_server",
                                   "@", str(RECIPES / "prime_rl" / "env_server.toml"), "@", str(machine)],
                                  stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp_path)})

    async def rollout(llm: ScriptedLLM):
        client = EnvClient(address)
        try:
            await client.wait_for_server_startup()
            info = await client.info()
            episode = await client.run(client=EvalClientConfig(base_url=llm.base_url, api_key_var=API_KEY_VAR),
                                       model=llm.model, sampling=SamplingConfig(), task_idx=0)
            return info, episode
        finally:
            await client.close()

    try:
        with ScriptedLLM.sequence([Reply(tool_calls=[FINISH])]) as llm:
            info, episode = asyncio.run(asyncio.wait_for(rollout(llm), timeout=120))
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert info.num_tasks == 1 and not info.requires_group_scoring, log.read_text()[-3000:]
    [trace] = episode.traces
    assert episode.ok and trace.ok, log.read_text()[-3000:]
    assert trace.rewards["reward"].score == -1.0 and trace.metrics["correct"] == 0.0


# ----------------------------------------------------------------------------- SkyRL


@pytest.fixture
def skyrl_row(tmp_path, task_file) -> dict:
    """A row of the Parquet file skyrl/prepare_data.py writes, read back as SkyRL reads it."""
    import datasets

    output = tmp_path / "data" / "train.parquet"
    assert load(RECIPES / "skyrl" / "prepare_data.py", "skyrl_prepare_data").main(
        ["--tasks", str(task_file), "--output", str(output)]) == 0
    [row] = datasets.load_dataset("parquet", data_files=str(output), split="train")
    return row


def test_skyrls_launch_scripts_name_the_env_and_its_options(tmp_path):
    full = launched_arguments(RECIPES / "skyrl" / "run_kernel_agent.sh", tmp_path)
    smallest = launched_arguments(RECIPES / "skyrl" / "run_tiny.sh", tmp_path)
    assert full[0].endswith("main_kernel_agent.py") and smallest[0] == full[0]
    for overrides in (full, smallest):
        assert "environment.env_class=kernel_agent" in overrides and "generator.batched=false" in overrides
        assert options_of(overrides, "environment.skyrl_gym.kernel_agent") == {
            "language": "cuda", "device": "cuda", "pool": "ray", "selection": "best"}
    assert options_of(smallest, "generator")["max_turns"] == "10" and options_of(full, "generator")["max_turns"] == "50"


def test_skyrl_data_rows_make_the_env_and_an_episode_is_paid_by_the_final_evaluation(tmp_path, skyrl_row):
    """The Parquet row and run_kernel_agent.sh's options through ``skyrl_gym.make``, as SkyRL's
    generator makes each environment. Changed for this machine: language, device, pool, protocol."""
    options = options_of(launched_arguments(RECIPES / "skyrl" / "run_kernel_agent.sh", tmp_path),
                         "environment.skyrl_gym.kernel_agent")
    extras = {key: value for key, value in skyrl_row.items() if key not in ("prompt", "env_class")}
    env = skyrl_gym.make(skyrl_row["env_class"], env_config={**options, **CPU, "settings": SETTINGS.model_dump()},
                         extras={**extras, "max_turns": 50})
    try:
        prompt, _ = env.init(skyrl_row["prompt"])
        assert TASK_CODE.strip() in prompt[-1]["content"] and env.max_turns == 50
        done = env.step(hermes(FINISH))
        final = done["metadata"]["final"]
        assert done["done"] and final["mode"] == "final" and not final["correct"] and done["reward"] == -1.0
    finally:
        env.close()


@pytest.fixture(scope="module")
def skyrl_entrypoint() -> ModuleType:
    pytest.importorskip("skyrl.train.config", reason="skyrl (skyrl-train 0.4.0) is not installed")
    return load(RECIPES / "skyrl" / "main_kernel_agent.py", "skyrl_main_kernel_agent")


def test_skyrls_config_takes_the_launch_scripts_overrides(tmp_path, skyrl_entrypoint):
    for script in ("run_kernel_agent.sh", "run_tiny.sh"):
        overrides = launched_arguments(RECIPES / "skyrl" / script, tmp_path, DATA_DIR="/data")[1:]
        cfg = skyrl_entrypoint.load_config(overrides)
        assert cfg.environment.env_class == "kernel_agent" and cfg.data.train_data == ["/data/train.parquet"]
        assert cfg.environment.skyrl_gym.kernel_agent == {"language": "cuda", "device": "cuda", "pool": "ray",
                                                         "selection": "best"}
    with pytest.raises(ValueError, match="Invalid fields"):  # SkyRL's config is strict: a misspelt key fails
        skyrl_entrypoint.load_config([*overrides, "environment.skyrl_gym.kernel_agnet.language=cpp"])


class ScriptedEngine:
    """SkyRL's inference client, answering each turn's generation with the next scripted token ids."""

    def __init__(self, tokenizer, turns: list[list[int]]):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    async def generate(self, engine_input, model=None):
        self.prompts.append(engine_input["prompt_token_ids"][0])
        ids = self.turns.pop(0)
        return {"responses": [self.tokenizer.decode(ids)], "response_ids": [ids], "stop_reasons": ["stop"]}

    async def finish_session(self, session_id):
        pass


def test_skyrls_generator_runs_a_kernel_agent_episode_from_the_recipes_config(tmp_path, skyrl_entrypoint, skyrl_row,
                                                                              tiny):
    """SkyRL's own generator (``SkyRLGymGenerator.agent_loop``) on run_tiny.sh's config, which hands
    the environment its options: Read, a reply without a call, then Finish, from a scripted engine
    over the tiny tokenizer. Changed for this machine: language, device, pool, protocol."""
    from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator

    tokenizer, replies = tiny
    machine = [f"environment.skyrl_gym.kernel_agent.{key}={value}" for key, value in CPU.items()]
    machine += [f"environment.skyrl_gym.kernel_agent.settings.{key}={json.dumps(value)}"
                for key, value in SETTINGS.model_dump().items() if value is not None]
    cfg = skyrl_entrypoint.load_config(
        [*launched_arguments(RECIPES / "skyrl" / "run_tiny.sh", tmp_path)[1:], *machine])
    engine = ScriptedEngine(tokenizer, replies)
    generator = SkyRLGymGenerator(cfg.generator, cfg.environment.skyrl_gym, engine, tokenizer)
    extras = {key: value for key, value in skyrl_row.items() if key not in ("prompt", "env_class")}
    output = asyncio.run(generator.agent_loop(skyrl_row["prompt"], skyrl_row["env_class"], extras,
                                              max_tokens=64, max_input_length=cfg.generator.max_input_length))
    assert len(engine.prompts) == 3 and output.stop_reason == "stop"
    assert output.env_metrics == {"turns": 3, "invalid_calls": 1, "correct": 0.0, "evaluator_fault": 0.0}
    # The model's tokens are trained on (1), the environment's answers between them are not (0).
    assert runs(output.loss_mask) == [(1, 2), (0, ...), (1, 2), (0, ...), (1, 2)]
    assert sum(output.reward) == -1.0 and output.reward[-1] == -1.0


# ----------------------------------------------------------------------------- verl


@pytest.fixture(scope="module")
def verl_config(tmp_path_factory):
    """verl's ppo_trainer config composed with run_grpo.sh's overrides (what its main_ppo gets)."""
    verl = pytest.importorskip("verl", reason="verl 0.9.1 is not installed")
    from hydra import compose, initialize_config_dir

    overrides = launched_arguments(RECIPES / "verl" / "run_grpo.sh", tmp_path_factory.mktemp("verl"),
                                   DATA_DIR="/data")
    assert overrides[:2] == ["-m", "verl.trainer.main_ppo"]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides[2:])


def test_verls_config_takes_the_launch_scripts_overrides(verl_config):
    from omegaconf import OmegaConf

    rollout = verl_config.actor_rollout_ref.rollout
    assert rollout.multi_turn.format == "hermes" and rollout.n == 8 and rollout.mode == "async"
    assert rollout.prompt_length == 8192 and rollout.response_length == 32768
    [entry] = OmegaConf.load(rollout.agent.agent_loop_config_path)
    assert entry.name == rollout.agent.default_agent_loop == "kernel_env"
    assert entry._target_ == "kernel_env_agent_loop.KernelEnvAgentLoop"


class ScriptedRolloutServer:
    """verl's ``server_manager``: each ``generate`` answers the next scripted token ids, with logprobs."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.prompts = list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        ids = self.turns.pop(0)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """A ``kernel-env serve`` process (tests/test_serve.py's): cpp on the CPU, the shortened protocol."""
    from test_serve import start_server

    server = start_server(tmp_path_factory.mktemp("serve"))
    yield server
    assert server.stop() == 0, server.log.read_text()[-3000:]


@pytest.mark.parametrize("response_length", [4096, 6], ids=["finish", "budget"])
def test_verls_agent_loop_runs_a_kernel_agent_episode_on_kernel_env_serve(monkeypatch, verl_config, serve, tiny,
                                                                          task_file, response_length):
    """The agent loop of agent_loop.yaml, made as verl's AgentLoopWorker makes it (hydra's instantiate,
    the server's address from KERNEL_ENV_SERVER_URL), run against a real ``kernel-env serve`` with a
    scripted rollout server over the tiny tokenizer: Read, a reply without a call, then Finish. With
    a response budget of 6 tokens the budget runs out after the first answer and
    the loop truncates the episode, which is still evaluated and paid."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer, replies = tiny
    config = OmegaConf.merge(verl_config, {"actor_rollout_ref": {"rollout": {"response_length": response_length}}})
    monkeypatch.setenv("KERNEL_ENV_SERVER_URL", serve.url)
    monkeypatch.syspath_prepend(str(RECIPES / "verl"))
    [entry] = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    rollout = ScriptedRolloutServer(replies)
    prepare = load(RECIPES / "verl" / "prepare_data.py", "verl_prepare_data")
    [row] = prepare.rows(prepare.task_specs(str(task_file)))

    async def episode():  # made in the running event loop, as in verl's worker
        loop = hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=config),
                                       server_manager=rollout, tokenizer=tokenizer, processor=None,
                                       hf_model_type="qwen3", dataset_cls=RLHFDataset,
                                       data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        return await loop.run({"temperature": 1.0}, raw_prompt=row["prompt"], task=row["task"],
                              extra_info=row["extra_info"], data_source=row["data_source"])

    output = asyncio.run(episode())
    final = output.extra_fields["final"]
    assert final["mode"] == "final" and not final["correct"] and output.extra_fields["fault"] == "candidate"
    assert output.reward_score == -1.0
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    assert rollout.prompts[0] == output.prompt_ids  # the episode's prompt, rendered with kernel_env's tools
    mask = output.response_mask
    if response_length == 6:  # one reply and the start of its answer, then the budget: truncated, still paid
        assert len(rollout.prompts) == 1 and output.extra_fields["episode_turns"] == 1
        assert mask == [1, 1, 0, 0, 0, 0]
    else:  # Read, its tool message, the reply without a call, the episode's answer to it, Finish
        assert len(rollout.prompts) == 3 and output.extra_fields["episode_turns"] == 3 and output.num_turns == 6
        assert runs(mask) == [(1, 2), (0, ...), (1, 2), (0, ...), (1, 2)]
        assert rollout.prompts[2] == output.prompt_ids + output.response_ids[:-2]
