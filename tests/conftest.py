"""Shared fixtures: tiny real checkpoints in the HF layout, built once per session."""
from __future__ import annotations

import pytest
import torch

from dllm_server.config import ServerConfig
from dllm_server.model.tiny import make_tiny_model

# Two cores: one torch thread per process keeps parallel processes from fighting.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_llada(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llada"), arch="llada", seed=0))


@pytest.fixture(scope="session")
def tiny_dream(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-dream"), arch="dream", seed=1))


@pytest.fixture(scope="session")
def tiny_sdar(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-sdar"), arch="sdar", seed=2))


@pytest.fixture(scope="session")
def tiny_llada2(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llada2"), arch="llada2", seed=3))


@pytest.fixture(scope="session", params=["llada", "dream"])
def tiny_model(request, tiny_llada, tiny_dream) -> str:
    return tiny_llada if request.param == "llada" else tiny_dream


@pytest.fixture
def engine_config(tiny_llada):
    return ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1)


# Tests that start real server, worker, Ray or container processes: `make test-fast` (-m "not slow")
# leaves them out for the edit loop; `make test` (CI) runs everything.
SLOW = ("tests/api/", "tests/engine/", "tests/reliability/test_abuse.py", "tests/reliability/test_faults.py",
        "tests/reliability/test_slow_clients.py", "tests/reliability/test_soak.py", "tests/docker/test_image.py",
        "tests/executor/test_ray.py", "tests/executor/test_stuck.py", "tests/executor/test_outbox_death.py",
        "tests/cluster/test_reconfigure.py", "tests/worker/test_kv_stream.py", "tests/bench/test_gpu_bench.py",
        "tests/bench/test_gpu_preflight.py", "tests/bench/test_handoff_bench.py", "tests/loadgen/test_loadgen_e2e.py",
        "tests/model/test_tp_forward.py", "tests/structured/test_served.py", "tests/reliability/test_chaos.py")


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        rel = item.path.relative_to(root).as_posix()
        if rel.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
