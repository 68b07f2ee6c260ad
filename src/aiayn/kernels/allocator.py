"""The process's C allocator: keep freed memory for reuse instead of handing it back.

glibc's malloc serves large requests (128 KiB and up, a threshold it raises to at most 32 MiB
as it sees them freed) with fresh pages from ``mmap`` and unmaps them on ``free``. A training
step allocates its activations, logits and gradients anew each time, so each step faults in
all of those pages again, one 4 KiB page at a time, and a copy into fresh pages takes several
times as long as one into reused pages (``benchmarks/kernels.py``). With
``keep_freed_memory`` every request comes from the heap and freed memory stays there for the
next step (glibc's ``M_MMAP_MAX`` 0 and a 1 GiB ``M_TRIM_THRESHOLD``, what jemalloc or
tcmalloc, the allocators Intel's PyTorch guides recommend, do by design). The real
``experiment=multi30k_cpu`` recipe trains faster with it for a little more resident memory
(``benchmarks/cpu_settings.py``, recorded in ``benchmarks/RESULTS.md``).

``train.py`` turns it on; ``AIAYN_KEEP_FREED_MEMORY=0`` leaves malloc as it is. It is left
alone as well where the C library is not glibc, where ``LD_PRELOAD`` brings another allocator,
and where the user already tuned malloc (``GLIBC_TUNABLES`` naming ``glibc.malloc``, or one of
glibc's ``MALLOC_*_`` variables).
"""

from __future__ import annotations

import ctypes
import os
import warnings
from collections.abc import Mapping

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)
TRIM_THRESHOLD = 1 << 30  # bytes of free heap top kept before glibc gives any back
SETTING = "AIAYN_KEEP_FREED_MEMORY"
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
USER_MALLOC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def why_not(env: Mapping[str, str]) -> str | None:
    """Why malloc is left as it is under environment ``env``; None where it is to be tuned."""
    setting = env.get(SETTING, "")
    if setting not in ("", "0", "1"):
        warnings.warn(
            f"{SETTING}={setting!r} is not 1 (keep) or 0 (leave malloc): using 1", stacklevel=3
        )
    if setting == "0":
        return f"{SETTING}=0"
    preload = env.get("LD_PRELOAD", "")
    other = next((name for name in OTHER_ALLOCATORS if name in preload), None)
    if other:
        return f"LD_PRELOAD brings {other}"
    if "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets glibc.malloc"
    user = next((name for name in USER_MALLOC_VARIABLES if name in env), None)
    if user:
        return f"{user} is set"
    return None


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: musl and macOS lack it)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory(env: Mapping[str, str] | None = None) -> bool:
    """Make glibc's malloc keep freed memory for reuse (see the module docstring), unless
    ``env`` (default: ``os.environ``) says otherwise; returns whether it now does."""
    if why_not(os.environ if env is None else env) is not None:
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
