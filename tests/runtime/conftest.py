"""Fixtures for runtime tests."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import make_hf_model, tiny_config


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """(path, hf_model): a tiny random Llama written with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny_llama")
    model = make_hf_model(tiny_config())
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny matmuls are 20x slower with 2 threads when other processes share the 2 cores (spin contention)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
