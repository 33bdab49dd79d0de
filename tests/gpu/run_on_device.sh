#!/usr/bin/env bash
# Run the GPU tests on a bare GPU machine that has torch but no network: unpack carried
# Debian packages (.deb/, for bubblewrap) and wheels (.whl/) when present, install
# kernel_env in editable mode without touching the index, then run the gpu-marked tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v bwrap >/dev/null && compgen -G ".deb/*.deb" >/dev/null; then
    for deb in .deb/*.deb; do dpkg -x "$deb" /tmp/debroot; done
    export PATH="/tmp/debroot/usr/bin:$PATH" LD_LIBRARY_PATH="/tmp/debroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
exec python3 -m pytest -m gpu tests/gpu -v -p no:cacheprovider "$@"
