#!/usr/bin/env bash
# Run the GPU tests on a bare GPU machine that has torch but no network (see device_env.sh
# for what it unpacks and installs first).
set -euo pipefail
. "$(dirname "$0")/device_env.sh"
exec python3 -m pytest -m gpu tests/gpu -v -p no:cacheprovider "$@"
