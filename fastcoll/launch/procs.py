"""Rank processes: one started here in its own session, or one started on a host through ssh.

Both answer the same questions (`poll`, `signal`, `kill`, `force`, `cleanup`, `describe`,
`lost`, `silence`, `cut_off`), so the supervisor treats them alike.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import signal
import subprocess
import threading
import time
from typing import Mapping, Protocol

from fastcoll.launch import ranksite
from fastcoll.launch.agent import BindError, cpu_share, on_cpus
from fastcoll.launch.job import RankPlan
from fastcoll.launch.output import OutputMux, pump
from fastcoll.launch.remote import agent_command, agent_payload, explain_ssh_failure

log = logging.getLogger("fastcoll.launch")

SSH_FAILED = 255  # what ssh itself exits with; a rank that could not start over ssh, too
HEARTBEAT = 1.0  # seconds between the remote agent's beats
LOST_AFTER = 3.0  # seconds a started session may send nothing before its host counts as lost


class StartError(RuntimeError):
    """A rank could not be started at all; `code` is what the job exits with (126/127)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class RankProcess(Protocol):
    """What the supervisor needs from a rank, wherever it runs."""

    rank: int
    host: str

    def poll(self) -> int | None:
        """The exit status (128+N for signal N) once the rank has ended, else None."""

    def ended_at(self) -> float | None:
        """When the rank ended (time.monotonic()), as soon as that is known, else None."""

    def signal(self, sig: int) -> None:
        """Send `sig` to the rank's whole process group."""

    def kill(self) -> None:
        """SIGKILL the rank's process group."""

    def force(self) -> None:
        """Last resort after kill(): cut the rank loose (e.g. kill its ssh client)."""

    def cleanup(self) -> None:
        """After the rank ended: kill whatever it left in its group, wait for its output."""

    def describe(self, code: int) -> str:
        """How the rank ended, as a phrase: 'exited with code 3'."""

    def lost(self) -> str | None:
        """Why the launcher lost contact with the rank's host ('its ssh session went silent'),
        once poll() has given its code, or None when the rank ended by itself."""

    def silence(self) -> float:
        """Seconds since the rank's host was last heard from (0 for a rank on this machine)."""

    def cut_off(self, reason: str) -> None:
        """Give the rank up as lost with its host: kill its ssh client; poll() then ends it."""


def describe_code(code: int, signalled: bool) -> str:
    """'exited with code 3' or 'was killed by signal SIGKILL (9)'."""
    if signalled:
        sig = code - 128
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"was killed by {name} ({sig})"
    return f"exited with code {code}"


class LocalRank:
    """A rank on this machine, in a new session so that its whole group can be signalled."""

    def __init__(
        self, plan: RankPlan, cwd: str, mux: OutputMux, environ: Mapping[str, str]
    ) -> None:
        self.rank = plan.rank
        self.host = plan.host.name
        self._signalled = False
        env = dict(environ)
        env.update(plan.env)
        # First on its path: a hint for mx.distributed programs run without the compat layer.
        env["PYTHONPATH"] = ranksite.python_path(env.get("PYTHONPATH", ""))
        mux.open_log(plan.rank)
        if not os.path.isdir(cwd):
            raise StartError(f"rank {plan.rank}: the working directory {cwd} does not exist", 127)
        try:
            cpus = cpu_share(*plan.cpu_share) if plan.cpu_share else None
        except BindError as e:
            raise StartError(f"rank {plan.rank}: {e}", 2) from None
        try:
            with on_cpus(cpus):
                self._proc = subprocess.Popen(
                    list(plan.argv),
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
        except OSError as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            raise StartError(
                f"rank {plan.rank}: cannot run {plan.argv[0]!r} in {cwd}: {e.strerror}", code
            ) from None
        log.debug("rank %d: local pid %d%s", self.rank, self._proc.pid, f" on CPUs {cpus}" if cpus else "")
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._threads = [
            pump(self._proc.stdout, lambda d: mux.line(self.rank, d)),
            pump(self._proc.stderr, lambda d: mux.line(self.rank, d, err=True)),
        ]
        # A thread waits for the exit, so that its time is known to the millisecond, not to
        # the supervisor's poll: the first rank to fail is the one to report.
        self._ended: float | None = None
        self._ended_lock = threading.Lock()
        threading.Thread(target=self._wait, name=f"rank {self.rank} wait", daemon=True).start()

    def _wait(self) -> None:
        with self._ended_lock:  # held from before the exit: ended_at() waits for the stamp
            self._proc.wait()
            self._ended = time.monotonic()

    def ended_at(self) -> float | None:
        if self._proc.returncode is None:
            return None
        with self._ended_lock:
            return self._ended

    def poll(self) -> int | None:
        code = self._proc.returncode
        if code is None or self.ended_at() is None:
            return None
        # Let its last lines (a traceback, often) out before anyone reports how it ended; a
        # grandchild holding the pipes open only costs this short wait.
        _join(self._threads, 0.5)
        if code < 0:
            self._signalled = True
            return 128 - code
        return code

    def signal(self, sig: int) -> None:
        _killpg(self._proc.pid, sig)

    def kill(self) -> None:
        _killpg(self._proc.pid, signal.SIGKILL)

    def force(self) -> None:
        self.kill()

    def cleanup(self) -> None:
        # A rank's leftovers (background children) share its group: they end with it.
        self.kill()
        _join(self._threads, 2.0)

    def describe(self, code: int) -> str:
        return describe_code(code, self._signalled)

    def lost(self) -> str | None:
        return None

    def silence(self) -> float:
        return 0.0

    def cut_off(self, reason: str) -> None:
        pass


def _run_request(plan: RankPlan, cwd: str, grace: float, heartbeat: float, marker: str) -> dict:
    """What the agent on a rank's host is asked to do (fastcoll/launch/agent.py, run_mode)."""
    return {"mode": "run", "argv": list(plan.argv), "env": dict(plan.env), "cwd": cwd, "grace": grace,
            "marker": marker, "heartbeat": heartbeat,
            "cpu_share": list(plan.cpu_share) if plan.cpu_share else None}


class RemoteRank:
    """A rank on another host: ssh runs the agent there, which runs the rank.

    The agent's status lines arrive on ssh's stderr after a random marker: `started PID`, then
    `beat` every `heartbeat` seconds, then `exit N` or `signal N`. Without `started`, ssh itself
    failed, and its stderr says why. A started session that ends without a status, or sends
    nothing for `lost_after` seconds, has lost its host: poll() ends the rank with 255 and lost()
    says which of the two.
    """

    def __init__(
        self,
        plan: RankPlan,
        cwd: str,
        mux: OutputMux,
        *,
        ssh: list[str] | None,
        python: str,
        grace: float,
        job_id: str,
        heartbeat: float = HEARTBEAT,
        lost_after: float = LOST_AFTER,
    ) -> None:
        self.rank = plan.rank
        self.host = plan.host.name
        self._mux = mux
        self._python = python
        self._marker = f"\x1efastcoll-agent:{secrets.token_hex(8)}:".encode()
        self._started = False
        self._status: tuple[str, int] | None = None
        self._prestart: list[bytes] = []
        self._failure: str | None = None
        self._lost: str | None = None
        self._forced = False
        self._heartbeat = heartbeat
        self._silent_after = lost_after
        self._heard = time.monotonic()  # the last line of any kind from the agent
        self._ended: float | None = None  # when its exit status arrived, or ssh's end was seen
        self._awaited = False  # poll() waited once for ssh to follow the status line
        self._polled = self._heard  # the supervisor's last poll()
        self._stderr_done = threading.Event()
        self._inbox: queue.Queue[bytes | None] = queue.Queue()
        mux.open_log(plan.rank)
        argv = agent_command(ssh, plan.host.name, python, f"job={job_id},rank={plan.rank}")
        log.debug("rank %d: %s", self.rank, " ".join(argv[:-1]))
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the terminal is the launcher's to forward
            )
        except OSError as e:
            raise StartError(f"rank {plan.rank}: cannot run ssh ({argv[0]}): {e.strerror}", 127)
        self._inbox.put(agent_payload(_run_request(plan, cwd, grace, heartbeat, self._marker.decode())))
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._write_stdin, daemon=True),
            pump(self._proc.stdout, lambda d: mux.line(self.rank, d)),
            pump(self._proc.stderr, self._on_stderr, on_eof=self._stderr_done.set),
        ]
        self._threads[0].start()

    # The writer thread owns ssh's stdin, so a full pipe (ssh still connecting) never blocks
    # the supervisor; signals queue behind the request.
    def _write_stdin(self) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while True:
                data = self._inbox.get()
                if data is None:
                    break
                stdin.write(data)
                stdin.flush()
        except (OSError, ValueError):
            pass
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    def _on_stderr(self, data: bytes) -> None:
        self._heard = time.monotonic()
        at = data.find(self._marker)
        if at < 0:
            if self._started:
                self._mux.line(self.rank, data, err=True)
            else:
                self._prestart.append(data)  # ssh's complaints, or a login script's chatter
            return
        if at > 0:  # the rank's last line had no newline; the status line followed it
            self._mux.line(self.rank, data[:at], err=True)
        words = data[at + len(self._marker):].split()
        if words == [b"beat"]:
            return
        if words[:1] == [b"started"]:
            self._started = True
            for line in self._prestart:
                self._mux.line(self.rank, line, err=True)
            self._prestart.clear()
        elif len(words) == 2 and words[0] in (b"exit", b"signal") and words[1].isdigit():
            self._ended = time.monotonic()
            self._status = (words[0].decode(), int(words[1]))
            for line in self._prestart:  # the agent's own complaint (e.g. no such --cwd)
                self._mux.line(self.rank, line, err=True)
            self._prestart.clear()

    def ended_at(self) -> float | None:
        return self._ended

    def poll(self) -> int | None:
        code = self._poll()
        if code is not None and self._ended is None:
            self._ended = time.monotonic()
        return code

    def _poll(self) -> int | None:
        if self._lost is not None:
            self._proc.poll()  # reap the ssh client cut_off() killed
            return SSH_FAILED
        code = self._proc.poll()
        if code is None and self._status is not None and not self._awaited:
            # The agent exits right after its status line: end this rank in the same sweep as
            # a rank that ended after it, so that the first to fail is the one reported.
            self._awaited = True
            try:
                code = self._proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        if code is None:
            now = time.monotonic()
            if now - self._polled > self._heartbeat:
                # The launcher itself was not running (stopped, suspended, starved): what the
                # agent sent meanwhile may still be in the pipe. A fresh window, not a verdict.
                self._heard = max(self._heard, now)
            self._polled = now
            silent = self.silence()
            if self._status is None and silent > self._silent_after:
                self.cut_off(f"its ssh session went silent (nothing for {silent:.1f} s; "
                             f"the agent there beats every {self._heartbeat:g} s)")
                return SSH_FAILED
            return None
        self._stderr_done.wait(2.0)  # the status line may still be in the pipe
        _join(self._threads[1:2], 0.5)  # and its last lines of stdout
        if self._status is not None:
            kind, n = self._status
            return 128 + n if kind == "signal" else n
        if not self._started:
            self._failure = explain_ssh_failure(self.host, code, self._prestart, self._python)
            for line in self._prestart:
                log.debug("rank %d ssh: %r", self.rank, line)
            return code if code not in (0, None) else SSH_FAILED
        self._failure = f"lost its ssh connection to {self.host} (ssh exited with code {code})"
        if not self._forced:
            self._lost = f"its ssh session ended (ssh exited with code {code})"
        return SSH_FAILED

    def lost(self) -> str | None:
        return self._lost

    def silence(self) -> float:
        """Seconds since the agent was last heard from, once it has started the rank (before,
        ssh's ConnectTimeout bounds the wait), and while no exit status has come."""
        if not self._started or self._status is not None:
            return 0.0
        return time.monotonic() - self._heard

    def cut_off(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            self._failure = f"lost contact with {self.host}: {reason}"
            log.debug("rank %d: %s", self.rank, reason)
        self.force()
        self._inbox.put(None)

    def signal(self, sig: int) -> None:
        self._inbox.put(b"signal %d\n" % sig)

    def kill(self) -> None:
        self._inbox.put(b"signal %d\n" % signal.SIGKILL)
        self._inbox.put(None)  # end of input: the agent kills the group too, then exits

    def force(self) -> None:
        self._forced = True  # its end is then the launcher's doing, not a lost host
        _killpg(self._proc.pid, signal.SIGKILL)

    def cleanup(self) -> None:
        self._inbox.put(None)
        try:
            self._proc.wait(timeout=0.5 if self._lost else 5.0)
        except subprocess.TimeoutExpired:
            self.force()
            self._proc.wait()
        _join(self._threads, 2.0)

    def describe(self, code: int) -> str:
        if self._failure is not None:
            return f"could not run: {self._failure}" if not self._started else self._failure
        if self._status is not None:
            return describe_code(code, self._status[0] == "signal")
        return describe_code(code, False)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _join(threads: list[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        if t.is_alive() or t.ident is not None:
            t.join(max(0.0, deadline - time.monotonic()))

