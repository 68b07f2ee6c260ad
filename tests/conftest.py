"""Shared test settings: no network, W&B offline, deterministic and small."""

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["tests.run_fixtures"]  # the shared tiny trained run

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# runs that name no paths.log_dir (composed configs claim their run directory; refused
# commands) go to a directory of this session's, never into the checkout's logs/
LOG_DIR = tempfile.mkdtemp(prefix="aiayn-test-logs-")
os.environ["AIAYN_LOG_DIR"] = LOG_DIR
# checkpoints' CTranslate2 conversions: this session's, never the user's ~/.cache
os.environ["AIAYN_CACHE_DIR"] = os.path.join(LOG_DIR, "cache")
# a test run started in the background by a non-interactive shell (`nohup ... &`) inherits
# SIGINT ignored, and so would every command it starts: the Ctrl-C tests (test_stops.py)
# need it as a terminal gives it (a handler, unlike SIG_IGN, is not inherited across exec)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """The default and slow layers are the CPU layers and run the same on every machine as on
    CI: they hide CUDA GPUs from this process and the commands it starts (run with a GPU
    visible on an H200, the default layer failed 9 tests). `-m gpu` keeps them."""
    expression = config.option.markexpr or ""
    if "gpu" not in expression or "not gpu" in expression:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(scope="session", autouse=True)
def _remove_the_sessions_logs():
    yield
    shutil.rmtree(LOG_DIR, ignore_errors=True)


MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
if (MULTI30K / "train.en").exists():  # data=multi30k reads this copy instead of downloading
    os.environ.setdefault("MULTI30K_ROOT", str(MULTI30K))


@pytest.fixture(scope="session")
def multi30k_root() -> Path:
    """The shared Multi30k copy; tests that need it skip where it is absent."""
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k reference data not found at {MULTI30K}")
    return MULTI30K


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch):
    """Progress bars drawn into a string as on a terminal (and enabled, whatever an earlier
    test set); returns a reader of that string."""
    import io

    from rich.console import Console

    from aiayn import console

    buffer = io.StringIO()
    monkeypatch.setattr(
        console, "progress_console", lambda: Console(file=buffer, force_terminal=True, width=120)
    )
    monkeypatch.setattr(console, "_progress_enabled", True)
    return buffer.getvalue
