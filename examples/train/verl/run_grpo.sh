#!/usr/bin/env bash
# GRPO with verl 0.9.1 on KernelAgent-v0, one node of 8 GPUs: verl trains and generates on GPUs 0-5
# (FSDP actor, vLLM rollout, agent loops), kernel-env serve runs the episodes and evaluates on 6-7.
#
#   python examples/train/verl/prepare_data.py --tasks ~/KernelBench --output ~/data/kernel_env_verl/train.parquet
#   CUDA_VISIBLE_DEVICES=6,7 kernel-env serve --kernelbench ~/KernelBench --port 8000 --max-sessions 64 &
#   CUDA_VISIBLE_DEVICES=0,1,2,3,4,5 bash examples/train/verl/run_grpo.sh
#
# KERNEL_ENV_SERVER_URL names another server (agent_loop.yaml reads it). Extra arguments are hydra
# overrides of verl's ppo_trainer config; `--cfg job` prints the composed config and stops (hydra's own).
# Keys: verl/trainer/config/ppo_trainer.yaml and rollout/rollout.yaml of verl 0.9.1 (agent loops:
# rollout.agent.agent_loop_config_path, rollout.multi_turn.format; the episode's reward comes from the
# loop's reward_score, so no reward function is configured).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
DATA_DIR="${DATA_DIR:-$HOME/data/kernel_env_verl}"
MODEL="${MODEL:-Qwen/Qwen3-8B}"
NUM_GPUS="${NUM_GPUS:-6}"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"   # the agent loop's module, for verl's Ray workers too

OVERRIDES=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=false
  data.train_files="$DATA_DIR/train.parquet"
  data.val_files="$DATA_DIR/train.parquet"
  data.train_batch_size=4
  # The episode's prompt (model.py, SKILL.md, the tools) replaces the row's placeholder: room for it.
  data.max_prompt_length=8192
  # Every reply and tool result of an episode; when it runs out the loop truncates the episode,
  # which is still evaluated and paid.
  data.max_response_length=32768
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.enable_gradient_checkpointing=true
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.use_kl_loss=false
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
  actor_rollout_ref.rollout.multi_turn.format=hermes
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml"
  actor_rollout_ref.rollout.agent.default_agent_loop=kernel_env
  trainer.n_gpus_per_node="$NUM_GPUS"
  trainer.nnodes=1
  trainer.total_epochs=20
  trainer.val_before_train=false
  trainer.test_freq=-1
  trainer.save_freq=10
  trainer.logger='["console"]'
  trainer.project_name=kernel_env
  trainer.experiment_name=kernel_agent_grpo
)

exec "$PYTHON" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
