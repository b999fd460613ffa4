"""One MultiLang child process: its stdin for our messages, its stdout for its answers, its stderr for our log.

The child runs in a session of its own: a Ctrl-C in the daemon's terminal reaches the daemon only, which then asks
every child to checkpoint (``shutdownRequested``) before it ends them; a child killed by the terminal first could
not. When the daemon dies, the children read end-of-file on stdin and exit (kclpy and aws-kcl both do).

Two threads per child, both daemons: one reads stdout lines into a queue (so that a wait for an answer can time
out), one copies stderr into the log, each line prefixed with the shard id (the MultiLangDaemon lost it: KCL #772).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from worker_lib.processing.processor import ProcessorFailedError

log = logging.getLogger(__name__)
child_log = logging.getLogger("worker_lib.multilang.stderr")  # the children's own lines, one logger to filter on

_EOF = None
_STDERR_PAUSE_S = 0.2  # a partial stderr line is logged once the child has written nothing for this long
_STDERR_MAX_LINE = 8_192  # ... or once it is this long


class ChildFailedError(ProcessorFailedError):
    """The child exited, could not start, broke the protocol or did not answer in time."""


class ChildProcess:
    """A started child (:meth:`start`), named in every log line by ``shard_id``."""

    def __init__(self, process: subprocess.Popen[bytes], *, shard_id: str) -> None:
        self.process = process
        self.shard_id = shard_id
        self._lines: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None and process.stderr is not None  # started with pipes
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(process.stdout,), daemon=True, name=f"ml-out-{shard_id}"),
            threading.Thread(target=self._copy_stderr, args=(process.stderr,), daemon=True, name=f"ml-err-{shard_id}"),
        ]
        for reader in self._readers:
            reader.start()

    @classmethod
    def start(
        cls,
        command: Sequence[str],
        *,
        shard_id: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ChildProcess:
        try:
            process = subprocess.Popen(
                list(command),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise ChildFailedError(
                f"multilang child for {shard_id} could not start: {' '.join(command)}: {exc.strerror or exc}"
            ) from exc
        log.info("multilang child started shard=%s pid=%d", shard_id, process.pid)
        return cls(process, shard_id=shard_id)

    @property
    def pid(self) -> int:
        return self.process.pid

    # --- talking ----------------------------------------------------------------------------------------------

    def send(self, line: str) -> None:
        """Write one line to the child's stdin; a child that is gone is :class:`ChildFailedError`."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(line.encode("utf-8"))
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise self.gone() from exc

    def next_line(self, timeout_s: float | None) -> str | None:
        """The next stdout line; ``None`` at end-of-file (the child closed stdout or exited). Raises
        :class:`queue.Empty` after ``timeout_s`` (``None``: wait as long as it takes)."""
        return self._lines.get(timeout=timeout_s)

    def gone(self) -> ChildFailedError:
        """The error for a child that stopped talking: with its exit code once it has one."""
        code = self.exit_code(wait_s=2.0)
        how = "is still running but closed its output" if code is None else _exit_description(code)
        return ChildFailedError(f"multilang child for {self.shard_id} (pid {self.pid}) {how}")

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        try:
            return self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    # --- ending -----------------------------------------------------------------------------------------------

    def close(self, grace_s: float = 5.0) -> int | None:
        """End-of-file on stdin (the clients exit on it); after ``grace_s`` SIGKILL. The exit code."""
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        code = self.exit_code(wait_s=grace_s)
        if code is None:
            self.kill()
            code = self.exit_code(wait_s=5.0)
        for reader in self._readers:
            reader.join(1.0)
        log.info("multilang child ended shard=%s pid=%d %s", self.shard_id, self.pid, _exit_description(code))
        return code

    def kill(self) -> None:
        """SIGKILL the child's process group (it may have started processes of its own)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    # --- the reader threads -----------------------------------------------------------------------------------

    def _read_stdout(self, stream: IO[bytes]) -> None:
        try:
            for raw in stream:
                self._lines.put(raw.decode("utf-8", errors="replace"))
        except (OSError, ValueError):
            pass
        finally:
            self._lines.put(_EOF)

    def _copy_stderr(self, stream: IO[bytes]) -> None:
        """Each line into the log as it comes; a partial line once the child pauses (kclpy's sample writes its
        lines without a newline: they would otherwise show only when the child exits)."""
        fd = stream.fileno()
        pending = b""
        with contextlib.suppress(OSError, ValueError):
            while True:
                ready, _, _ = select.select([fd], [], [], _STDERR_PAUSE_S)
                if not ready:
                    pending = self._log_stderr(pending)
                    continue
                chunk = os.read(fd, 65_536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._log_stderr(line)
                if len(pending) > _STDERR_MAX_LINE:
                    pending = self._log_stderr(pending)
        self._log_stderr(pending)

    def _log_stderr(self, raw: bytes) -> bytes:
        text = raw.decode("utf-8", errors="replace").rstrip()
        if text:
            child_log.warning("[%s] %s", self.shard_id, text)  # shown at the default level, as KCL does
        return b""


def _exit_description(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name} (exit code {code})"
    return f"exited with code {code}"
