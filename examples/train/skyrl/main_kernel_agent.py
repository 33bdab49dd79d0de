"""SkyRL's trainer on kernel_env: skyrl-train's own entrypoint with the ``kernel_agent`` environment
(``kernel_env.integrations.skyrl``) registered and its options in the config.

Run it with SkyRL's key=value overrides (run_kernel_agent.sh holds the recipe's)::

    python examples/train/skyrl/main_kernel_agent.py data.train_data="['$HOME/data/kernel_env/train.parquet']" \\
        environment.skyrl_gym.kernel_agent.language=cuda ... [--check]

``--check`` stops after the config is parsed and validated and the environment options are tried on
the first row of the training data: a CPU machine says whether the GPU job would start.

Follows skyrl 0.4.0 (PyPI; the repository at commit a9564572eb8e91076be43c1bd5e4615e3de17265):
``skyrl/train/entrypoints/main_base.py`` (``BasePPOExp``, ``skyrl_entrypoint``, ``main``) and
``examples/train/multiply/main_multiply.py`` (a custom environment registered inside the Ray task
that runs the generator: the registration is per process). The config is strict
(``skyrl/train/config/config.py``: ``build_nested_dataclass`` refuses unknown keys, ``+key=`` is
not supported), and the generator makes each environment with
``env_config = getattr(cfg.environment.skyrl_gym, env_class)`` (``skyrl_gym_generator.py``), so
the options live in a ``kernel_agent`` field added to ``SkyRLGymConfig`` by the subclasses below.

No ``from __future__ import annotations`` here: ``build_nested_dataclass`` reads each field's type
at run time and would take a string annotation for a plain dict.
"""

import sys
from dataclasses import dataclass, field
from typing import Any

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.config.config import EnvironmentConfig, SkyRLGymConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.utils import initialize_ray, validate_cfg


@dataclass
class KernelEnvSkyRLGymConfig(SkyRLGymConfig):
    kernel_agent: dict[str, Any] = field(default_factory=dict)
    """KernelAgentEnv's options for every ``kernel_agent`` environment: language, device, sandbox,
    sandbox_options, pool, selection, shaping, reward_kind, settings (a mapping of EvalSettings),
    tools, max_output_chars. ``max_turns`` comes from ``generator.max_turns``."""


@dataclass
class KernelEnvEnvironmentConfig(EnvironmentConfig):
    env_class: str = "kernel_agent"
    skyrl_gym: KernelEnvSkyRLGymConfig = field(default_factory=KernelEnvSkyRLGymConfig)


@dataclass
class KernelEnvTrainConfig(SkyRLTrainConfig):
    environment: KernelEnvEnvironmentConfig = field(default_factory=KernelEnvEnvironmentConfig)


def load_config(overrides: list[str]) -> KernelEnvTrainConfig:
    """The trainer's config from SkyRL's key=value overrides, validated as SkyRL's ``main`` does."""
    cfg = KernelEnvTrainConfig.from_cli_overrides(overrides)
    validate_cfg(cfg)
    return cfg


def check_environment(cfg: KernelEnvTrainConfig) -> None:
    """Make a ``kernel_agent`` environment from the first training row and the configured options,
    as the generator will (no episode starts): a bad option or a row without its task fails here.
    Only for ``--check``: with ``pool=ray`` it starts Ray, which SkyRL must start itself in a run."""
    import datasets
    import skyrl_gym

    import kernel_env.integrations.skyrl  # noqa: F401 - registers kernel_agent with skyrl-gym

    row = datasets.load_dataset("parquet", data_files=cfg.data.train_data[0], split="train[:1]")[0]
    extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
    skyrl_gym.make(row["env_class"], env_config=cfg.environment.skyrl_gym.kernel_agent,
                   extras={**extras, "max_turns": cfg.generator.max_turns})


@ray.remote(num_cpus=1)
def skyrl_entrypoint(cfg: KernelEnvTrainConfig) -> None:
    """SkyRL's training task, with kernel_agent registered in the process that makes the environments."""
    import kernel_env.integrations.skyrl  # noqa: F401 - registers kernel_agent with skyrl-gym

    BasePPOExp(cfg).run()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    check_only = "--check" in argv
    cfg = load_config([arg for arg in argv if arg != "--check"])
    if check_only:
        check_environment(cfg)
        print(f"config and environment options accepted: env_class={cfg.environment.env_class}, "
              f"kernel_agent={cfg.environment.skyrl_gym.kernel_agent}, max_turns={cfg.generator.max_turns}")
        return 0
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
