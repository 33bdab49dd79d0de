#!/usr/bin/env bash
# utils/compile.sh — PROTECTED (read-only, hash-checked). Builds this workspace's kernels.
#
#   bash utils/compile.sh                          # CPU C++ or Triton workspace
#   TORCH_CUDA_ARCH_LIST=9.0 bash utils/compile.sh # CUDA workspace (9.0a for wgmma/TMA features)
#   bash utils/compile.sh kernels/foo.cu           # compile only the named sources, no link
#
# cuda/cpp: builds build/cuda_extension*.so from binding.cpp + kernels/*.cpp (+ kernels/*.cu)
# with ninja, rebuilding only what changed. triton: checks the syntax of model_new.py and
# kernels/*.py (Triton kernels compile at their first launch). The last line says
# BUILD OK / CHECK OK / BUILD FAILED; the exit status is nonzero on failure.
#
# All the work is in utils/build.py. This wrapper must never write into utils/ (no
# __pycache__: python3 -B), and keeps ccache out of the build.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONDONTWRITEBYTECODE=1 CCACHE_DISABLE=1
exec python3 -B utils/build.py "$@"
