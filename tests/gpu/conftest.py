"""GPU tests share one pytest process: give its cached CUDA memory back after each test, so
the kernels later tests start do not see gigabytes held by "another process" (this one)."""

import gc
import sys

import pytest


@pytest.fixture(autouse=True)
def release_cuda_cache():
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()
