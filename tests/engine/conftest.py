"""Real worker processes over torch.multiprocessing queues; gloo for KV transfer."""
from __future__ import annotations

import contextlib

import pytest

from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine


@pytest.fixture
def engine_config(tiny_llada):
    return ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1)


@contextlib.asynccontextmanager
async def running(config: ServerConfig):
    engine = AsyncEngine(config)
    await engine.start(timeout_s=120)
    try:
        yield engine
    finally:
        await engine.shutdown(0)
