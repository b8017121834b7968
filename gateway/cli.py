"""``recall-gateway``: serve, migrate, load, demo, mcp, tokens, export-schema.

Commands that need a database use ``DATABASE_URL`` when set; otherwise they
start (or attach to) the embedded PostgreSQL under the data directory and stop
it on exit, Ctrl-C or SIGTERM if they started it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

from pydantic import ValidationError

from gateway import __version__, tokens
from gateway.embedded import EmbeddedPostgres, ServerMemory, machine_memory_mb
from gateway.embeddings.catalog import LOCAL_MODELS
from gateway.errors import ConfigurationError, GatewayError, InvalidInput
from gateway.services.loader import LoadError, split_lines
from gateway.settings import Settings, settings_problems

DEMO_TEAM = "northwind"


def _err(message: str, code: str | None = None) -> None:
    """One line on standard error; a failure's stable ``code`` (docs/errors.md)
    leads it, as ``error CODE: message``, so that a script can act on it."""
    print(f"recall-gateway: {f'error {code}: ' if code else ''}{message}", file=sys.stderr)


def _refused(exc: LoadError) -> None:
    """A refused load (``loader.LoadError``): each refused line with its own code,
    then the load's ``LOAD_REFUSED`` with what was and was not written. A batch
    the database refused has one line, whose message already says both: it is
    printed once, with the line's code (``DATABASE_UNAVAILABLE``: try again;
    ``NOT_FOUND``: fix the file)."""
    errors = exc.errors
    if len(errors) == 1 and exc.message.startswith(str(errors[0])):
        _err(exc.message, errors[0].code)
        return
    for error in errors:
        _err(str(error), error.code)
    _err(exc.message, exc.code)


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[str]:
    """A DSN: the configured server, or the embedded one for the duration of the block."""
    if settings.database_url:
        yield settings.database_url
        return
    server = EmbeddedPostgres(settings.data_dir, memory=ServerMemory.from_settings(settings))
    server.install_signal_handlers()
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()


# --- commands --------------------------------------------------------------------


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.store.database import prepare

    with database(settings) as dsn:
        applied = asyncio.run(prepare(dsn, migrate=True))
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("schema is current; nothing to apply")
    return 0


async def _with_services(
    dsn: str, settings: Settings, work: Callable[[Any], Any], *, connections: int = 2
) -> Any:
    from gateway.embeddings import create_provider
    from gateway.services.reembed import read_store_model
    from gateway.services.writes import WriteService
    from gateway.store.database import Database, prepare

    await prepare(dsn, migrate=True)
    db = await Database.open(dsn, min_size=1, max_size=connections)
    try:
        embedder = create_provider(settings, await read_store_model(db))
    except BaseException:
        await db.close()
        raise
    try:
        return await work(WriteService(db, embedder))
    finally:
        await db.close()
        await embedder.aclose()


LineSource = Callable[[], Iterable[str | bytes]]


@contextlib.contextmanager
def _input(path: str) -> Iterator[LineSource]:
    """A way to read the input's lines twice (check, then load) without holding
    them: a file is opened again; standard input is first spooled to a
    temporary file. Lines are split on line feeds only, as bytes (decoded per
    line, so that a bad byte is reported with its line)."""
    if path == "-":
        with tempfile.TemporaryFile() as spool:
            shutil.copyfileobj(sys.stdin.buffer, spool)

            def spooled() -> Iterator[bytes]:
                spool.seek(0)
                yield from spool

            yield spooled
        return
    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"no such file: {path}")

    def reopened() -> Iterator[bytes]:
        with file.open("rb") as f:
            yield from f

    yield reopened


async def _build_vector_indexes(
    settings: Settings, db: Any, out: TextIO, spaces: list[UUID] | None = None
) -> int:
    """Build and attach the vector tables that ``load --index-after`` left detached
    (``spaces``: this load's; None: every space no running load holds), with a
    progress bar of their own. Returns the exit status: 1 when a table failed."""
    from gateway.progress import report_progress
    from gateway.services import vector_indexes

    items = await vector_indexes.pending(db, spaces)
    if not items:
        return 0
    async with report_progress(
        sum(i.rows for i in items),
        sys.stderr,
        terminal=sys.stderr.isatty(),
        label="indexing",
        interval_s=settings.load_progress_interval_s,
        unit="vectors",
    ) as advance:
        report = await vector_indexes.build_pending(
            db,
            items,
            maintenance_work_mem_mb=settings.index_build_memory_mb,
            workers=settings.index_build_workers,
            progress=advance,
        )
    if report.tables:
        print(
            f"indexed {report.vectors} vector(s) of {report.tables} table(s) in "
            f"{report.seconds:.1f} s; recall finds them by vector now",
            file=out,
        )
    for space in report.busy:
        print(
            f"skipped {space}: a running 'load --index-after' still fills it and builds it "
            "when it ends",
            file=out,
        )
    for table, space, reason in report.failed:
        _err(
            f"the vector index of {space} (table {table}) could not be built and attached, "
            f"and the table stays detached: {reason}",
            vector_indexes.VectorIndexBuildFailed.code,
        )
    return 1 if report.failed else 0


def _load_lines(
    settings: Settings,
    dsn: str,
    lines: LineSource,
    batch_size: int,
    out: TextIO,
    *,
    index_after: bool = False,
    concurrency: int = 1,
) -> int:
    from gateway.services import loader

    try:
        checked = loader.check(lines())
    except loader.LoadError as exc:
        _refused(exc)
        return 1

    async def work(service: Any) -> loader.LoadReport:
        from gateway.progress import report_progress

        if checked.embedding_model is not None:
            await loader.check_embedding_model(service, *checked.embedding_model)
        async with report_progress(
            checked.records,
            sys.stderr,
            terminal=sys.stderr.isatty(),
            interval_s=settings.load_progress_interval_s,
        ) as advance:
            loaded = await loader.load(
                service,
                loader.stream(lines()),
                batch_size=batch_size,
                progress=advance,
                index_after=index_after,
                concurrency=concurrency,
            )
        if loaded.deferred and await _build_vector_indexes(
            settings, service.db, out, loaded.deferred
        ):
            built[0] = False
        return loaded

    built = [True]

    started = time.perf_counter()
    try:
        # The batches' lanes, the --index-after deferral's connection, and two for
        # the statistics refresh and the next batch's look-ups meanwhile.
        report = asyncio.run(_with_services(dsn, settings, work, connections=concurrency + 3))
    except loader.LoadError as exc:
        _refused(exc)
        if exc.deferred:
            _err(
                "vectors written with --index-after are not yet indexed: load the file "
                "again with --index-after, or run 'recall-gateway build-vector-indexes'"
            )
        return 1
    elapsed = time.perf_counter() - started
    created = sum(report.created.values())
    unchanged = sum(report.unchanged.values())
    print(
        f"loaded {report.records} record(s) in {report.batches} batch(es), {elapsed:.1f} s: "
        f"{created} written, {unchanged} already present",
        file=out,
    )
    for kind in sorted(set(report.created) | set(report.unchanged)):
        print(
            f"  {kind:24} {report.created[kind]:6} written {report.unchanged[kind]:6} unchanged",
            file=out,
        )
    return 0 if built[0] else 1


def cmd_load(settings: Settings, args: argparse.Namespace) -> int:
    with _input(args.file) as lines, database(settings) as dsn:
        return _load_lines(
            settings,
            dsn,
            lines,
            args.batch_size or settings.load_batch_size,
            sys.stdout,
            index_after=args.index_after,
            concurrency=args.concurrency or settings.load_concurrency,
        )


def cmd_build_vector_indexes(settings: Settings, args: argparse.Namespace) -> int:
    """Finish what an interrupted ``load --index-after`` left: build and attach."""
    from gateway.store.database import Database, connect_once, ensure_vector_available

    async def run() -> int:
        # No migration first: the migration runner refuses while tables are detached
        # (it would miss them), and this command is how they stop being so.
        conn = await connect_once(dsn)
        try:
            await ensure_vector_available(conn)
        finally:
            await conn.close()
        db = await Database.open(dsn, min_size=1, max_size=2)
        try:
            return await _build_vector_indexes(settings, db, sys.stdout)
        finally:
            await db.close()

    with database(settings) as dsn:
        return asyncio.run(run())


def _issue(
    dsn: str,
    settings: Settings,
    team: str,
    principal: str,
    binding: str,
    label: str | None,
    expires_in_days: float | None,
) -> str:
    from gateway.services.records import TokenRecord
    from gateway.services.writes import Actor

    token_id = tokens.new_token_id()
    secret = tokens.new_secret()
    expires = (
        datetime.now(UTC) + timedelta(days=expires_in_days) if expires_in_days is not None else None
    )
    record = TokenRecord(
        kind="token",
        team=team,
        id=token_id,
        principal=principal,
        binding=binding,  # type: ignore[arg-type]
        secret=secret,
        label=label,
        expires_at=expires,
    )

    async def work(service: Any) -> None:
        await service.apply([record], Actor.operator())

    asyncio.run(_with_services(dsn, settings, work))
    return tokens.format_token(token_id, secret)


def cmd_tokens_issue(settings: Settings, args: argparse.Namespace) -> int:
    with database(settings) as dsn:
        token = _issue(
            dsn, settings, args.team, args.principal, args.binding, args.label, args.expires_in_days
        )
    print(token)
    return 0


def _token_id(text: str) -> str:
    """A token's ID, also from a whole token (``rgt_<id>_<secret>``) pasted by mistake."""
    parsed = tokens.parse_token(text)
    return parsed.token_id if parsed is not None else text


def cmd_tokens_list(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services.auth import list_tokens
    from gateway.store.database import Database, prepare

    async def work() -> list[Any]:
        await prepare(dsn, migrate=settings.migrate_on_start)
        db = await Database.open(dsn, min_size=1, max_size=1)
        try:
            return await list_tokens(db, args.team, args.principal)
        finally:
            await db.close()

    with database(settings) as dsn:
        listed = asyncio.run(work())
    now = datetime.now(UTC)
    print(
        f"{'TOKEN':20} {'TEAM':20} {'PRINCIPAL':20} {'BINDING':12} {'STATE':8} "
        f"{'ISSUED':20} {'EXPIRES':20} LABEL"
    )
    for t in listed:
        if t.revoked_at is not None:
            state = "revoked"
        elif t.expires_at is not None and t.expires_at <= now:
            state = "expired"
        else:
            state = "active"
        print(
            f"{t.id:20} {t.team_id:20} {t.principal_id:20} {t.binding:12} {state:8} "
            f"{_when(t.recorded_at):20} {_when(t.expires_at):20} {t.label or ''}"
        )
    return 0


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else "-"


def cmd_tokens_revoke(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.services.auth import revoke
    from gateway.store.database import Database, prepare

    token_id = _token_id(args.token)

    async def work() -> datetime:
        await prepare(dsn, migrate=settings.migrate_on_start)
        db = await Database.open(dsn, min_size=1, max_size=1)
        try:
            return await revoke(db, token_id)
        finally:
            await db.close()

    with database(settings) as dsn:
        revoked = asyncio.run(work())
    print(f"token {token_id} revoked at {_when(revoked)}; every worker refuses it from now on")
    return 0


def _build_communities(settings: Settings, dsn: str, team: str | None, out: TextIO) -> int:
    """Build community snapshots (one team, or every team), with progress on a terminal."""
    from gateway.services import communities
    from gateway.store.communities import team_ids
    from gateway.store.database import Database, prepare

    async def work() -> list[Any]:
        await prepare(dsn, migrate=True)
        db = await Database.open(dsn, min_size=1, max_size=2)
        try:
            if team is None:
                async with db.admin(readonly=True) as conn:
                    teams = await team_ids(conn)
            else:
                teams = [team]
            max_nodes, max_edges = settings.community_max_nodes, settings.community_max_edges
            if not sys.stderr.isatty():
                return await communities.build_all(
                    db, teams, max_nodes=max_nodes, max_edges=max_edges
                )
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

            reports = []
            with Progress(
                SpinnerColumn(),
                "[progress.description]{task.description}",
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            ) as bar:
                for t in teams:
                    task = bar.add_task(f"{t}: starting", total=None)

                    def say(stage: str, task: Any = task, t: str = t) -> None:
                        bar.update(task, description=f"{t}: {stage}")

                    reports += await communities.build_all(
                        db, [t], max_nodes=max_nodes, max_edges=max_edges, progress=say
                    )
                    bar.update(task, description=f"{t}: done", completed=1, total=1)
            return reports
        finally:
            await db.close()

    reports = asyncio.run(work())
    for r in reports:
        detail = (
            f"{r.communities} communities, {r.members} members"
            if r.status == "succeeded"
            else r.error
        )
        print(
            f"communities of team {r.team}: {r.status} ({r.node_count} groups, "
            f"{r.edge_count} edges; {detail})",
            file=out,
        )
    return 0 if all(r.status == "succeeded" for r in reports) else 1


def cmd_communities_build(settings: Settings, args: argparse.Namespace) -> int:
    with database(settings) as dsn:
        return _build_communities(settings, dsn, args.team, sys.stdout)


def _reembed_target(settings: Settings, model: str | None, batch_size: int) -> Any:
    """The provider to move the store to: ``--model``, else the configured one."""
    from gateway.embeddings import AUTO, by_key, create_provider

    if model is not None:
        return by_key(model).make(batch_size)
    if settings.embedding_provider != "local":
        return create_provider(settings)
    if settings.embedding_model == AUTO:
        raise InvalidInput(
            "name the model to move the store to: reembed --model KEY "
            f"({', '.join(sorted(LOCAL_MODELS))}); RECALL_EMBEDDING_MODEL=auto follows the store"
        )
    return by_key(settings.embedding_model).make(batch_size)


def _reembed(settings: Settings, dsn: str, model: str | None, batch_size: int, out: TextIO) -> int:
    """Re-embed the store with ``model`` (a catalogue key) or the configured provider."""
    from gateway.progress import report_progress
    from gateway.services.reembed import count_vectors, reembed
    from gateway.store.database import Database, prepare

    async def work() -> Any:
        await prepare(dsn, migrate=True)
        db = await Database.open(dsn, min_size=1, max_size=2)
        try:
            target = _reembed_target(settings, model, batch_size)
        except BaseException:
            await db.close()
            raise
        try:
            async with report_progress(
                await count_vectors(db),
                sys.stderr,
                terminal=sys.stderr.isatty(),
                label=f"re-embedding to {target.model}",
                interval_s=settings.load_progress_interval_s,
                unit="vectors",
            ) as advance:
                shown = 0

                def report(done: int, total: int) -> None:
                    nonlocal shown
                    advance(done - shown)
                    shown = done

                return await reembed(db, target, batch_size=batch_size, progress=report)
        finally:
            await db.close()
            await target.aclose()

    report = asyncio.run(work())
    if report.abandoned:
        print(f"abandoned the unfinished run for model '{report.abandoned}'", file=out)
    if report.switched:
        resumed = " (resumed)" if report.resumed else ""
        print(
            f"re-embedded {report.embedded} vector(s){resumed} of {report.total}: {report.note}; "
            "gateways with RECALL_EMBEDDING_MODEL=auto follow within a second, others need "
            "their setting changed and a restart",
            file=out,
        )
    else:
        print(report.note, file=out)
    return 0


def cmd_reembed(settings: Settings, args: argparse.Namespace) -> int:
    with database(settings) as dsn:
        return _reembed(
            settings, dsn, args.model, args.batch_size or settings.embedding_batch_size, sys.stdout
        )


def cmd_export_schema(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.schema import export_sdl

    sdl = export_sdl()
    if args.output == "-":
        sys.stdout.write(sdl)
    else:
        Path(args.output).write_text(sdl, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


def check_listen_address(host: str, port: int, workers: int = 1) -> None:
    """Refuse, before anything starts, an address the server could not listen on.

    uvicorn finds out only when it binds: after the embedded database started
    and migrations ran, and for ``demo`` after the data loaded and a token was
    issued and printed under "demo is starting"; it then exits 3 with an
    ``[Errno 98]`` line among its own. The usual cause is a gateway or demo left
    running in another terminal. The probe binds as the bind that follows does,
    so that it never refuses a start that would work: one worker listens
    through asyncio's ``create_server`` (every address ``getaddrinfo`` gives,
    ``SO_REUSEADDR``, IPv6 sockets ``IPV6_V6ONLY``), several through uvicorn's
    ``Config.bind_socket`` (one socket, IPv6 if the host has a colon,
    ``SO_REUSEADDR``, dual-stack). Port 0 (any free port) is never busy."""
    if port == 0:
        return
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    addresses: list[tuple[socket.AddressFamily, Any]]
    if workers > 1:
        addresses = [(socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port))]
    else:
        try:
            found = socket.getaddrinfo(
                host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
            )
        except OSError as exc:
            raise ConfigurationError(f"cannot listen on {where}: {exc.strerror or exc}") from None
        addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in found))
    for family, address in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and workers <= 1:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                hint = (
                    " (another gateway or demo still running? stop it, or choose another port "
                    "with --port or RECALL_PORT)"
                    if exc.errno == errno.EADDRINUSE
                    else ""
                )
                raise ConfigurationError(
                    f"cannot listen on {where}: {exc.strerror or exc}{hint}"
                ) from None


def _run_server(settings: Settings, dsn: str, host: str, port: int, workers: int) -> None:
    """uvicorn with the read timeouts and the SIGTERM drain of gateway/serving.py;
    in-flight requests get ``RECALL_SHUTDOWN_GRACE_MS`` once the drain is over."""
    import uvicorn

    from gateway.app import SERVES_EMBEDDED_ENV, create_app

    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": settings.log_level,
        "http": "gateway.serving:TimedHttpToolsProtocol",
        "timeout_graceful_shutdown": max(1, round(settings.shutdown_grace_ms / 1000)),
    }
    embedded_server = settings.database_url is None
    if workers > 1:
        # Worker processes rebuild the app from the environment: hand them the DSN,
        # and whether it is the embedded server (its defaults then apply to them).
        os.environ["RECALL_DATABASE_URL"] = dsn
        os.environ[SERVES_EMBEDDED_ENV] = "1" if embedded_server else "0"
        with _metrics_dir():
            uvicorn.run(
                "gateway.app:create_served_app",
                factory=True,
                workers=workers,
                access_log=False,  # the gateway logs one line per request itself
                **common,
            )
        return
    app = create_app(
        settings.model_copy(update={"database_url": dsn}),
        handle_sigterm=True,
        settle_heap=True,
        embedded_server=embedded_server,
    )
    uvicorn.run(app, access_log=False, **common)


@contextlib.contextmanager
def _metrics_dir() -> Iterator[None]:
    """Several workers share their Prometheus samples through files in a folder
    (prometheus-client's multiprocess mode): a fresh one unless the operator set
    ``PROMETHEUS_MULTIPROC_DIR``. It must be set before the workers start."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="recall-gateway-metrics-") as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        try:
            yield
        finally:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    workers = args.workers or settings.workers
    check_listen_address(host, port, workers)
    if settings.database_url is None:
        from gateway.services.warmup import check_budget

        # before the server starts (the app checks again, too late for a clean exit)
        check_budget(settings.warm_up_mb, machine_memory_mb())
    with database(settings) as dsn:
        from gateway.store.database import prepare

        asyncio.run(prepare(dsn, migrate=settings.migrate_on_start))
        _run_server(settings, dsn, host, port, workers)
    return 0


def demo_dataset() -> list[str]:
    text = (resources.files("gateway") / "demo" / "demo.jsonl").read_text(encoding="utf-8")
    return split_lines(text)


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    check_listen_address(host, port)
    started = time.perf_counter()
    with database(settings) as dsn:
        demo_lines = demo_dataset()
        status = _load_lines(
            settings, dsn, lambda: demo_lines, settings.load_batch_size, sys.stderr
        )
        if status:
            return status
        # A run that is too large or failed is reported and recorded; recall then
        # says so in its degradations, so the demo still starts.
        _build_communities(settings, dsn, None, sys.stderr)
        token = _issue(dsn, settings, DEMO_TEAM, args.principal, "private", "demo", 7)
        url = f"http://{host}:{port}/graphql"
        print(
            f"\nRecall Gateway demo is starting (data loaded in {time.perf_counter() - started:.1f} s)."
            # The fragment never reaches a server: GraphiQL puts it in its headers pane.
            f"\n  GraphiQL:  {url}#token={token}"
            f"\n  principal: {args.principal} (team {DEMO_TEAM}), token valid 7 days:"
            f"\n  export RECALL_TOKEN={token}"
            f'\n  curl -s {url} -H "Authorization: Bearer $RECALL_TOKEN" '
            "-H 'Content-Type: application/json' "
            '-d \'{"query":"{ viewer { principalId displayName team { name } readableSpaces } }"}\''
            "\nPress Ctrl-C to stop.\n",
            flush=True,
        )
        _return_freed_memory()
        _run_server(settings, dsn, host, port, 1)
    return 0


def _return_freed_memory() -> None:
    """Give the heap freed by the demo's loading back to the system before serving.

    The loader's model session is freed when loading ends, but glibc keeps most
    of it in its heap, and the server then loads a session of its own on top:
    measured, a closed session left 297 MB resident (145 MB after
    ``malloc_trim``), and the demo process served at 466 MB instead of about
    330. Only glibc has ``malloc_trim``; elsewhere this does nothing."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.mcp import Gateway, http_app, run_stdio

    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    if args.transport == "http":
        check_listen_address(host, port)
    with database(settings) as dsn:
        app = create_app(settings.model_copy(update={"database_url": dsn}))
        token = settings.mcp_token.get_secret_value() if settings.mcp_token else None
        gateway = Gateway(app, token)
        if args.transport == "stdio":
            if token is None:
                _err("the stdio transport needs RECALL_MCP_TOKEN (a bearer token)")
                return 2
            asyncio.run(run_stdio(gateway))
            return 0
        import uvicorn

        print(f"MCP (streamable HTTP): http://{host}:{port}/mcp", file=sys.stderr, flush=True)
        uvicorn.run(http_app(gateway, host), host=host, port=port, log_level=settings.log_level)
    return 0


# --- argument parsing --------------------------------------------------------------


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 100000")
    return value


MAX_TOKEN_DAYS = 36500
"""Longest lifetime ``tokens issue`` gives (100 years); leave the flag out for none."""
MIN_TOKEN_DAYS = 1 / 1440
"""Shortest: one minute. A shorter one (``1e-9`` days is 86 microseconds) would be
expired by the time it is printed."""


def _days(text: str) -> float:
    """A token's lifetime in days: a finite number from a minute (fractions allowed).
    0 once meant "never expires" by accident, a negative number an expired token,
    and ``nan``, ``inf`` or a huge number a traceback after the database started."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not MIN_TOKEN_DAYS <= value <= MAX_TOKEN_DAYS:  # also false for nan
        raise argparse.ArgumentTypeError(
            f"{text!r}: a token's lifetime must be at least one minute "
            f"({math.ceil(MIN_TOKEN_DAYS * 1e6) / 1e6} "
            f"days) and at most {MAX_TOKEN_DAYS} days (leave the flag out for a token that "
            "does not expire)"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recall-gateway",
        description="Recall Gateway: a GraphQL memory-recall API over PostgreSQL and pgvector.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--data-dir", type=Path, help="folder of the embedded database (RECALL_DATA_DIR)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the GraphQL server")
    serve.add_argument("--host", help="bind address (RECALL_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="port (RECALL_PORT, default 8000)")
    serve.add_argument(
        "--workers", type=_positive, help="worker processes (RECALL_WORKERS, default 1)"
    )
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser("migrate", help="apply pending database migrations")
    migrate.set_defaults(func=cmd_migrate)

    load = sub.add_parser("load", help="load a JSON Lines file of records (see docs/loading.md)")
    load.add_argument("file", help="the file, or - for standard input")
    load.add_argument(
        "--batch-size",
        type=_positive,
        help="records per transaction (RECALL_LOAD_BATCH_SIZE, default 500)",
    )
    load.add_argument(
        "--concurrency",
        type=_positive,
        help="batches in flight at once, each its own transaction (RECALL_LOAD_CONCURRENCY, "
        "default 2; 1: one at a time)",
    )
    load.add_argument(
        "--index-after",
        action="store_true",
        help="into spaces without vectors only: build their vector indexes once, after "
        "the rows (much faster for a large load); until it ends recall finds the new "
        "evidence by full text, not by vector",
    )
    load.set_defaults(func=cmd_load)

    build = sub.add_parser(
        "build-vector-indexes",
        help="build and attach the vector indexes that an interrupted 'load --index-after' "
        "left unbuilt",
    )
    build.set_defaults(func=cmd_build_vector_indexes)

    demo = sub.add_parser("demo", help="load the bundled demo data, print a token and serve it")
    demo.add_argument("--host")
    demo.add_argument("--port", type=_port)
    demo.add_argument("--principal", default="ines", help="demo principal to issue a token for")
    demo.set_defaults(func=cmd_demo)

    mcp = sub.add_parser(
        "mcp", help="serve the Model Context Protocol for agents (see docs/mcp.md)"
    )
    mcp.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio (default; token from RECALL_MCP_TOKEN) or streamable HTTP at /mcp "
        "(token from each request's Authorization header)",
    )
    mcp.add_argument("--host", help="HTTP bind address (RECALL_HOST, default 127.0.0.1)")
    mcp.add_argument("--port", type=_port, help="HTTP port (RECALL_PORT, default 8000)")
    mcp.set_defaults(func=cmd_mcp)

    tok = sub.add_parser("tokens", help="manage bearer tokens")
    tok_sub = tok.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    issue = tok_sub.add_parser("issue", help="issue a token and print it (shown once)")
    issue.add_argument("--team", required=True)
    issue.add_argument("--principal", required=True)
    issue.add_argument("--binding", choices=["private", "shared_only"], default="private")
    issue.add_argument("--label")
    issue.add_argument(
        "--expires-in-days",
        type=_days,
        metavar="DAYS",
        help=f"lifetime in days, from one minute (fractions allowed) to {MAX_TOKEN_DAYS}; "
        "default: the token does not expire",
    )
    issue.set_defaults(func=cmd_tokens_issue)
    listing = tok_sub.add_parser("list", help="list tokens (IDs, owners, state; never secrets)")
    listing.add_argument("--team", help="only this team's tokens")
    listing.add_argument("--principal", help="only this principal's tokens")
    listing.set_defaults(func=cmd_tokens_list)
    revoke = tok_sub.add_parser(
        "revoke", help="revoke a token at once (every worker refuses it from the next request)"
    )
    revoke.add_argument("token", help="the token's ID (t-...), or the whole token")
    revoke.set_defaults(func=cmd_tokens_revoke)

    com = sub.add_parser("communities", help="community snapshots of the shared graph")
    com_sub = com.add_subparsers(dest="communities_command", required=True, metavar="ACTION")
    build = com_sub.add_parser(
        "build", help="cluster each team's shared relationship graph and store a snapshot"
    )
    build.add_argument("--team", help="only this team (default: every team)")
    build.set_defaults(func=cmd_communities_build)

    reembed = sub.add_parser(
        "reembed",
        help="embed every vector of the store again with another model, then switch to it",
    )
    reembed.add_argument(
        "--model",
        choices=sorted(LOCAL_MODELS),
        help="local model (default: the configured provider; RECALL_EMBEDDING_MODEL)",
    )
    reembed.add_argument(
        "--batch-size",
        type=_positive,
        help="texts per batch (RECALL_EMBEDDING_BATCH_SIZE, default 64)",
    )
    reembed.set_defaults(func=cmd_reembed)

    export = sub.add_parser("export-schema", help="print or write the GraphQL schema (SDL)")
    export.add_argument("-o", "--output", default="-", help="file to write (default stdout)")
    export.set_defaults(func=cmd_export_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        overrides: dict[str, Any] = {}
        if args.data_dir is not None:
            overrides["data_dir"] = args.data_dir
        settings = Settings(**overrides)
    except ValidationError as exc:  # name the variable the user set, and why
        _err("invalid settings: " + "; ".join(settings_problems(exc)), ConfigurationError.code)
        return 2
    except Exception as exc:
        _err(f"invalid settings: {exc}", ConfigurationError.code)
        return 2
    try:
        return int(args.func(settings, args))
    except GatewayError as exc:
        _err(exc.message, exc.code)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
