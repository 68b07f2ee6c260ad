"""tests/eval: one torch thread, and the reference translations; the tiny checkpoint every
eval and reliability test shares is `tests/run_fixtures.py`'s."""

from __future__ import annotations

import pytest
import torch

from tests.run_fixtures import TOY  # noqa: F401 (the eval tests' corpus)


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    """One torch thread (also for subprocesses): these models are tiny, and two threads on
    two shared cores spin while another process runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


def reference_translations(translator, lines: list[str]) -> list[str]:
    """What `Translator.translate_batch` gives for lines ('' for blank lines), all in one
    padded batch laid out as in training (x + <eos>)."""
    from aiayn.data.dataset import collate_sources

    texts = [line for line in lines if line.strip()]
    src, _ = collate_sources(translator.tokenizers.encode(texts, side="src"))
    out = iter(translator.translate_batch(src))
    return [next(out) if line.strip() else "" for line in lines]
