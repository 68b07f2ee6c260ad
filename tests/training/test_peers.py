"""`PeerWatch` in one process: several watches on one real TCPStore, as the ranks of a run
would hold them (the launches that kill real processes are in tests/reliability/test_faults.py,
marked slow)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.distributed import TCPStore

from aiayn.callbacks import peers
from aiayn.callbacks.peers import PeerWatch, Verdict
from tests.helpers import free_port

SILENCE = 0.6  # seconds (the watches beat every SILENCE / 15 seconds, at least 0.1)


@pytest.fixture(autouse=True)
def _phases(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Rank` sets the fit counter of each emulated process: restored after each test."""
    monkeypatch.setattr(peers, "_PHASES", peers._PHASES)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> TCPStore:
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    return server


class Rank:
    """One rank's watch, with the verdicts it would end its process on."""

    def __init__(
        self,
        rank: int,
        world: int,
        procs: list | None = None,
        silence: float = SILENCE,
        phase: int = 1,
        last: Path | None = None,
    ) -> None:
        launcher = SimpleNamespace(procs=procs or [])
        self.trainer = SimpleNamespace(
            global_rank=rank,
            world_size=world,
            global_step=7,
            strategy=SimpleNamespace(launcher=launcher),
        )
        self.watch = PeerWatch(silence, last)
        self.verdicts: list[Verdict] = []
        self.ended = threading.Event()
        self.watch.on_verdict = self._record
        peers._PHASES = itertools.count(phase)  # each rank a process of its own: its fit `phase`
        self.watch.setup(self.trainer, None, "fit")

    def _record(self, verdict: Verdict) -> None:
        self.verdicts.append(verdict)
        self.ended.set()

    def die(self) -> None:
        """Stops beating without saying so, as a killed process."""
        self.watch._stop.set()
        self.watch._thread.join()


def test_a_silent_rank_is_named_by_its_neighbour_and_the_others_stay_quiet(store):
    ranks = [Rank(r, 3) for r in range(3)]
    time.sleep(3 * SILENCE)
    assert not any(rank.verdicts for rank in ranks)  # beating ranks are never named
    ranks[2].die()
    assert ranks[1].ended.wait(10) and ranks[0].ended.wait(10)
    assert ranks[1].verdicts == [Verdict((2,), f"not heard from for {SILENCE:g} s", True)]
    assert ranks[0].verdicts == [Verdict((2,), f"not heard from for {SILENCE:g} s", False)]
    line = ranks[1].watch._line(ranks[1].verdicts[0])
    assert line == (
        "rank 2 of this 3-process run died near update 7 (not heard from for 0.6 s); "
        "check rank 2's log and memory"
    )


def test_a_rank_not_heard_from_yet_is_given_the_startup_time(store, monkeypatch):
    """A rank that reaches `setup` late (its data setup took longer) is not named within the
    silence; one never heard from at all is named once STARTUP_S has passed."""
    early = Rank(0, 2)
    time.sleep(4 * SILENCE)  # rank 1 not started yet: longer than the silence
    late = Rank(1, 2)
    time.sleep(2 * SILENCE)
    assert early.verdicts == [] and late.verdicts == []
    for rank in (early, late):
        rank.watch.teardown(rank.trainer, None, "fit")
    monkeypatch.setattr(peers, "STARTUP_S", 2 * SILENCE)
    alone = Rank(0, 2, phase=2)  # its neighbour never starts
    assert alone.ended.wait(10)
    assert alone.verdicts == [Verdict((1,), f"not heard from for {2 * SILENCE:g} s", True)]


def test_a_rank_that_finished_is_not_named(store):
    ranks = [Rank(r, 2) for r in range(2)]
    ranks[1].watch.teardown(ranks[1].trainer, None, "fit")
    time.sleep(4 * SILENCE)
    assert ranks[0].verdicts == []
    ranks[0].watch.teardown(ranks[0].trainer, None, "fit")


def test_after_a_failed_collective_the_dead_rank_is_named_once(store, tmp_path):
    """gloo's connection error on two survivors of three: one line, naming rank 1, with the
    checkpoint to resume from; the other survivor exits quietly."""
    ranks = [Rank(r, 3) for r in range(3)]
    last = tmp_path / "last.ckpt"
    last.write_bytes(b"x")
    for rank in ranks:
        rank.watch.last_checkpoint = last
    time.sleep(2 * SILENCE)
    ranks[1].die()
    errors = [None, None]

    def fail(i: int) -> None:  # as Lightning, then aiayn.training.run, handle the error
        lost = RuntimeError("[gloo] Connection reset by peer [127.0.0.1]:1234")
        ranks[i].watch.on_exception(ranks[i].trainer, None, lost)
        errors[i // 2] = ranks[i].watch.error("Connection reset by peer")

    threads = [threading.Thread(target=fail, args=(i,)) for i in (0, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = [str(e) for e in errors if not e.quiet]
    assert len(lines) == 1 and sum(e.quiet for e in errors) == 1
    assert lines[0].startswith("rank 1 of this 3-process run died near update 7 (rank ")
    assert "saw 'Connection reset by peer'); check rank 1's log and memory" in lines[0]
    assert lines[0].endswith(f"; resume with ckpt_path={last}")
    assert not ranks[0].verdicts and not ranks[2].verdicts  # the threads stopped, no exit


def test_a_lost_store_names_rank_0_which_holds_it_in_one_line(monkeypatch, tmp_path):
    """The store lives in another process (rank 0's, as under Lightning's launcher or srun);
    when it is killed, ranks 1 and 2 name rank 0 at their next beat, long before the
    silence, and only the first to mark it beside the checkpoints prints the line."""
    port = free_port()
    serve = "import sys, time; from datetime import timedelta; from torch.distributed import "
    serve += f"TCPStore; s = TCPStore('127.0.0.1', {port}, is_master=True); "
    serve += "print('up', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", serve], stdout=subprocess.PIPE, text=True)
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / f".store-lost-127.0.0.1-{port}-aiayn-peers-0-1"
    stale.touch()  # an earlier launch's (a requeue): rank 0's setup removes it
    try:
        assert holder.stdout.readline() == "up\n"
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
        last = tmp_path / "checkpoints" / "last.ckpt"
        first = Rank(0, 3, silence=15, last=last)  # beats every second; never silent long enough
        assert not stale.exists()
        first.die()  # rank 0's process (it holds the store) is killed below
        ranks = [Rank(r, 3, silence=15, last=last) for r in (1, 2)]
        time.sleep(1)
        assert not any(rank.verdicts for rank in ranks)
    finally:
        holder.kill()
        holder.wait()
    assert all(rank.ended.wait(30) for rank in ranks)
    verdicts = [rank.verdicts[0] for rank in ranks]
    why = f"the store it holds at 127.0.0.1:{port} stopped answering"
    assert [(v.dead, v.why) for v in verdicts] == [((0,), why)] * 2
    assert sorted(v.reporter for v in verdicts) == [False, True]  # one line
    line = ranks[0].watch._line(verdicts[0])
    assert line.startswith("rank 0 of this 3-process run died near update 7")


def test_rank_0_names_a_process_of_lightnings_launcher_that_ended(store):
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.wait()
    rank = Rank(0, 2, procs=[child])
    assert rank.ended.wait(5)
    assert rank.verdicts == [Verdict((1,), "exit code 3", True)]


def test_a_verdict_survives_the_store():
    verdict = Verdict((2, 5), "exit code -9, 1", True)
    assert Verdict.decode(verdict.encode(), reporter=True) == verdict
    assert Verdict.decode(Verdict((), "x|y", False).encode(), reporter=False).dead == ()


def test_a_rank_stopped_by_a_signal_is_not_named(store):
    """SIGTERM or Ctrl-C stops every rank (Lightning calls `on_exception`, no `teardown`):
    the stopped rank is marked finished and its neighbour does not name it."""
    ranks = [Rank(r, 2) for r in range(2)]
    ranks[1].watch.on_exception(ranks[1].trainer, None, SystemExit())
    assert ranks[1].watch._thread is None  # no more beats, as when its process has ended
    time.sleep(4 * SILENCE)
    assert ranks[0].verdicts == []
    ranks[0].watch.on_exception(ranks[0].trainer, None, KeyboardInterrupt())
    assert ranks[0].watch._thread is None


def test_the_next_job_of_a_multirun_is_watched_afresh(store):
    """Jobs of one launch share its store: a second fit watches under keys of its own, so
    the first job's finished marks do not hide a rank that dies in the second."""
    first = [Rank(r, 2) for r in range(2)]
    for rank in first:
        rank.watch.teardown(rank.trainer, None, "fit")
    second = [Rank(r, 2, phase=2) for r in range(2)]  # each process's second fit
    time.sleep(SILENCE)  # rank 1 beats a few times (a rank never heard from gets STARTUP_S)
    second[1].die()
    assert second[0].ended.wait(10)
    assert second[0].verdicts[0].dead == (1,)
