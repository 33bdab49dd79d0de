#!/usr/bin/env bash
# GRPO with SkyRL (skyrl 0.4.0) on KernelAgent-v0, one node: SkyRL trains and generates on NUM_GPUS GPUs
# (colocated FSDP policy and vLLM engines); kernel_env's evaluations run on the node's other GPUs
# through its Ray pool (pool=ray: one actor per GPU that SkyRL's placement group left free).
#
#   python examples/train/skyrl/prepare_data.py --tasks ~/KernelBench --output ~/data/kernel_env/train.parquet
#   bash examples/train/skyrl/run_kernel_agent.sh            # 6 of 8 GPUs train, 2 evaluate
#   bash examples/train/skyrl/run_kernel_agent.sh --check    # the config and options only (any machine)
#
# Extra key=value arguments override the ones below (SkyRL's strict config: a key it lacks is refused).
# Overrides follow SkyRL's examples/train/multiply/run_multiply.sh and examples/train/text_to_sql
# (multi-turn: generator.max_turns, generator.batched=false) at commit a9564572.
set -euo pipefail

DATA_DIR="${DATA_DIR:-$HOME/data/kernel_env}"
MODEL="${MODEL:-Qwen/Qwen3-8B}"
NUM_GPUS="${NUM_GPUS:-6}"
PYTHON="${PYTHON:-python}"

OVERRIDES=(
  data.train_data="['$DATA_DIR/train.parquet']"
  trainer.policy.model.path="$MODEL"
  trainer.strategy=fsdp
  trainer.algorithm.advantage_estimator=grpo
  trainer.algorithm.use_kl_loss=false
  trainer.placement.colocate_all=true
  trainer.placement.policy_num_gpus_per_node="$NUM_GPUS"
  trainer.placement.ref_num_gpus_per_node="$NUM_GPUS"
  generator.inference_engine.num_engines="$NUM_GPUS"
  generator.inference_engine.tensor_parallel_size=1
  generator.inference_engine.backend=vllm
  generator.inference_engine.run_engines_locally=true
  generator.inference_engine.weight_sync_backend=nccl
  generator.inference_engine.gpu_memory_utilization=0.6
  trainer.epochs=20
  trainer.train_batch_size=4
  trainer.policy_mini_batch_size=4
  trainer.micro_forward_batch_size_per_gpu=1
  trainer.micro_train_batch_size_per_gpu=1
  trainer.eval_interval=-1
  trainer.ckpt_interval=10
  trainer.policy.optimizer_config.lr=1.0e-6
  generator.n_samples_per_prompt=8
  generator.batched=false
  # The episode's own turn limit (kernel_env evaluates an episode that reaches it) must bind before
  # the context does: SkyRL closes an episode whose context passes max_input_length unevaluated.
  generator.max_turns=50
  trainer.max_prompt_length=8192
  generator.max_input_length=65536
  generator.sampling_params.max_generate_length=8192
  environment.env_class=kernel_agent
  # The environment's steps block (commands, builds, evaluations): run them on SkyRL's env threads.
  environment.skyrl_gym.max_env_workers=64
  # KernelAgentEnv's options. SkyRL's training task need not see the GPUs, so name them.
  environment.skyrl_gym.kernel_agent.language=cuda
  environment.skyrl_gym.kernel_agent.device=cuda
  environment.skyrl_gym.kernel_agent.pool=ray
  environment.skyrl_gym.kernel_agent.selection=best
  trainer.logger=tensorboard
  trainer.project_name=kernel_env
  trainer.run_name=kernel_agent_grpo
)

exec "$PYTHON" "$(dirname "$0")/main_kernel_agent.py" "${OVERRIDES[@]}" "$@"
