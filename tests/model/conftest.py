"""Model tests run single-threaded: the tiny tensors here gain nothing from intra-op
threads, and on a shared 2-core machine OpenMP threads waiting for each other make each op
many times slower. The previous setting is restored after each test."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
