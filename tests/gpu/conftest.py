"""GPU tests: run on a machine with a CUDA GPU, `pytest -m gpu tests/gpu`."""

import pytest

from kernel_env.evaluators.baselines import BaselineCache
from kernel_env.runtime.pool import LocalPool


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """The local pool on the first GPU alone: the tests of jobs sharing a device need every job on the
    same one (on a host of several GPUs, a pool of all of them runs two jobs on two GPUs)."""
    with LocalPool(["cuda:0"], baselines=BaselineCache(tmp_path_factory.mktemp("baselines"))) as pool:
        yield pool
