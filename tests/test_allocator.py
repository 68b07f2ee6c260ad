"""malloc keeps freed memory for the next step (`aiayn.kernels.allocator`), unless told not to."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aiayn.kernels import allocator
from aiayn.kernels.allocator import keep_freed_memory, why_not

# A step's worth of large temporaries, 24 times: a copy of 1536 x 8000 float32 logits (47 MiB)
# and its exp, freed at once; prints the page faults of each step. With glibc's default each
# step faults all of its pages in again; kept, the heap settles within a few steps (memalign's
# padding makes the first reuses miss) and then faults none.
STEPS = """
import json, resource
import torch
from aiayn.kernels.allocator import keep_freed_memory
kept = keep_freed_memory()
logits = torch.randn(1536, 8000)
def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    logits.clone().exp_().sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"kept": kept, "faults": [step() for _ in range(24)]}))
"""


def allocations(setting: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    env[allocator.SETTING] = setting
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(
        [sys.executable, "-c", STEPS], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(allocator._glibc() is None, reason="glibc's malloc only")
def test_freed_memory_is_reused_without_page_faults():
    pages = 1536 * 8000 * 4 // os.sysconf("SC_PAGE_SIZE")
    default = allocations("0")
    assert default["kept"] is False
    assert min(default["faults"]) > pages // 2, default  # fresh mmap'd pages every step
    kept = allocations("1")
    assert kept["kept"] is True
    assert max(kept["faults"][-8:]) < pages // 100, kept  # settled: the heap's own pages
    assert sum(kept["faults"]) < sum(default["faults"]) / 2, kept


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({}, None),
        ({"AIAYN_KEEP_FREED_MEMORY": "1"}, None),
        ({"AIAYN_KEEP_FREED_MEMORY": "0"}, "AIAYN_KEEP_FREED_MEMORY=0"),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "LD_PRELOAD brings jemalloc"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "LD_PRELOAD brings tcmalloc"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, "GLIBC_TUNABLES sets glibc.malloc"),
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}, None),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_ is set"),
    ],
)
def test_the_users_own_malloc_settings_win(env, reason):
    assert why_not(env) == reason
    if reason is not None:
        assert keep_freed_memory(env) is False


def test_a_bad_setting_is_named_and_the_default_kept():
    with pytest.warns(UserWarning, match="AIAYN_KEEP_FREED_MEMORY='yes' is not 1"):
        assert why_not({"AIAYN_KEEP_FREED_MEMORY": "yes"}) is None


def test_train_py_turns_it_on_after_validation_before_any_work(monkeypatch, tmp_path):
    """With the CPU kernels (kernels=auto on a CPU run) malloc is tuned once the config is
    valid and before the trainer, the data or the model exist; a refused command, and a run
    on torch's kernels (GPU runs), leave it alone."""
    from omegaconf import OmegaConf

    from aiayn import kernels
    from aiayn.errors import ConfigError
    from aiayn.training import run
    from tests.helpers import compose_train, fast_overrides

    calls = []
    monkeypatch.setattr(run, "keep_freed_memory", lambda: calls.append("malloc"))

    def stop(*args, **kwargs):
        calls.append("trainer")
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "build_trainer", stop)
    with pytest.raises(ConfigError):
        run.run(OmegaConf.create({"not_a_key": 1}))
    assert calls == []
    try:
        for policy, expected in (("auto", ["malloc", "trainer"]), ("torch", ["trainer"])):
            calls.clear()
            cfg = compose_train([*fast_overrides(tmp_path), f"kernels={policy}"], tmp_path)
            with pytest.raises(KeyboardInterrupt):
                run.run(cfg)
            assert calls == expected
    finally:
        kernels.use("cpu")
