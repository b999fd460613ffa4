"""A throwaway PostgreSQL server on loopback for tests: its own data directory, started and stopped by PID.

The binaries are the machine's (Debian's ``postgresql`` package, which ``bash .ci/bootstrap`` installs): ``initdb``
and ``postgres`` on PATH, else the newest ``/usr/lib/postgresql/<version>/bin``. Each :class:`PostgresServer`
initialises a fresh cluster in a temporary directory (trust authentication, no fsync), listens on 127.0.0.1 on a
port that was free a moment before, keeps its unix socket in that directory, and on :meth:`~PostgresServer.stop`
is ended by PID and its directory removed::

    with PostgresServer.start() as server:
        dsn = server.create_database("orders")   # postgresql://postgres@127.0.0.1:<port>/orders

PostgreSQL refuses to run as root: under euid 0 the server runs as the ``postgres`` user (Debian's package creates
it), and the temporary directory belongs to that user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

from worker_lib.core.clock import SYSTEM_CLOCK, Clock
from worker_lib.core.errors import ShardleaseError
from worker_lib.testing.emulators import free_port

log = logging.getLogger(__name__)

DEBIAN_ROOT = Path("/usr/lib/postgresql")
SUPERUSER = "postgres"  # the cluster's superuser (initdb -U), whoever runs the server
RUN_AS_WHEN_ROOT = "postgres"  # the OS user Debian's package creates

START_TIMEOUT_S = 60.0
"""initdb plus the server accepting connections (0.7 s on an idle 2-core machine); past this it hangs."""

STOP_TIMEOUT_S = 10.0
"""A fast shutdown (about 0.1 s); past this the server and its backends are SIGKILLed."""

COMMAND_TIMEOUT_S = 30.0
"""One ``psql`` statement (CREATE / DROP DATABASE); past this it hangs."""

# No durability: a test's cluster is thrown away, and fsync dominates the time of small transactions.
SPEED_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")

_BIND_ATTEMPTS = 3  # the free port was taken between probing and binding: try another one
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # database names need no quoting this way


class PostgresError(ShardleaseError):
    """The test PostgreSQL server could not be found, started or used."""


@dataclass(frozen=True)
class PostgresBinaries:
    """Where ``initdb``, ``postgres`` and ``psql`` of one PostgreSQL installation are."""

    initdb: Path
    postgres: Path
    psql: Path


def find_binaries(*, path: str | None = None, debian_root: Path = DEBIAN_ROOT) -> PostgresBinaries:
    """``initdb`` and ``postgres`` on ``path`` (default ``$PATH``), else in the highest-versioned
    ``<debian_root>/<version>/bin``; ``psql`` beside them (symlinks followed), else on ``path``."""
    candidates: list[Path] = []
    on_path = shutil.which("postgres", path=path), shutil.which("initdb", path=path)
    if on_path[0] and on_path[1]:
        candidates.append(Path(on_path[0]).resolve().parent)
    versions = [d for d in debian_root.glob("*/bin") if d.parent.name.replace(".", "").isdigit()]
    candidates += sorted(versions, key=lambda d: tuple(int(p) for p in d.parent.name.split(".")), reverse=True)
    for bin_dir in candidates:
        initdb, postgres = bin_dir / "initdb", bin_dir / "postgres"
        if os.access(initdb, os.X_OK) and os.access(postgres, os.X_OK):
            psql = bin_dir / "psql"
            if not os.access(psql, os.X_OK):
                found = shutil.which("psql", path=path)
                if found is None:
                    raise PostgresError(f"psql not found beside {postgres} nor on PATH: run `bash .ci/bootstrap`")
                psql = Path(found)
            return PostgresBinaries(initdb=initdb, postgres=postgres, psql=psql)
    raise PostgresError(
        f"PostgreSQL not found (initdb and postgres neither on PATH nor in {debian_root}/<version>/bin): "
        "run `bash .ci/bootstrap` (it installs Debian's postgresql package)"
    )


def _tail(log_path: Path, lines: int = 4) -> str:
    """The last ``lines`` lines of a log, on one line."""
    if not log_path.is_file():
        return "(no log)"
    last = log_path.read_text(errors="replace").strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in last) or "(empty log)"


class PostgresServer:
    """A running PostgreSQL cluster of its own (see the module's docstring). A context manager that stops it."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        *,
        port: int,
        directory: Path,
        binaries: PostgresBinaries,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.process = process
        self.port = port
        self.directory = directory
        self.binaries = binaries
        self.clock = clock

    # --- starting -------------------------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        *,
        timeout_s: float = START_TIMEOUT_S,
        binaries: PostgresBinaries | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> PostgresServer:
        """initdb a fresh cluster in a temporary directory and start it on a free loopback port; returns once it
        accepts connections. Raises :class:`PostgresError` (one line, with the log's tail) if that fails or takes
        longer than ``timeout_s``."""
        binaries = binaries or find_binaries()
        deadline = clock.monotonic() + timeout_s
        run_as = _unprivileged_user()
        directory = Path(tempfile.mkdtemp(prefix="shardlease-postgres-"))
        server: PostgresServer | None = None
        try:
            if run_as is not None:
                os.chown(directory, run_as.pw_uid, run_as.pw_gid)
            cls._initdb(binaries, directory, run_as, deadline, clock)
            attempts = 1
            server = cls._launch(binaries, directory, run_as, clock)
            while not server._wait_ready(deadline, may_retry=attempts < _BIND_ATTEMPTS):
                attempts += 1
                server = cls._launch(binaries, directory, run_as, clock)
        except BaseException:  # a Ctrl-C during the wait too: nothing is left running
            if server is not None:
                server._end_process()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        log.info("started postgres pid=%d at %s (%s)", server.pid, server.dsn, binaries.postgres)
        return server

    @staticmethod
    def _initdb(
        binaries: PostgresBinaries, directory: Path, run_as: pwd.struct_passwd | None, deadline: float, clock: Clock
    ) -> None:
        log_path = directory / "initdb.log"
        argv = [str(binaries.initdb), "-D", str(directory / "data"), "-U", SUPERUSER, "--auth=trust"]
        argv += ["--encoding=UTF8", "--locale=C", "--no-sync"]  # C locale: no dependency on the machine's locales
        # its group holds the bootstrap backend it runs: killed with it
        process = _spawn(argv, log_path, directory, run_as)
        try:
            code = process.wait(timeout=max(0.0, deadline - clock.monotonic()))
        except BaseException as exc:  # a hang, or a Ctrl-C: its process group goes either way
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise PostgresError(f"initdb did not finish within its bound: {_tail(log_path)}") from None
            raise
        if code != 0:
            raise PostgresError(f"initdb failed with code {code}: {_tail(log_path)}")

    @classmethod
    def _launch(
        cls, binaries: PostgresBinaries, directory: Path, run_as: pwd.struct_passwd | None, clock: Clock
    ) -> PostgresServer:
        port = free_port()
        argv = [str(binaries.postgres), "-D", str(directory / "data"), "-h", "127.0.0.1", "-p", str(port)]
        argv += ["-k", str(directory)]  # its unix socket, out of the shared /var/run/postgresql
        for setting in SPEED_SETTINGS:
            argv += ["-c", setting]
        # a new session: a Ctrl-C meant for the test run is not a shutdown request
        process = _spawn(argv, directory / "server.log", directory, run_as)
        return cls(process, port=port, directory=directory, binaries=binaries, clock=clock)

    def _wait_ready(self, deadline: float, *, may_retry: bool) -> bool:
        """Whether it accepts connections (``ready`` in postmaster.pid); ``False`` if it lost its port to another
        process and may try another one; raises otherwise, having stopped it."""
        log_path = self.directory / "server.log"
        while self.clock.monotonic() < deadline:
            if self._status() == "ready":
                return True
            if self.process.poll() is not None:
                if may_retry and "could not bind" in log_path.read_text(errors="replace"):
                    log_path.unlink()
                    return False
                raise PostgresError(
                    f"postgres exited with code {self.process.returncode} before accepting connections: "
                    f"{_tail(log_path)}"
                )
            self.clock.sleep(0.02)
        self._end_process()
        raise PostgresError(f"postgres did not accept connections within its bound: {_tail(log_path)}")

    def _status(self) -> str:
        """postmaster.pid's status line (its 8th: ``starting``, ``ready``, ``stopping``), or ``""``."""
        try:
            lines = (self.directory / "data" / "postmaster.pid").read_text().splitlines()
        except OSError:
            return ""
        return lines[7].strip() if len(lines) > 7 else ""

    # --- using it -------------------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The postmaster's PID (the server's backends are its children)."""
        return self.process.pid

    def is_running(self) -> bool:
        return self.process.poll() is None

    def dsn_for(self, database: str) -> str:
        """The connection string (a libpq URI, as psycopg takes it) of ``database`` on this server."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def dsn(self) -> str:
        """The connection string of the ``postgres`` database: ``postgresql://postgres@127.0.0.1:<port>/postgres``."""
        return self.dsn_for("postgres")

    @property
    def url(self) -> str:
        """The same as :attr:`dsn`, for code that asks for a URL."""
        return self.dsn

    def create_database(self, name: str) -> str:
        """Create database ``name`` (lower-case letters, digits, ``_``); its connection string."""
        self._psql(f"CREATE DATABASE {_checked(name)}")
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, ending the sessions still connected to it; no error if it does not exist."""
        self._psql(f"DROP DATABASE IF EXISTS {_checked(name)} WITH (FORCE)")

    def _psql(self, statement: str) -> None:
        argv = [str(self.binaries.psql), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dsn, "-c", statement]
        try:
            result = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise PostgresError(f"{statement!r} did not finish within {COMMAND_TIMEOUT_S:.0f} s") from exc
        if result.returncode != 0:
            raise PostgresError(f"{statement!r} failed: {result.stderr.strip()}")

    # --- stopping -------------------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """End the server by PID and remove its directory (idempotent).

        SIGINT first: PostgreSQL's *fast* shutdown, which ends open sessions (its SIGTERM, a *smart* shutdown, waits
        for every client to disconnect, so one leaked connection would hold it up). Past ``timeout_s``: SIGKILL to
        the postmaster and to each of its backends, which run in sessions of their own."""
        self._end_process(timeout_s)
        if self.directory.exists():
            shutil.rmtree(self.directory)

    def _end_process(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if self.process.poll() is not None:
            return
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        self.process.wait(timeout=timeout_s)
        psutil.wait_procs(children, timeout=timeout_s)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"PostgresServer(pid={self.pid}, dsn={self.dsn!r})"


def _spawn(
    argv: list[str], log_path: Path, directory: Path, run_as: pwd.struct_passwd | None
) -> subprocess.Popen[bytes]:
    """``argv`` in a new session, output appended to ``log_path``, run as ``run_as`` itself (no runuser between: the
    PID is the program's)."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
            start_new_session=True,
            user=_uid(run_as),
            group=_gid(run_as),
            extra_groups=_groups(run_as),
        )


def _checked(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"database name {name!r}: use at most 63 lower-case letters, digits and _, not first a digit")
    return name


def _unprivileged_user() -> pwd.struct_passwd | None:
    """Whom to run initdb and postgres as: ``None`` (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(RUN_AS_WHEN_ROOT)
    except KeyError:
        raise PostgresError(
            f"running as root, and there is no {RUN_AS_WHEN_ROOT!r} user to run PostgreSQL as (it refuses root): "
            "run `bash .ci/bootstrap` (Debian's postgresql package creates that user)"
        ) from None


# subprocess's user, group and extra_groups for running a child as ``user`` (None: as ourselves).
def _uid(user: pwd.struct_passwd | None) -> int | None:
    return None if user is None else user.pw_uid


def _gid(user: pwd.struct_passwd | None) -> int | None:
    return None if user is None else user.pw_gid


def _groups(user: pwd.struct_passwd | None) -> list[int] | None:
    return None if user is None else []  # drop root's supplementary groups
