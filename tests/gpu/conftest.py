"""GPU tests: run on a machine with a CUDA GPU, `pytest -m gpu tests/gpu`."""

import pytest

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.runtime.pool import LocalPool


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    with LocalPool(baselines=BaselineCache(tmp_path_factory.mktemp("baselines"))) as pool:
        yield pool
