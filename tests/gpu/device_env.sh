# Source this on a bare GPU machine that has torch but no network (`. tests/gpu/device_env.sh`):
# unpacks carried Debian packages (.deb/, for bubblewrap) and wheels (.whl/; .whlray/ for the
# Ray tests, with Ray as a slimmed tarball) when present, and installs kernel_env in editable
# mode without touching the index.
# .whlray/ as made for a 2026-11 device image: the wheels of Ray's needs it lacks (jsonschema,
# jsonschema-specifications, referencing, rpds-py), and ray-<version>-slim.tar.xz, the contents of
# Ray's wheel (ray/ and its dist-info) less what a local cluster without a dashboard never loads:
# ray/jars, ray/dashboard/client, and ray/{rllib,data,serve,llm,train,tune} (28 MB against the
# 79 MB wheel, which would not fit the 64 MiB a device call carries beside .whl/).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! command -v bwrap >/dev/null && compgen -G ".deb/*.deb" >/dev/null; then
    for deb in .deb/*.deb; do dpkg -x "$deb" /tmp/debroot; done
    export PATH="/tmp/debroot/usr/bin:$PATH" LD_LIBRARY_PATH="/tmp/debroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
for wheels in .whl .whlray; do
    if compgen -G "$wheels/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile "$wheels"/*.whl
    fi
done
if compgen -G ".whlray/*.tar.xz" >/dev/null && ! python3 -c "import ray" 2>/dev/null; then
    tar -xJf .whlray/*.tar.xz -C "$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'x', torch.cuda.device_count())"
