"""The embedded PostgreSQL manager: init, restart, attach, ownership, signals.

Tests of initdb get an empty dir (``fresh_dir``); the others share one cluster
(``cluster``). Both fixtures kill, on teardown, every server still running in their
dir, so a failing test never leaks a postmaster into the next test or run.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import pytest

from gateway import embedded
from gateway.embedded import (
    EmbeddedPostgres,
    ServerMemory,
    ensure_embedded,
    machine_memory_mb,
    postgres_bin_dir,
)
from gateway.errors import DatabaseUnavailable
from gateway.settings import Settings

PROJECT_ROOT = Path(__file__).resolve().parents[1]

_TIMINGS: list[tuple[str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def _report_timings(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the measured timings at the end (shown even with ``-q``)."""
    yield
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is None or capture is None or not _TIMINGS:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for label, seconds in _TIMINGS:
            reporter.write_line(f"embedded postgres timing: {label:<28} {seconds * 1000:7.1f} ms")


def _timed(label: str, fn: Callable[[], object]) -> None:
    t0 = time.perf_counter()
    fn()
    _TIMINGS.append((label, time.perf_counter() - t0))


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """kill(0), but a zombie (stopped, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def _kill_servers(root: Path) -> None:
    """Last-resort cleanup, independent of the code under test: immediate shutdown of
    every postmaster of a cluster under ``root`` (only real postgres processes: a test
    plants fake postmaster.pid files naming other pids)."""
    for pid_file in root.glob("**/pgdata/postmaster.pid"):
        pid = _postmaster_pid(pid_file.parent.parent)
        if pid is None or not _alive(pid) or not _is_postgres(pid):
            continue
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return pid != os.getpid()


def _assert_no_server(data_dir: Path, pid: int | None = None) -> None:
    if pid is not None:
        assert not _alive(pid), f"postmaster {pid} still running"
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
    isready = subprocess.run(
        [str(postgres_bin_dir() / "pg_isready"), "-q", "-h", str(data_dir / "run"), "-t", "1"],
        check=False,
    )
    assert isready.returncode != 0


@pytest.fixture(scope="module")
def _shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One initialised data dir for the module: initdb and copying a cluster both
    cost about a second of disk I/O here, restarting one costs 0.15 s."""
    path = tmp_path_factory.mktemp("shared")
    try:
        EmbeddedPostgres(path).start().stop()
        yield path
    finally:
        _kill_servers(path)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster(_shared_cluster: Path) -> Iterator[Path]:
    """The shared data dir with a stopped server; whatever a test leaves behind
    (a running or orphaned server, a planted postmaster.pid, a broken setting) is undone."""
    path = _shared_cluster
    _reset_cluster(path)
    yield path
    _reset_cluster(path)


def _reset_cluster(path: Path) -> None:
    _kill_servers(path)
    pgdata = path / "pgdata"
    (pgdata / "postmaster.pid").unlink(missing_ok=True)  # no live server: stale
    (pgdata / "postgresql.auto.conf").write_text("")
    (path / "server.owner").unlink(missing_ok=True)


@pytest.fixture
def fresh_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty data dir (short path) for the tests of initdb itself."""
    path = tmp_path_factory.mktemp("fresh")
    yield path
    _kill_servers(path)
    shutil.rmtree(path, ignore_errors=True)


async def _vector_version(dsn: str) -> str | None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        version: str | None = await conn.fetchval(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        )
        return version
    finally:
        await conn.close()


async def test_first_start_inits_and_serves(fresh_dir: Path) -> None:
    data_dir = fresh_dir / "nested" / "data"  # start() creates missing folders
    pg = EmbeddedPostgres(data_dir)
    try:
        _timed("first start (initdb+start)", pg.start)
        assert pg.owns_server and pg.is_running()
        assert (data_dir / "pgdata" / "PG_VERSION").read_text().strip() == "18"
        assert pg.socket_dir == data_dir / "run"
        assert pg.dsn.startswith("postgresql://postgres@/recall?host=")
        version = await _vector_version(pg.dsn)
        assert version is not None and version.startswith("0.8")
        conn = await asyncpg.connect(pg.dsn)
        try:
            assert await conn.fetchval("SHOW fsync") == "on"
            assert await conn.fetchval("SHOW listen_addresses") == ""
            assert await conn.fetchval("SELECT '[1,2]'::vector <-> '[1,3]'::vector") == 1.0
        finally:
            await conn.close()
    finally:
        pid = pg.pid if pg.is_running() else None
        pg.stop()
    _assert_no_server(data_dir, pid)


async def test_restart_reuses_the_data(cluster: Path) -> None:
    data_dir = cluster
    with EmbeddedPostgres(data_dir) as pg:
        conn = await asyncpg.connect(pg.dsn)
        await conn.execute(
            "DROP TABLE IF EXISTS kept; CREATE TABLE kept (id int PRIMARY KEY);"
            " INSERT INTO kept VALUES (7)"
        )
        await conn.close()
    assert not EmbeddedPostgres(data_dir).is_running()

    again = EmbeddedPostgres(data_dir)
    try:
        _timed("restart (existing cluster)", again.start)
        assert again.owns_server
        conn = await asyncpg.connect(again.dsn)
        assert await conn.fetchval("SELECT id FROM kept") == 7
        await conn.close()
    finally:
        again.stop()
    assert not again.is_running()


async def test_attached_object_does_not_stop_the_server(cluster: Path) -> None:
    data_dir = cluster
    owner = EmbeddedPostgres(data_dir).start()
    try:
        guest = EmbeddedPostgres(data_dir)
        _timed("attach to running server", guest.start)
        assert not guest.owns_server
        assert guest.pid == owner.pid
        guest.stop()
        guest.stop()
        assert owner.is_running()
        assert await _vector_version(owner.dsn) is not None
    finally:
        owner.stop()
    assert not owner.is_running()


def test_stop_is_idempotent(cluster: Path) -> None:
    data_dir = cluster
    pg = EmbeddedPostgres(data_dir)
    pg.stop()  # never started: nothing to do
    pg.start()
    pg.start()  # already started: also nothing to do
    pid = pg.pid
    _timed("stop (fast)", pg.stop)
    pg.stop()
    pg.stop()
    _assert_no_server(data_dir, pid)
    with pytest.raises(DatabaseUnavailable):
        _ = pg.dsn
    # A stopped object can start again.
    pg.start()
    assert pg.owns_server
    pg.stop()
    assert not pg.is_running()


def test_stale_postmaster_pid_is_ignored(cluster: Path) -> None:
    data_dir = cluster
    EmbeddedPostgres(data_dir).start().stop()
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    gone = subprocess.Popen(["true"])  # a pid that surely no longer exists
    gone.wait()
    for stale_pid in (gone.pid, os.getpid()):  # dead, and reused by a non-postgres process
        pid_file.write_text(
            f"{stale_pid}\n{data_dir / 'pgdata'}\n0\n5432\n/nowhere\n\n0 0\nready\n"
        )
        with EmbeddedPostgres(data_dir) as pg:
            assert pg.owns_server and pg.pid != stale_pid
        assert not pid_file.exists()


def test_start_failure_reports_the_server_log(cluster: Path) -> None:
    data_dir = cluster
    EmbeddedPostgres(data_dir).start().stop()
    auto_conf = data_dir / "pgdata" / "postgresql.auto.conf"
    auto_conf.write_text("work_mem = 'not-a-size'\n")
    with pytest.raises(DatabaseUnavailable) as info:
        EmbeddedPostgres(data_dir).start()
    assert "work_mem" in info.value.message
    assert not (data_dir / "server.owner").exists()
    auto_conf.write_text("")
    with EmbeddedPostgres(data_dir) as pg:
        assert pg.is_running()


def test_concurrent_starts_share_one_server(fresh_dir: Path) -> None:
    data_dir = fresh_dir  # the race includes initdb
    objs = [EmbeddedPostgres(data_dir) for _ in range(3)]
    errors: list[BaseException] = []

    def start(pg: EmbeddedPostgres) -> None:
        try:
            pg.start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(pg,)) for pg in objs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors
        assert sum(pg.owns_server for pg in objs) == 1
        assert len({pg.pid for pg in objs}) == 1
    finally:
        for pg in sorted(objs, key=lambda p: p.owns_server):  # guests first
            pg.stop()
    assert not objs[0].is_running()


async def test_long_data_dir_uses_a_short_socket_dir(cluster: Path, fresh_dir: Path) -> None:
    data_dir = fresh_dir / ("d" * 100)
    data_dir.symlink_to(cluster)  # the long path is the data dir's; pgdata is shared
    pg = EmbeddedPostgres(data_dir)
    try:
        pg.start()
        assert pg.socket_dir != data_dir / "run"
        assert len(os.fsencode(pg.socket_dir / ".s.PGSQL.5432")) <= 107
        assert (pg.socket_dir.stat().st_mode & 0o077) == 0
        assert await _vector_version(pg.dsn) is not None
    finally:
        socket_dir = pg.socket_dir if pg.is_running() else None
        pg.stop()
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)


async def test_create_and_drop_database(cluster: Path) -> None:
    with EmbeddedPostgres(cluster, database="app") as pg:
        name = 'test "odd" name'
        dsn = pg.create_database(name)
        assert await _vector_version(dsn) is not None
        with pytest.raises(DatabaseUnavailable, match="already exists"):
            pg.create_database(name)
        assert pg.create_database(name, replace=True) == dsn
        conn = await asyncpg.connect(dsn)  # open session: drop must still work (FORCE)
        try:
            pg.drop_database(name)
        finally:
            conn.terminate()  # the server already closed it
        pg.drop_database(name)  # absent: no error
        with pytest.raises(asyncpg.InvalidCatalogNameError):
            await asyncpg.connect(dsn)
        with pytest.raises(ValueError):
            pg.drop_database("postgres")
        assert await _vector_version(pg.dsn) is not None  # the default db, "app"


def test_ensure_embedded_installs_handlers(cluster: Path) -> None:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        pg = ensure_embedded(Settings(data_dir=cluster))
        try:
            assert pg.owns_server
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL
        finally:
            pg.stop()
        assert not pg.is_running()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------- real processes

_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from gateway.embedded import EmbeddedPostgres

    # A terminal starts Python with SIGINT -> KeyboardInterrupt; a background job
    # may inherit SIGINT ignored, so make the child behave like the terminal case.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Under nohup the suite, and so this child, inherits SIGHUP ignored, and
    # install_signal_handlers keeps an ignored signal (someone else's choice):
    # give the child the default that a terminal session has.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    pg = EmbeddedPostgres(Path(sys.argv[1])).start()
    pg.install_signal_handlers()
    try:
        print(pg.pid, flush=True)  # inside try: the parent signals as soon as it reads this
        time.sleep(60)
    finally:
        print("unwound", flush=True)
    """
)


def _spawn_child(data_dir: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data_dir)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=30)
    line = proc.stdout.readline().strip() if ready else ""
    if not line.isdigit():
        proc.kill()
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"child did not start the server: {line!r}\n{err}")
    return proc, int(line)


@pytest.mark.parametrize(
    ("sig", "codes"),
    [
        (signal.SIGTERM, {128 + signal.SIGTERM}),
        (signal.SIGINT, {-signal.SIGINT, 128 + signal.SIGINT, 1}),
        (signal.SIGHUP, {128 + signal.SIGHUP}),
    ],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)
def test_signal_to_the_owner_stops_the_server(
    cluster: Path, sig: signal.Signals, codes: set[int]
) -> None:
    data_dir = cluster
    proc, pid = _spawn_child(data_dir)
    try:
        assert _alive(pid)
        t0 = time.perf_counter()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        _TIMINGS.append((f"{sig.name} -> child exited", time.perf_counter() - t0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "unwound" in out, (proc.returncode, out, err)
    assert proc.returncode in codes, err
    _assert_no_server(data_dir, pid)


def test_orphan_of_a_killed_owner_is_adopted(cluster: Path) -> None:
    data_dir = cluster
    proc, pid = _spawn_child(data_dir)
    proc.kill()  # SIGKILL: no cleanup can run, the server is orphaned
    proc.communicate(timeout=10)
    assert _alive(pid)
    pg = EmbeddedPostgres(data_dir).start()
    assert pg.pid == pid and pg.owns_server
    pg.stop()
    _assert_no_server(data_dir, pid)


def test_server_started_by_hand_is_never_adopted(cluster: Path) -> None:
    data_dir = cluster
    EmbeddedPostgres(data_dir).start().stop()
    (data_dir / "server.owner").unlink(missing_ok=True)
    with EmbeddedPostgres(data_dir) as starter:
        pid = starter.pid
        (data_dir / "server.owner").unlink()  # as if started by pg_ctl directly
        guest = EmbeddedPostgres(data_dir).start()
        assert not guest.owns_server
        guest.stop()
        assert _alive(pid)


def test_asyncpg_accepts_the_dsn_from_a_running_loop(cluster: Path) -> None:
    """start() is sync and loop-free; it must also work from a thread of a running loop."""

    async def main() -> str | None:
        pg = await asyncio.to_thread(EmbeddedPostgres(cluster).start)
        try:
            return await _vector_version(pg.dsn)
        finally:
            await asyncio.to_thread(pg.stop)

    assert asyncio.run(main()) is not None


# --- memory settings (docs/deploy.md, "Memory")


async def _memory_settings(dsn: str) -> tuple[str, str]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        buffers = await conn.fetchval("SHOW shared_buffers")
        cache = await conn.fetchval("SHOW effective_cache_size")
        return str(buffers), str(cache)
    finally:
        await conn.close()


def test_memory_is_derived_from_the_machine() -> None:
    """A quarter of the machine for shared buffers within [128 MB, 8 GB], half of
    it for effective_cache_size (never below the buffers)."""
    assert ServerMemory.derive(machine_mb=2048) == ServerMemory(512, 1024)
    assert ServerMemory.derive(machine_mb=24_000) == ServerMemory(6000, 12_000)
    assert ServerMemory.derive(machine_mb=256) == ServerMemory(128, 128)
    assert ServerMemory.derive(machine_mb=262_144) == ServerMemory(8192, 131_072)
    assert ServerMemory.derive(machine_mb=8192, shared_buffers_mb=300) == ServerMemory(300, 4096)
    assert ServerMemory.derive(machine_mb=8192, effective_cache_size_mb=700) == ServerMemory(
        2048, 700
    )
    # what a gateway without overrides asks for on this very machine
    assert ServerMemory.derive() == ServerMemory.derive(machine_mb=machine_memory_mb())
    assert 0 < machine_memory_mb() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


async def test_server_starts_with_the_derived_memory(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No override: the server gets the machine's share (a 2 GB machine stands in,
    so that the suite never maps a quarter of the real one)."""
    monkeypatch.delenv("RECALL_PG_SHARED_BUFFERS_MB", raising=False)
    monkeypatch.delenv("RECALL_PG_EFFECTIVE_CACHE_SIZE_MB", raising=False)
    monkeypatch.setattr(embedded, "machine_memory_mb", lambda: 2048)
    with EmbeddedPostgres(cluster) as pg:
        assert await _memory_settings(pg.dsn) == ("512MB", "1GB")


async def test_memory_overrides_from_the_environment_and_settings(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALL_PG_SHARED_BUFFERS_MB", "200")
    monkeypatch.setenv("RECALL_PG_EFFECTIVE_CACHE_SIZE_MB", "3000")
    with EmbeddedPostgres(cluster) as pg:  # a benchmark's or a tool's own server
        assert await _memory_settings(pg.dsn) == ("200MB", "3000MB")
    monkeypatch.delenv("RECALL_PG_SHARED_BUFFERS_MB")
    monkeypatch.delenv("RECALL_PG_EFFECTIVE_CACHE_SIZE_MB")
    settings = Settings(data_dir=cluster, pg_shared_buffers_mb=144, pg_effective_cache_size_mb=999)
    pg = ensure_embedded(settings)  # the CLI's way
    try:
        assert await _memory_settings(pg.dsn) == ("144MB", "999MB")
    finally:
        pg.stop()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("lots", "RECALL_PG_SHARED_BUFFERS_MB: Input should be a valid integer"),
        ("8", "RECALL_PG_SHARED_BUFFERS_MB: Input should be greater than or equal to 16"),
        ("1048576", "is not less than this machine's memory"),
    ],
)
def test_bad_memory_setting_is_a_clear_error(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    """Refused before any server starts, naming the variable; never clamped."""
    monkeypatch.setenv("RECALL_PG_SHARED_BUFFERS_MB", value)
    monkeypatch.setattr(embedded, "machine_memory_mb", lambda: 4096)
    with pytest.raises(DatabaseUnavailable, match=says) as caught:
        EmbeddedPostgres(cluster).start()
    assert "Traceback" not in str(caught.value)
    _assert_no_server(cluster)


def test_shared_memory_that_cannot_be_mapped_names_the_setting(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment the kernel refuses (here: far beyond memory, past the check, which
    a machine that believes it has that much would pass) is a start failure that
    says which setting to lower, with the server's own words after it."""
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1":
        pytest.skip("the kernel maps any size (vm.overcommit_memory = 1)")
    huge = 64 * machine_memory_mb()
    monkeypatch.setattr(embedded, "machine_memory_mb", lambda: huge * 2)
    pg = EmbeddedPostgres(cluster, memory=ServerMemory(huge, huge))
    with pytest.raises(DatabaseUnavailable, match="set RECALL_PG_SHARED_BUFFERS_MB lower") as e:
        pg.start()
    assert "could not map anonymous shared memory" in str(e.value)
    _assert_no_server(cluster)


@pytest.mark.parametrize("machine_mb", [128, 100])
def test_a_machine_too_small_for_the_derived_buffers_says_what_to_set(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, machine_mb: int
) -> None:
    """A machine (or cgroup) of 128 MB or less, nothing set: the derived 128 MB
    does not fit. The message tells the user to set the variable (which they have
    not set), and to what: not to lower or unset it."""
    monkeypatch.delenv("RECALL_PG_SHARED_BUFFERS_MB", raising=False)
    monkeypatch.delenv("RECALL_PG_EFFECTIVE_CACHE_SIZE_MB", raising=False)
    monkeypatch.setattr(embedded, "machine_memory_mb", lambda: machine_mb)
    with pytest.raises(DatabaseUnavailable) as caught:
        EmbeddedPostgres(cluster).start()
    message = str(caught.value)
    assert (
        f"set RECALL_PG_SHARED_BUFFERS_MB to a number of MB below {machine_mb} "
        f"(16 at least; {machine_mb // 4} is a quarter of it)"
    ) in message, message
    assert "derived from the machine" in message and "unset" not in message
    _assert_no_server(cluster)
    # and what it says to set is taken: the server starts with it
    monkeypatch.setenv("RECALL_PG_SHARED_BUFFERS_MB", str(machine_mb // 4))
    with EmbeddedPostgres(cluster) as pg:
        assert asyncio.run(_memory_settings(pg.dsn))[0] == f"{machine_mb // 4}MB"


def test_a_machine_below_postgres_minimum_names_no_setting_that_cannot_help(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECALL_PG_SHARED_BUFFERS_MB", raising=False)
    monkeypatch.setattr(embedded, "machine_memory_mb", lambda: 16)
    with pytest.raises(DatabaseUnavailable, match="cannot run in 16 MB") as caught:
        EmbeddedPostgres(cluster).start()
    assert "set RECALL_PG_SHARED_BUFFERS_MB" not in str(caught.value)
    _assert_no_server(cluster)


def test_a_value_set_too_high_is_to_be_lowered(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECALL_PG_SHARED_BUFFERS_MB", "4096")
    monkeypatch.setattr(embedded, "machine_memory_mb", lambda: 4096)
    with pytest.raises(DatabaseUnavailable) as caught:
        EmbeddedPostgres(cluster).start()
    assert "shared_buffers of 4096 MB (RECALL_PG_SHARED_BUFFERS_MB)" in str(caught.value)
    assert "set RECALL_PG_SHARED_BUFFERS_MB lower (below 4096, at least 16)" in str(caught.value)


# --- the cgroup memory limit (machine_memory_mb)


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("max\n", None),  # v2, no limit
        ("536870912\n", 512 * 2**20),  # v2 or v1, a limit
        ("9223372036854771712\n", 9223372036854771712),  # v1's "no limit": limits nothing
        ("-1", None),  # what is written to v1 to lift a limit
        (" 1073741824 ", 2**30),
    ],
)
def test_cgroup_limit_formats(text: str, limit: int | None) -> None:
    assert embedded.cgroup_limit_bytes(text) == limit


@pytest.mark.parametrize("text", ["", "lots", "-5", "1.5G", "١٢٣"])
def test_cgroup_limit_that_is_no_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a memory limit"):
        embedded.cgroup_limit_bytes(text)


def _cgroup_tree(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


GB = 2**30


@pytest.mark.parametrize(
    ("membership", "files", "expected_mb"),
    [
        # v2: the own cgroup's limit
        ("0::/ctr\n", {"ctr/memory.max": f"{GB}\n"}, 1024),
        # v2: a limit two levels up (a systemd slice's MemoryMax) bounds it too
        (
            "0::/system.slice/app.service/ctr\n",
            {
                "system.slice/memory.max": f"{2 * GB}\n",
                "system.slice/app.service/memory.max": "max\n",
                "system.slice/app.service/ctr/memory.max": "max\n",
            },
            2048,
        ),
        # v2 in a container's cgroup namespace: its own cgroup is the root
        ("0::/\n", {"memory.max": f"{3 * GB}\n"}, 3072),
        # v1 (and hybrid): the memory controller's line, its ancestors; others ignored
        (
            "12:cpu,cpuacct:/other\n4:memory:/docker/abc\n0::/\n",
            {
                "memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n",
                "memory/docker/memory.limit_in_bytes": f"{GB // 2}\n",
                "memory/memory.limit_in_bytes": "9223372036854771712\n",
                "cpu,cpuacct/other/memory.max": f"{GB // 8}\n",
            },
            512,
        ),
        # no limit anywhere: the physical memory
        ("0::/ctr\n", {"ctr/memory.max": "max\n", "memory.max": "max\n"}, 8192),
        # a line that is not ID:CONTROLLERS:PATH is skipped, the others still count
        ("garbage\n\n0::/ctr\n", {"ctr/memory.max": f"{GB}\n"}, 1024),
        # a limit above the physical memory limits nothing
        ("0::/ctr\n", {"ctr/memory.max": f"{64 * GB}\n"}, 8192),
    ],
)
def test_memory_is_the_lowest_cgroup_limit_on_the_way_up(
    tmp_path: Path, membership: str, files: dict[str, str], expected_mb: int
) -> None:
    root = tmp_path / "cgroup"
    _cgroup_tree(root, files)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(membership)
    got = machine_memory_mb(physical_bytes=8 * GB, cgroup_root=root, proc_cgroup=proc)
    assert got == expected_mb


def test_an_unreadable_cgroup_limit_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unparsable (or unreadable) limit files do not fail the start: they are
    logged, naming the file and the override, and the other limits still count;
    no /proc/self/cgroup at all (no procfs): the mount's root files still count."""
    root = tmp_path / "cgroup"
    _cgroup_tree(root, {"ctr/memory.max": "lots\n", "memory.max": f"{GB}\n"})
    (root / "ctr" / "sub").mkdir()
    (root / "ctr" / "sub" / "memory.max").mkdir()  # reading it fails (a folder)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/ctr/sub\n")
    with caplog.at_level("WARNING", logger="gateway.embedded"):
        got = machine_memory_mb(physical_bytes=8 * GB, cgroup_root=root, proc_cgroup=proc)
    assert got == 1024
    warned = [r.getMessage() for r in caplog.records]
    assert any("cannot parse the cgroup memory limit" in w and "'lots'" in w for w in warned)
    assert any("cannot read the cgroup memory limit" in w for w in warned)
    assert all("set RECALL_PG_SHARED_BUFFERS_MB" in w for w in warned)
    missing = tmp_path / "no-such-file"
    got = machine_memory_mb(physical_bytes=8 * GB, cgroup_root=root, proc_cgroup=missing)
    assert got == 1024
