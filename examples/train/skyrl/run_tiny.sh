#!/usr/bin/env bash
# The smallest run of run_kernel_agent.sh: Qwen3-0.6B on GPU 0 (policy, reference and one vLLM engine
# colocated), kernel_env's evaluations on the node's other GPUs, the bundled example task, two steps
# of one group of 4 episodes of at most 10 turns.
#
#   python examples/train/skyrl/prepare_data.py --tasks examples --output ~/data/kernel_env_tiny/train.parquet
#   bash examples/train/skyrl/run_tiny.sh
set -euo pipefail

DATA_DIR="${DATA_DIR:-$HOME/data/kernel_env_tiny}" MODEL="${MODEL:-Qwen/Qwen3-0.6B}" NUM_GPUS=1 \
exec bash "$(dirname "$0")/run_kernel_agent.sh" \
  trainer.train_batch_size=1 \
  trainer.policy_mini_batch_size=1 \
  trainer.epochs=2 \
  trainer.ckpt_interval=-1 \
  generator.n_samples_per_prompt=4 \
  generator.max_turns=10 \
  generator.max_input_length=16384 \
  generator.sampling_params.max_generate_length=2048 \
  "$@"
