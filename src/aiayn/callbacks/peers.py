"""`PeerWatch`: a process of a multi-process run that dies (killed, out of memory, its node
lost) or stops answering ends the run within about `silence_s` seconds, with one line that
names its rank, under every launcher (Lightning's own, torchrun, srun).

gloo notices a dead peer at the next collective, in the form of a connection error
(`aiayn.training.run` turns it into the line, with the rank named here). NCCL does not: the
other processes wait inside their collective for its timeout (30 minutes) and die without
saying which rank was gone. So each process adds to a counter in the launch's key-value store
(the TCPStore at `MASTER_ADDR:MASTER_PORT` that rank 0's process or torchrun's agent holds)
from a daemon thread, every `silence_s / 15` seconds, and reads the counter of the next rank
(a ring: the store answers three small requests per process per beat, whatever the number of
processes). A counter that stands still for `silence_s` seconds, of a rank that has not
finished, is a dead rank. The first process to find one writes the verdict into the store,
prints the line and ends; the others read the verdict at their next beat and end without a
second line. A store that stops answering means its holder is gone: rank 0 (Lightning's
launcher, srun) or the torchrun agent of the first node. Under Lightning's own launcher rank 0
also watches the processes it started, and ends the others as Lightning's own observer does.
`aiayn.training.run` adds one to every run (`peer_silence_s`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from aiayn.errors import DistributedError

log = logging.getLogger(__name__)

# what torch.distributed (gloo) says when another process of the run is gone
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")
STORE_TIMEOUT_S = 10  # a store request that takes longer: its holder is gone
# a rank not heard from at all yet is given this long (or the silence, if longer): ranks reach
# `setup` apart by as long as their data setup takes, and a late one is not a dead one
STARTUP_S = 300.0
STORE_LOST = ".store-lost-"  # the marker of the process that says a lost store
_PHASES = itertools.count(1)  # fits and tests of this process (multirun jobs share the store)


def peer_gone(error: BaseException) -> str | None:
    """Which of `PEER_GONE` `error` says, else None."""
    return next((phrase for phrase in PEER_GONE if phrase in str(error)), None)


@dataclass(frozen=True)
class Verdict:
    """The ranks found dead (empty where none can be named), how they were found, and
    whether this process is the one that says so."""

    dead: tuple[int, ...]
    why: str
    reporter: bool

    def encode(self) -> str:
        return ",".join(map(str, self.dead)) + "|" + self.why

    @classmethod
    def decode(cls, text: str, reporter: bool) -> Verdict:
        ranks, why = text.split("|", 1)
        return cls(tuple(int(r) for r in ranks.split(",") if r), why, reporter)


class PeerWatch(L.Callback):
    """Beats and watches from `setup` to `teardown` of every fit and test with several
    processes; `last_checkpoint` is named in the line as the place to resume from."""

    def __init__(self, silence_s: float = 30.0, last_checkpoint: str | Path | None = None):
        if not silence_s > 0:
            raise ValueError(f"silence_s must be > 0 seconds, got {silence_s}")
        self.silence_s = silence_s
        self.interval = max(silence_s / 15, 0.1)
        self.last_checkpoint = Path(last_checkpoint) if last_checkpoint else None
        self.on_verdict: Callable[[Verdict], None] = self._end_process
        self._trainer: L.Trainer | None = None
        self._store: Any = None
        self._prefix = ""
        self._verdict: Verdict | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- Lightning hooks -------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        phase = next(_PHASES)  # the same sequence on every rank
        if trainer.world_size == 1:
            return
        self._store = _client()
        if self._store is None:
            rank_zero_warn("no MASTER_ADDR/MASTER_PORT store: a dead rank is not watched for")
            return
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._trainer, self._prefix = trainer, f"aiayn/peers/{restart}/{phase}"
        if trainer.global_rank == 0:  # an earlier launch's markers (a requeue reuses names)
            self._remove_markers()
        self._verdict, self._stop = None, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="aiayn-peer-watch", daemon=True)
        self._thread.start()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._finish(done=True)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Lightning calls no `teardown` after an exception. A collective that failed on a
        dead peer (gloo) names it now; a stop by a signal (every rank stops) ends the watch
        as a finish does; any other error stops this rank's beats, so the others find it
        silent and end too (it prints its own error)."""
        seen = peer_gone(exception)
        if seen is not None and self._thread is not None:
            self._finish(done=False)
            self._find(f"rank {self._rank} saw '{seen}'", after_error=True)
        else:
            self._finish(done=isinstance(exception, (SystemExit, KeyboardInterrupt)))

    def _finish(self, done: bool) -> None:
        """Stop beating; `done`: and tell the others not to watch this rank any more."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if done:
            with contextlib.suppress(RuntimeError):  # its holder may have finished first
                self._store.set(self._key("done", self._rank), "1")

    # -- what the run reports -------------------------------------------------------------

    def error(self, seen: str) -> DistributedError:
        """The error of this process after a collective failed with `seen` (`PEER_GONE`):
        the dead ranks named where they could be found (`on_exception`), quiet where another
        process names them."""
        verdict = self._verdict or Verdict((), f"rank {self._rank} saw '{seen}'", True)
        error = DistributedError(self._line(verdict))
        error.quiet = not verdict.reporter
        return error

    # -- the watch ------------------------------------------------------------------------

    @property
    def _rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    def _key(self, kind: str, rank: int | None = None) -> str:
        return f"{self._prefix}/{kind}" + ("" if rank is None else f"/{rank}")

    def _watch(self) -> None:
        assert self._trainer is not None
        rank, world = self._trainer.global_rank, self._trainer.world_size
        neighbour, last, since = (rank + 1) % world, -1, time.monotonic()
        while not self._stop.wait(self.interval):
            verdict = None
            try:
                self._store.add(self._key("beat", rank), 1)
                verdict = self._children_verdict() or self._others_verdict()
                if verdict is None and not self._store.check([self._key("done", neighbour)]):
                    count = self._store.add(self._key("beat", neighbour), 0)
                    allowed = self.silence_s if count else max(self.silence_s, STARTUP_S)
                    if count != last:
                        last, since = count, time.monotonic()
                    elif time.monotonic() - since >= allowed:
                        verdict = self._find(f"not heard from for {allowed:g} s")
                        since = time.monotonic()  # none gone after all: watch on
            except RuntimeError:  # the store's holder is gone (torch's store errors)
                verdict = self._conclude(self._store_lost())
            except Exception as error:  # a bug here must not silence this rank's beats
                log.warning("peer watch: %s: %s", type(error).__name__, error)
            if verdict is not None and not self._stop.is_set():
                self.on_verdict(verdict)
                return

    def _children_verdict(self) -> Verdict | None:
        """Rank 0 under Lightning's launcher: a process it started that has ended."""
        ended = [(i + 1, p.poll()) for i, p in enumerate(_children(self._trainer))]
        ended = [(rank, code) for rank, code in ended if code is not None and code != 0]
        if not ended:
            return None
        codes = ", ".join(str(code) for _, code in ended)
        return self._conclude(Verdict(tuple(r for r, _ in ended), f"exit code {codes}", True))

    def _others_verdict(self) -> Verdict | None:
        """Another process's verdict, found in the store."""
        if not self._store.check([self._key("verdict")]):
            return None
        text = self._store.get(self._key("verdict")).decode()
        return self._conclude(Verdict.decode(text, reporter=False))

    def _find(self, why: str, after_error: bool = False) -> Verdict | None:
        """The silent ranks: counters that stand still over a few beats, of ranks that have
        neither finished nor failed on their own (`after_error`: this process's collective
        failed and its thread has stopped, so it is marked as failed). None where a silence
        had none behind it (a rank starved for a while)."""
        try:
            if after_error:
                self._store.set(self._key("failed", self._rank), "1")
                verdict = self._children_verdict() or self._others_verdict()
                if verdict is not None:
                    return verdict
            world = self._trainer.world_size if self._trainer is not None else 1
            beats = [self._key("beat", r) for r in range(world)]
            first = [self._store.add(key, 0) for key in beats]
            time.sleep(2.5 * self.interval)
            second = [self._store.add(key, 0) for key in beats]
            gone = [
                r
                for r in range(world)
                if r != self._rank
                and first[r] == second[r]
                and not self._store.check([self._key("done", r)])
                and not self._store.check([self._key("failed", r)])
            ]
            if not gone and not after_error:
                return None
            verdict = Verdict(tuple(gone), why, True)
            text = self._store.compare_set(self._key("verdict"), "", verdict.encode()).decode()
            return self._conclude(Verdict.decode(text, reporter=text == verdict.encode()))
        except RuntimeError:
            return self._conclude(self._store_lost())

    def _store_lost(self) -> Verdict:
        """Its holder is gone: every survivor finds that alone; the first to create a marker
        beside the run's checkpoints (a shared file system, as checkpoints need) says so."""
        address = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        reporter = self._first_to_mark(f"{STORE_LOST}{address.replace(':', '-')}-{self._prefix}")
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            why = f"the first node's torchrun agent (store {address}) is gone"
            return Verdict((), why, reporter)
        return Verdict((0,), f"the store it holds at {address} stopped answering", reporter)

    def _first_to_mark(self, name: str) -> bool:
        """Whether this process creates `name` first, beside `last_checkpoint` (True where
        there is no such directory: each process then speaks for itself)."""
        if self.last_checkpoint is None or not self.last_checkpoint.parent.is_dir():
            return True
        marker = self.last_checkpoint.parent / name.replace("/", "-")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        except OSError:
            return True
        return True

    def _remove_markers(self) -> None:
        if self.last_checkpoint is None or not self.last_checkpoint.parent.is_dir():
            return
        for marker in self.last_checkpoint.parent.glob(f"{STORE_LOST}*"):
            marker.unlink(missing_ok=True)

    def _conclude(self, verdict: Verdict) -> Verdict:
        """This process's one verdict: the first found is kept."""
        with self._lock:
            if self._verdict is None:
                self._verdict = verdict
            return self._verdict

    def _line(self, verdict: Verdict) -> str:
        world = self._trainer.world_size if self._trainer is not None else 0
        step = self._trainer.global_step if self._trainer is not None else 0
        if verdict.dead:
            ranks = ", ".join(map(str, verdict.dead))
            who = f"rank {ranks}" if len(verdict.dead) == 1 else f"ranks {ranks}"
            line = f"{who} of this {world}-process run died near update {step} ({verdict.why})"
            line += f"; check {who}'s log and memory"
        else:
            line = f"another process of this {world}-process run died near update {step} "
            line += f"({verdict.why}); check that process's log and memory"
        last = self.last_checkpoint
        return line + (f"; resume with ckpt_path={last}" if last and last.is_file() else "")

    def _end_process(self, verdict: Verdict) -> None:
        """From the watch thread, the main one being stuck in a collective: the line (once in
        the run), the processes this one started, and this process end."""
        if verdict.reporter:
            print(f"error: {self._line(verdict)}", file=sys.stderr, flush=True)
        for child in _children(self._trainer):
            if child.poll() is None:
                child.kill()
        os._exit(1)


def _client() -> Any:
    """A client of the launch's store, else None."""
    from torch.distributed import TCPStore

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        return TCPStore(
            host, int(port), is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S)
        )
    except (RuntimeError, ValueError):
        return None


def _children(trainer: L.Trainer | None) -> list[Any]:
    """The processes Lightning's own launcher started from this one (rank 0), else []."""
    launcher = getattr(trainer.strategy, "launcher", None) if trainer is not None else None
    return list(getattr(launcher, "procs", None) or [])
