"""The ssh side: the command that starts the agent on a host, what it is sent, what failure means.

The ssh command line carries only the interpreter and a fixed bootstrap; the agent's source, the
rank's argv and its environment (the job's token among them) travel on ssh's standard input, so
`ps` on the remote host never shows the token.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from fastcoll.launch import agent

log = logging.getLogger("fastcoll.launch")

# BatchMode: never prompt (a prompt would hang the job invisibly); -T: no terminal, so the
# remote side ends through the agent, which sees end of input when ssh goes away.
SSH_OPTIONS = (
    "-T",
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ServerAliveInterval=5",
    "-o", "ServerAliveCountMax=3",
)


class RemoteError(RuntimeError):
    """A remote host could not be used; the message names the host and what to do."""


def agent_command(
    ssh: Sequence[str] | None, host: str | None, python: str, label: str
) -> list[str]:
    """argv that starts the agent: over ssh on `host`, or here when `host` is None.

    `label` is shown by `ps` beside the agent (a job id and rank, never a secret).
    """
    inner = [python, "-u", "-c", agent.BOOTSTRAP, "fastcoll-agent", label]
    if host is None:
        return inner
    # ssh joins its arguments into one string for the remote login shell: quote once, here.
    return [*(ssh or ["ssh"]), *SSH_OPTIONS, host, "exec " + shlex.join(inner)]


def agent_payload(request: dict) -> bytes:
    """What the agent reads first on stdin: its own source, then the JSON request line."""
    source = Path(agent.__file__).read_bytes()
    return b"%d\n" % len(source) + source + json.dumps(request).encode() + b"\n"


def ssh_config_lines(host: str) -> str:
    """The ssh_config lines that name `host` (`Host NAME`, and `User USER` for user@host: a Host
    line takes a name only), joined with " / " for a sentence."""
    user, at, name = host.rpartition("@")
    return f"Host {name} / User {user}" if at else f"Host {host}"


def explain_ssh_failure(host: str, code: int | None, lines: Sequence[bytes], python: str) -> str:
    """A clear sentence for an ssh that ended before the agent started on `host`."""
    text = b"".join(lines).decode(errors="replace").strip()
    low = text.lower()
    if "permission denied" in low or "too many authentication failures" in low:
        why = (f"host {host} refused the ssh key. The launcher runs ssh with BatchMode=yes, "
               f"so it cannot ask for a password: set up key login (ssh-copy-id {host}) and "
               f"check that `ssh {host} true` works without a prompt")
    elif "host key verification failed" in low:
        why = f"the host key of {host} is not known: run `ssh {host} true` once to accept it"
    elif "could not resolve hostname" in low or "name or service not known" in low:
        why = f"cannot resolve host name {host}"
    elif "connection refused" in low:
        why = (f"host {host} refused the ssh connection: no ssh server listens there. Start it "
               "(macOS: System Settings > General > Sharing > Remote Login; Linux: the sshd "
               f"service), or, if it listens on another port, name the port in ~/.ssh/config "
               f"({ssh_config_lines(host)} / Port N) or with --ssh 'ssh -p N'")
    elif any(s in low for s in ("timed out", "no route to host", "network is unreachable")):
        why = (f"host {host} is unreachable over ssh: check its name or address and the "
               f"network between here and there, then that `ssh {host} true` works")
    elif any(s in low for s in ("connection closed", "reset by peer")):
        why = (f"host {host} closed the ssh connection before the login finished: check that "
               f"`ssh {host} true` works (a firewall, or sshd's MaxStartups, can drop connections)")
    elif code in (126, 127) or "not found" in low or "no such file" in low:
        why = (f"cannot start Python on {host}: the launcher runs {python} there; pass "
               "--python with the interpreter's path on that host")
    else:
        why = f"ssh to {host} failed (exit code {code})"
    if text:
        why += f" [ssh: {text.splitlines()[-1].strip()}]"
    return why


class AgentSession:
    """An agent in a `check` or `port` conversation: JSON lines after a marker on its stdout.

    Lines of stdout without the marker (a login script's chatter) are skipped; stderr is kept
    for the error message.
    """

    def __init__(self, argv: list[str], request: dict, marker: str) -> None:
        self.marker = marker.encode()
        self.stderr: list[bytes] = []
        self._replies: queue.Queue[dict | None] = queue.Queue()
        log.debug("starting agent: %s", shlex.join(argv[:-1]))
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.send_raw(agent_payload(request))

    def send_raw(self, data: bytes) -> bool:
        """Write to the agent's stdin; False when it is gone."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def send(self, obj: dict) -> bool:
        """Send one JSON request line."""
        return self.send_raw(json.dumps(obj).encode() + b"\n")

    def reply(self, timeout: float) -> dict | None:
        """The next JSON reply, or None when the agent ended or `timeout` passed."""
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self, wait: float = 5.0) -> int | None:
        """End the conversation (end of input), and make sure the process is gone."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            return self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            _killpg(self.proc.pid)
            return self.proc.wait()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self.marker):
                try:
                    self._replies.put(json.loads(line[len(self.marker):]))
                except ValueError:
                    log.debug("bad agent reply: %r", line)
        self._replies.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            del self.stderr[:-50]


def remote_free_port(
    ssh: Sequence[str] | None, host: str, python: str, timeout: float = 30.0
) -> int:
    """Ask `host` for a TCP port that is free there now (the coordinator's port)."""
    argv = agent_command(ssh, host, python, "port")
    try:
        done = subprocess.run(
            argv,
            input=agent_payload({"mode": "port"}),
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(f"host {host} did not answer over ssh within {timeout:.0f} s") from None
    except OSError as e:
        raise RemoteError(f"cannot run ssh ({argv[0]}): {e.strerror}") from None
    words = done.stdout.split()
    if done.returncode != 0 or not words or not words[-1].isdigit():
        lines = done.stderr.splitlines(keepends=True)
        raise RemoteError(explain_ssh_failure(host, done.returncode, lines, python))
    return int(words[-1])


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
