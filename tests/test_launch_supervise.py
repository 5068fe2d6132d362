"""The supervisor's verdict with ranks played by objects: which failure it reports, and its code.

The real-process version of these is in test_launch_local.py; here the order in which ranks
end and are noticed is set exactly, without timing.
"""

from __future__ import annotations

import io

import pytest

from fastcoll.launch.output import OutputMux
from fastcoll.launch.procs import describe_code
from fastcoll.launch.supervise import Supervisor


class FakeRank:
    """A rank that has ended at `ended` with `code`; poll() shows it from its `visible_from`-th
    call on (a rank that ended just after the supervisor looked at it)."""

    def __init__(self, rank: int, code: int | None, ended: float | None, visible_from: int = 1):
        self.rank, self.host = rank, "localhost"
        self._code, self._ended, self._visible_from = code, ended, visible_from
        self.polls = 0
        self.signals: list[int] = []

    def poll(self) -> int | None:
        self.polls += 1
        return self._code if self.polls >= self._visible_from else None

    def ended_at(self) -> float | None:
        return self._ended if self.polls >= self._visible_from else None

    def signal(self, sig: int) -> None:
        self.signals.append(sig)

    def kill(self) -> None:
        self.signals.append(9)

    def force(self) -> None:
        pass

    def cleanup(self) -> None:
        pass

    def describe(self, code: int) -> str:
        return describe_code(code, False)

    def lost(self) -> str | None:
        return None

    def silence(self) -> float:
        return 0.0

    def cut_off(self, reason: str) -> None:
        pass


def supervise(ranks: list[FakeRank]) -> tuple[int, str]:
    """Run a Supervisor over `ranks`: (exit code, what it printed)."""
    out, err = io.BytesIO(), io.BytesIO()
    mux = OutputMux(out, err, tag=True)
    code = Supervisor(mux, grace=0.5, settle=0.2, poll_interval=0.001).run([lambda r=r: r for r in ranks])
    mux.close()
    return code, err.getvalue().decode()


@pytest.mark.parametrize("visible_from", [1, 2], ids=["seen-together", "seen-on-the-second-look"])
def test_the_rank_that_ended_first_is_reported(visible_from):
    """Rank 0 (looked at first) failed 10 ms after rank 1; rank 1 is seen in the same sweep, or
    only on the sweep's second look (it ended just after the supervisor first looked at it)."""
    ranks = [FakeRank(0, 1, 100.010), FakeRank(1, 3, 100.000, visible_from)]
    code, text = supervise(ranks)
    assert code == 3, text
    assert "rank 1 (host localhost) exited with code 3" in text, text
    assert "rank 0" not in text, text


def test_a_later_failure_after_the_first_is_not_reported():
    ranks = [FakeRank(0, 0, 99.0), FakeRank(1, 4, 100.5), FakeRank(2, 2, 100.2)]
    code, text = supervise(ranks)
    assert code == 2, text
    assert text.count("exited with code") == 1 and "rank 2 (host localhost) exited with code 2" in text


def test_ranks_still_running_are_stopped():
    ranks = [FakeRank(0, None, None), FakeRank(1, 5, 100.0)]

    def stopped() -> int | None:  # rank 0 ends once it has been sent SIGTERM
        return 143 if ranks[0].signals else None

    ranks[0].poll = stopped
    ranks[0].ended_at = lambda: 101.0 if ranks[0].signals else None
    code, text = supervise(ranks)
    assert code == 5 and ranks[0].signals == [15], text
    assert "rank 1 (host localhost) exited with code 5; stopping the other 1 rank(s)" in text


def test_a_rank_that_ends_while_the_others_settle_is_not_signalled():
    """Rank 1 fails; rank 0 ends by itself (as a rank that lost its peer does) before the settle
    period is over: it is sent nothing, and the job's code is rank 1's."""
    ranks = [FakeRank(0, 1, 100.1, visible_from=5), FakeRank(1, 3, 100.0)]
    code, text = supervise(ranks)
    assert code == 3 and ranks[0].signals == [], (ranks[0].signals, text)


def test_a_signal_while_the_others_settle_stops_them_at_once():
    ranks = [FakeRank(0, None, None), FakeRank(1, 5, 100.0)]
    out, err = io.BytesIO(), io.BytesIO()
    mux = OutputMux(out, err, tag=True)
    sup = Supervisor(mux, grace=0.5, settle=60.0, poll_interval=0.001)

    def poll() -> int | None:  # the launcher gets SIGINT at rank 0's third look; SIGTERM ends it
        ranks[0].polls += 1
        if ranks[0].polls == 3:
            sup.on_signal(2)
        return 143 if ranks[0].signals else None

    ranks[0].poll = poll
    ranks[0].ended_at = lambda: 101.0 if ranks[0].signals else None
    code = sup.run([lambda r=r: r for r in ranks])
    mux.close()
    text = err.getvalue().decode()
    assert code == 5 and ranks[0].signals == [15], (ranks[0].signals, text)
    assert "received SIGINT; stopping all ranks now" in text, text
