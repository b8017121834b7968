"""The connection pool and the two kinds of transaction the gateway runs.

Tenant transactions switch to the non-owner role ``recall_app`` and set the
caller's team and readable spaces, so PostgreSQL's row-level security filters
every statement even where the SQL forgets its own predicates. Admin
transactions (loader, migrations, token lookup) run as the connecting role.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from asyncpg.transaction import Transaction
from pgvector.asyncpg import register_vector

from gateway import deadline
from gateway.errors import ConfigurationError, DatabaseUnavailable, RequestTimeout
from gateway.store import migrations
from gateway.store.connection import Conn

APP_ROLE = "recall_app"

# A read waits at most this long for a lock (a migration, a reindex) before
# failing, so that an optional branch degrades instead of hanging.
_LOCK_TIMEOUT = "2s"

_ENTER_TENANT = (
    "SELECT set_config('role', $1, true), set_config('recall.team_id', $2, true), "
    "set_config('recall.space_ids', $3, true), set_config('lock_timeout', $4, true), "
    "set_config('statement_timeout', $5, true)"
)

# The same for a write transaction, which also claims its counter shard first
# thing (db/0160; gateway/store/writes.py, claim_counter_shard), in the same round trip.
_ENTER_TENANT_WRITING = _ENTER_TENANT + ", recall_stats_shard()"

# A unit's (see Unit): the same, and the transaction's instant (``now()``, a
# current view's system time), so that work beside the unit can take the view's
# instant before the view statement has answered.
_ENTER_UNIT = _ENTER_TENANT + ", now()"
# The same, and how PostgreSQL plans the unit's prepared statements.
_ENTER_UNIT_PLANNED = _ENTER_TENANT + ", set_config('plan_cache_mode', $6, true), now()"

# The first part of a statement on a side connection (SideConnections): the
# tenant settings of its implicit transaction, made with its first selection.
# The connection is recall_app from its login on, so row-level security is in
# every plan it makes; the two settings, which the policies read when they run,
# are set by the first expression the statement evaluates (see SideConnections).
SIDE_TENANT_SQL = (
    "SELECT current_user::text AS role, set_config('recall.team_id', $1, true) AS team, "
    "set_config('recall.space_ids', $2, true) AS spaces"
)

_SET_SPACES = "SELECT set_config('recall.space_ids', $1, true)"

STATEMENT_CACHE_MAX_BYTES = 64 * 1024
"""The longest SQL text a connection keeps prepared (asyncpg's
``max_cacheable_statement_size``). asyncpg's default, 15 KiB, is shorter than a
recall's combined first round (gateway/store/round_trips.py, about 20 KB at
one branch): that statement was sent unnamed, so every recall paid a round trip
to parse and describe it and planned it anew (docs/benchmarks.md, "Prepared
once, planned once"). The combined statements' texts depend only on the
recall's shape (branches, lists, view), so a connection prepares a handful."""

# What asyncpg and the socket raise when the server is away, restarting or
# refusing connections. Such failures become DATABASE_UNAVAILABLE, fast,
# instead of an INTERNAL error or a hang; the pool reconnects by itself later.
# What a service catches when a statement of an optional part of an answer
# fails: the part is lost (a degradation) or, for a required part, the call is
# DATABASE_UNAVAILABLE; anything else is a bug and is masked at the boundary.
STORE_FAILURES: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)

# Connection-level failures. ``InternalClientError`` is asyncpg's protocol state
# machine giving up, seen when the server stops in the middle of a statement
# (2 of 3 fast stops during token lookup): it is the connection that failed,
# not the request, so it is DATABASE_UNAVAILABLE like a reset socket.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


# What says that this server could not serve a statement at all, as opposed to the
# statement failing: connection-level failures, and a replica cancelling a read
# that conflicts with the write-ahead log it replays (a serialization failure).
# The read router (gateway/store/replicas.py) counts them to run a read again on
# the primary, even where an optional part of an answer degraded on one.
_SERVER_FAILURES: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    asyncpg.SerializationError,
)


def translate(exc: BaseException) -> BaseException:
    """The gateway error for a driver failure, or ``exc`` itself when it is another kind."""
    if isinstance(exc, asyncpg.QueryCanceledError):
        # statement_timeout, set from the request's deadline.
        return RequestTimeout("the request took longer than its deadline")
    if isinstance(exc, _UNAVAILABLE):
        return DatabaseUnavailable("the database is unavailable; retry later")
    return exc


def _skip_reset(conn: Conn) -> None:
    """Let this release skip the reset statement, if the connection is the pool's
    and is not left inside a transaction (asyncpg would roll that back anyway)."""
    if not conn.is_in_transaction():
        skip = getattr(conn, "skip_reset", None)  # a PooledConnection, through the proxy
        if skip is not None:
            skip()


def _space_literal(space_ids: Sequence[UUID]) -> str:
    return "{" + ",".join(str(s) for s in space_ids) + "}"


def side_tenant_args(team_id: str, space_ids: Sequence[UUID]) -> list[Any]:
    """The parameters of :data:`SIDE_TENANT_SQL`."""
    return [team_id, _space_literal(space_ids)]


# Statements asyncpg sends on its own: one-off type introspection of a new
# prepared statement, and the reset of a connection returned to the pool.
_DRIVER_QUERIES = ("pg_catalog.pg_type", "set_config('jit'", "pg_advisory_unlock_all()")


class StatementTally:
    """Statements of one request (the metrics' statements per request)."""

    count = 0


REQUEST_STATEMENTS: ContextVar[StatementTally | None] = ContextVar(
    "request_statements", default=None
)
"""Set by the HTTP edge per request. asyncpg calls query loggers with
``call_soon`` from the task that ran the statement, so they see its context."""


class StatementCounter:
    """Counts statements sent on the pool's connections: tests check with it that
    the number of statements of a recall does not grow with its limit."""

    def __init__(self) -> None:
        self.count = 0
        # Seconds from sending each statement to its answer (server time plus
        # the loopback round trip): the benchmark subtracts it to find the
        # gateway's own share of a recall.
        self.seconds = 0.0

    def __call__(self, record: object) -> None:
        query = str(getattr(record, "query", ""))
        if any(mark in query for mark in _DRIVER_QUERIES):
            return  # asyncpg's own: type introspection, pool reset
        self.count += 1
        self.seconds += float(getattr(record, "elapsed", 0.0) or 0.0)
        tally = REQUEST_STATEMENTS.get()
        if tally is not None:
            tally.count += 1


async def connect_once(dsn: str) -> asyncpg.Connection:
    """One connection, for migrations and checks before the pool exists."""
    try:
        return await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc


async def ensure_vector_available(conn: Conn) -> None:
    """A clear refusal for a server without pgvector, before anything depends on it."""
    row = await conn.fetchrow("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
    if row is None:
        version = await conn.fetchval("SHOW server_version")
        raise ConfigurationError(
            f"the PostgreSQL server (version {version}) has no 'vector' extension. Install "
            "pgvector on that server, or unset DATABASE_URL to use the embedded database."
        )


async def prepare(dsn: str, *, migrate: bool) -> list[migrations.Migration]:
    """Check pgvector and bring the schema up to date (or report what is pending)."""
    conn = await connect_once(dsn)
    try:
        await ensure_vector_available(conn)
        if migrate:
            return await migrations.migrate(conn)
        pending = await migrations.pending(conn)
        if pending:
            raise ConfigurationError(
                f"{len(pending)} migration(s) pending: run `recall-gateway migrate`"
            )
        return []
    finally:
        await conn.close()


async def _learn_domains(conn: asyncpg.Connection) -> None:
    """Tell a new connection that the schema's domain ``client_id`` is text.

    A record sent in binary names each field's own type, a domain too, while a
    result column names the domain's base type; so asyncpg meets the domain only
    inside records (the arrays of records of gateway/store/round_trips.py and of
    the nested rows), and fails there ("no decoder for composite type element")
    unless it knows the domain. Declaring the domain as text costs one small
    catalog lookup (asyncpg's full type introspection, tens of milliseconds on a
    new connection, made a read replica's pool look busy to the read router).
    Before the first migration there is no such type."""
    try:
        await conn.set_builtin_type_codec("client_id", schema="public", codec_name="text")
    except ValueError:
        pass  # not migrated yet: no domain, nothing to decode


class PooledConnection(asyncpg.Connection):
    """A pooled connection that can skip asyncpg's reset statement on release.

    asyncpg resets every connection it takes back (``pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL``): one more statement and round trip per
    release, two per recall (the token lookup's connection and the recall's
    unit), for session state the read path never creates. Its tenant settings,
    role and plan mode are transaction-local (``set_config(..., true)``), gone
    at COMMIT or ROLLBACK; its statements set no session setting, take no
    session lock, listen to nothing and open no cursor.

    So a use that knows it left no session state says so (:meth:`skip_reset`)
    after it has closed its transaction, and that one release skips the reset
    statement: a recall's unit, the token lookup, and every tenant transaction
    that committed (writes as ``recall_app`` too, :meth:`Database.tenant`).
    Every other release (admin work, the loader, a failed or cancelled use)
    keeps asyncpg's full reset, and asyncpg still rolls back a transaction left
    open, whatever was said. ``tests/test_pool_reset.py`` checks the session of
    a connection after recalls and writes of two teams."""

    __slots__ = ("_skip_reset",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skip_reset = False

    def skip_reset(self) -> None:
        """This use left no session state: its release sends no reset statement."""
        self._skip_reset = True

    def take_skip_reset(self) -> bool:
        skip, self._skip_reset = self._skip_reset, False
        return skip


async def _reset(conn: asyncpg.Connection) -> None:
    """The pool's reset (after asyncpg has rolled back any open transaction):
    asyncpg's own reset statement, unless the use said it left no session state."""
    if isinstance(conn, PooledConnection) and conn.take_skip_reset():
        return
    query = conn.get_reset_query()
    if query:
        await conn.execute(query)


async def _open_pool(
    dsn: str,
    what: str,
    *,
    min_size: int,
    max_size: int,
    counter: StatementCounter,
    server_settings: dict[str, str],
    check: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> asyncpg.Pool:
    """A pool of the gateway's connections (the unit's and the side ones): the
    vector codec, the domains, the statement counter and the reset rule on each;
    ``check`` runs first on every new connection (and may refuse it)."""

    async def init(conn: asyncpg.Connection) -> None:
        if check is not None:
            await check(conn)
        await register_vector(conn)
        await _learn_domains(conn)
        conn.add_query_logger(counter)

    try:
        return await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=init,
            reset=_reset,
            connection_class=PooledConnection,
            max_cacheable_statement_size=STATEMENT_CACHE_MAX_BYTES,
            server_settings=server_settings,
        )
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise DatabaseUnavailable(f"cannot open {what}: {exc}") from exc


class Database:
    """The asyncpg pool, and the transactions built on it."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        counter: StatementCounter | None = None,
        statement_timeout_ms: int = 5000,
        side: SideConnections | None = None,
    ) -> None:
        self.pool = pool
        # Connections reserved for a recall's statement beside its unit (None: none).
        self.side = side
        self.counter = counter or StatementCounter()
        # Statements or connections that failed because this server could not
        # serve them (see _SERVER_FAILURES), for the read router.
        self.server_failures = 0
        self.statement_timeout_ms = statement_timeout_ms
        # A read waits at most this long for a lock (a migration, a reindex)
        # before failing, so that an optional branch degrades instead of hanging.
        self.lock_timeout = _LOCK_TIMEOUT

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        statement_timeout_ms: int = 5000,
        settings: dict[str, str] | None = None,
        side_connections: int = 0,
        side_plan_cache_mode: str | None = None,
        lock_timeout: str = _LOCK_TIMEOUT,
    ) -> Database:
        """``side_connections``: how many connections to reserve for statements a
        recall sends beside its unit (:class:`SideConnections`; 0: none), planned
        with ``side_plan_cache_mode`` (None: the server's). ``lock_timeout``: how
        long a read waits for a lock (tenant transactions, and side connections'
        logins)."""
        counter = StatementCounter()
        pool = await _open_pool(
            dsn,
            "the connection pool",
            min_size=min_size,
            max_size=max_size,
            counter=counter,
            server_settings={
                "application_name": "recall-gateway",
                "statement_timeout": str(statement_timeout_ms),
                **(settings or {}),
            },
        )
        side = None
        if side_connections > 0:
            side = await SideConnections.open(
                dsn,
                side_connections,
                counter,
                # A pool that opens nothing at first (a replica not reachable yet)
                # opens its side connections on demand too.
                opened=side_connections if min_size > 0 else 0,
                statement_timeout_ms=statement_timeout_ms,
                lock_timeout=lock_timeout,
                plan_cache_mode=side_plan_cache_mode,
                settings=settings,
            )
        db = cls(pool, counter, statement_timeout_ms, side)
        db.lock_timeout = lock_timeout
        return db

    async def close(self, wait_s: float | None = None) -> None:
        """Close the pool, waiting at most ``wait_s`` seconds for connections in
        use; past it they are terminated, so a shutdown never hangs on one."""
        if self.side is not None:
            await self.side.close(wait_s)
        try:
            await asyncio.wait_for(self.pool.close(), wait_s)
        except TimeoutError:
            self.pool.terminate()

    @asynccontextmanager
    async def acquire(self, *, stateless: bool = False) -> AsyncIterator[Conn]:
        """A pooled connection, waited for within the request's deadline (a full pool
        queues the request instead of failing it); driver failures are translated.
        ``stateless``: the caller only reads, outside any transaction, and sets
        nothing (the token lookup), so a release after it returned normally skips
        the pool's reset statement (see :class:`PooledConnection`)."""
        try:
            async with self.pool.acquire(timeout=deadline.remaining()) as conn:
                yield conn
                if stateless:
                    _skip_reset(conn)
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            if deadline.remaining() is None:
                raise DatabaseUnavailable("the database did not answer in time") from exc
            raise RequestTimeout("the request took longer than its deadline") from exc
        except STORE_FAILURES as exc:
            self.note(exc)
            translated = translate(exc)
            if translated is exc:
                raise
            raise translated from exc

    def note(self, exc: BaseException) -> None:
        """Count ``exc`` if it says this server could not serve (see _SERVER_FAILURES)."""
        if isinstance(exc, _SERVER_FAILURES):
            self.server_failures += 1

    @asynccontextmanager
    async def tenant(
        self,
        team_id: str,
        space_ids: Sequence[UUID],
        *,
        readonly: bool = True,
        lock_timeout: str | None = None,
        claim_counter_shard: bool = False,
    ) -> AsyncIterator[Conn]:
        """A transaction confined by row-level security to one team's spaces; its
        statements are bounded by what is left of the request's deadline.
        ``lock_timeout`` overrides the reads' short default ('0': only the statement
        timeout bounds a wait, as for the loader). ``claim_counter_shard`` (writes):
        the transaction's counter shard is claimed with the settings, before any
        other lock (db/0160); if every shard stays held past the statement
        timeout, that is DATABASE_UNAVAILABLE, as any write too busy to go on.

        After a commit, the connection goes back to the pool without the reset
        statement: a tenant transaction's settings, role and counter shard (a
        transaction-level advisory lock, db/0160) end with it, and the
        statements run in it (gateway/store/, the triggers of db/) set no session
        setting, take no session lock, listen to nothing and keep no cursor open
        (``tests/test_pool_reset.py`` checks the session after writes of two
        teams). That is one round trip fewer at the end of every ``remember``.

        So a tenant block (every use of this method, and :meth:`unit`'s steps)
        must never create session state, which would outlive the request on the
        pooled connection and reach the next one, of any team: no plain ``SET``
        or ``set_config(..., false)`` (use ``SET LOCAL`` / ``set_config(...,
        true)``), no temporary table that outlives the transaction (only ``ON
        COMMIT DROP``), no session advisory lock (``pg_advisory_lock``; the
        ``_xact_`` forms are fine), no ``LISTEN``, no cursor ``WITH HOLD``, no SQL
        ``PREPARE`` (asyncpg's own prepared statements are per connection and
        carry no team), no ``SET ROLE`` or ``SET SESSION AUTHORIZATION``; nor may
        a function it calls. Such work goes through :meth:`admin` or
        :meth:`acquire`, whose releases keep the reset. The test suite checks
        every release that skips the reset (tests/session_guard.py) for the
        role and session user, settings, advisory locks, ``LISTEN``, holdable
        cursors and temporary tables. A failed or cancelled block keeps the reset
        (``tests/test_pool_reset.py``)."""
        budget = str(deadline.remaining_ms(self.statement_timeout_ms))
        async with self.acquire() as conn:
            async with conn.transaction(readonly=readonly):
                try:
                    await conn.execute(
                        _ENTER_TENANT_WRITING if claim_counter_shard else _ENTER_TENANT,
                        APP_ROLE,
                        team_id,
                        _space_literal(space_ids),
                        self.lock_timeout if lock_timeout is None else lock_timeout,
                        budget,
                    )
                except asyncpg.QueryCanceledError as exc:
                    if not claim_counter_shard or deadline.remaining() == 0.0:
                        raise  # the request's deadline, not the shards: RequestTimeout
                    raise DatabaseUnavailable(
                        "every counter shard was held by other writers for longer than the "
                        "statement timeout; nothing was written, and retrying with the same "
                        "IDs is safe"
                    ) from exc
                yield conn
            # Committed (a failure or a cancellation does not come here): what the
            # transaction set was transaction-local, so the release skips the reset
            # statement (see PooledConnection).
            _skip_reset(conn)

    @asynccontextmanager
    async def unit(
        self,
        team_id: str,
        space_ids: Sequence[UUID],
        *,
        readonly: bool = True,
        plan_cache_mode: str | None = None,
    ) -> AsyncIterator[Unit]:
        """One connection and one tenant transaction for every statement of one
        request (a recall): ``BEGIN``, the tenant settings and ``COMMIT`` once,
        instead of once per statement. ``plan_cache_mode`` (PostgreSQL's setting,
        for the unit's transaction only; None: the server's) is set with the tenant
        settings, in the same statement. See :class:`Unit`."""
        async with self.acquire() as conn:
            unit = Unit(self, conn, team_id, space_ids, readonly, plan_cache_mode)
            try:
                yield unit
            except BaseException:
                await unit.close(commit=False)
                raise
            await unit.close(commit=True)
            # Only transaction-local settings, and the transaction is closed: the
            # release skips the reset statement (see PooledConnection).
            _skip_reset(conn)

    @asynccontextmanager
    async def admin(
        self, *, isolation: str | None = None, readonly: bool = False
    ) -> AsyncIterator[Conn]:
        """A transaction as the connecting (owner) role: loader and operator work.

        ``isolation="repeatable_read"`` gives one snapshot for several reads (the
        community builder reads a graph and the counter it was built from)."""
        async with (
            self.acquire() as conn,
            conn.transaction(isolation=isolation, readonly=readonly),  # type: ignore[arg-type]
        ):
            yield conn


class SideConnections:
    """A few connections reserved for a recall's statement beside its unit.

    A recall reads most of its answer on its unit's one connection, one
    statement after another, while the machine has other cores: a part whose
    inputs are known early (relationship discovery, gateway/services/recall.py)
    can run on a second connection at the same time. Three rules make that safe.

    **Never waited for.** A recall holds its unit's connection while it would
    wait for a second one; if every connection of one pool were held by recalls
    waiting so, none would go on. So a recall takes a side connection only when
    one is free now (:meth:`take` counts them and never waits for another
    recall), from a pool of its own that nothing else uses; else it does the
    work on its unit's connection, as without side connections.

    **One statement, as the tenant.** A side connection logs in as ``recall_app``
    (the ``role`` startup setting, which also survives ``RESET ALL``), so every
    statement it plans is planned with row-level security, and the login is
    checked (:meth:`open` refuses a connection that is anyone else), and
    read-only (``default_transaction_read_only``). Its statement runs in an
    implicit transaction and begins with :data:`SIDE_TENANT_SQL`, its first
    selection. That the reads after it see the team and the spaces is a
    property of PostgreSQL's executor, not a rule of SQL: it evaluates a
    statement's uncorrelated scalar subqueries (InitPlans) lazily, when their
    selection is evaluated, in the selections' order, and each MATERIALIZED CTE
    when it is first read; the space wall's spaces are an InitPlan themselves
    (db/0121), the partitioned tables are read only inside the search
    functions, which plan their queries when called, so nothing reads a row at
    executor start. ``tests/test_side_connections.py`` shows the order (and
    that it fails closed: a read placed before the settings sees nothing, never
    more), and every recall's answer is checked against the unit's view. The
    settings are transaction-local and end with the statement. The statement
    reports ``current_user``, which its caller checks. So one statement is all
    a side use costs: no ``BEGIN``, settings or ``COMMIT`` of its own. The plan
    mode and the lock and statement timeouts are the login's.

    **Clean when returned.** The statement sets nothing beyond its implicit
    transaction, so a use that returned normally skips the reset statement; a
    failed or cancelled one (asyncpg cancels the statement on the server) keeps
    asyncpg's reset (``RESET ALL`` keeps the login's role), and
    ``tests/test_side_connections.py`` checks the session after both."""

    def __init__(self, pool: asyncpg.Pool, size: int) -> None:
        self.pool = pool
        self.size = size
        self.busy = 0
        # Recalls that took a side connection, those that found none free, and
        # those whose side statement's answer was used (SideTicket.used).
        self.taken = 0
        self.refused = 0
        self.used = 0

    @classmethod
    async def open(
        cls,
        dsn: str,
        size: int,
        counter: StatementCounter,
        *,
        opened: int,
        statement_timeout_ms: int,
        lock_timeout: str,
        plan_cache_mode: str | None,
        settings: dict[str, str] | None = None,
    ) -> SideConnections:
        async def is_app_role(conn: asyncpg.Connection) -> None:
            role = await conn.fetchval("SELECT current_user::text")
            if role != APP_ROLE:
                raise ConfigurationError(
                    f"a side connection logged in as {role!r}, not {APP_ROLE!r}: the login "
                    f"must be able to take the role {APP_ROLE} (GRANT {APP_ROLE} TO it)"
                )

        server_settings = {
            "application_name": "recall-gateway-side",
            **(settings or {}),
            "role": APP_ROLE,
            "statement_timeout": str(statement_timeout_ms),
            "lock_timeout": lock_timeout,
            # Discovery only reads: a write on a side connection fails.
            "default_transaction_read_only": "on",
        }
        if plan_cache_mode is not None:
            server_settings["plan_cache_mode"] = plan_cache_mode
        pool = await _open_pool(
            dsn,
            "the side connections",
            min_size=opened,
            max_size=size,
            counter=counter,
            server_settings=server_settings,
            check=is_app_role,
        )
        return cls(pool, size)

    def take(self) -> SideTicket | None:
        """A side connection if one is free now, else None (never waits)."""
        if self.busy >= self.size:
            self.refused += 1
            return None
        self.busy += 1
        self.taken += 1
        return SideTicket(self)

    async def close(self, wait_s: float | None = None) -> None:
        try:
            await asyncio.wait_for(self.pool.close(), wait_s)
        except TimeoutError:
            self.pool.terminate()


class SideTicket:
    """One taken side connection: :meth:`connection` uses it once; :meth:`release`
    gives the place back (idempotent; also when the connection was never used)."""

    def __init__(self, side: SideConnections) -> None:
        self._side = side
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._side.busy -= 1

    def used(self) -> None:
        """The side statement's answer went into the recall's (counted: tests and
        benchmarks tell a side use from a fallback to the unit by it)."""
        self._side.used += 1

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """The connection, outside any transaction. At most ``busy`` uses hold the
        pool's ``size`` connections, so acquiring one waits for no other use (only,
        rarely, for a reconnect). A use that returns normally skips the reset."""
        try:
            async with self._side.pool.acquire(timeout=deadline.remaining()) as conn:
                yield conn
                _skip_reset(conn)
        finally:
            self.release()


class Unit:
    """The statements of one request on one connection, in one tenant transaction.

    The transaction opens at the first :meth:`step` (so a caller can start
    other work, such as the query embedding, before it). A step whose
    statement fails has aborted the transaction: the unit rolls it back and
    the next step opens a new one, so a caller that degrades an optional part
    of its answer (and goes on) still reads in a working transaction, as it
    did when every statement had its own. The statements of one step see one
    snapshot; different steps see the database as of their own statements
    (read committed), which is what the separate transactions gave before:
    every read takes the view's instants explicitly (gateway/store/recall.py).
    """

    def __init__(
        self,
        db: Database,
        conn: Conn,
        team_id: str,
        space_ids: Sequence[UUID],
        readonly: bool,
        plan_cache_mode: str | None = None,
    ) -> None:
        self._db = db
        self._conn = conn
        self._team_id = team_id
        self._space_ids = space_ids
        self._readonly = readonly
        self._plan_cache_mode = plan_cache_mode
        self._tx: Transaction | None = None
        self._spaces: tuple[UUID, ...] = ()
        self._began: asyncio.Future[datetime] | None = None

    async def _begin(self, space_ids: Sequence[UUID]) -> None:
        tx = self._conn.transaction(readonly=self._readonly)
        await tx.start()
        self._tx = tx
        budget = str(deadline.remaining_ms(self._db.statement_timeout_ms))
        args = [APP_ROLE, self._team_id, _space_literal(space_ids), self._db.lock_timeout, budget]
        if self._plan_cache_mode is None:
            row = await self._conn.fetchrow(_ENTER_UNIT, *args)
        else:
            row = await self._conn.fetchrow(_ENTER_UNIT_PLANNED, *args, self._plan_cache_mode)
        assert row is not None
        self._spaces = tuple(space_ids)
        began = self._began_future()
        if not began.done():
            began.set_result(row[-1])

    def _began_future(self) -> asyncio.Future[datetime]:
        if self._began is None:
            self._began = asyncio.get_running_loop().create_future()
        return self._began

    async def began(self) -> datetime:
        """The instant (``now()``) of the unit's first transaction, once its tenant
        settings are made (at its first step): a current view's system time, when
        the view is read in that transaction (the caller checks that it was)."""
        return await asyncio.shield(self._began_future())

    @asynccontextmanager
    async def step(self, space_ids: Sequence[UUID] | None = None) -> AsyncIterator[Conn]:
        """The unit's connection inside its transaction, for one step's statements.

        ``space_ids`` narrows the spaces row-level security lets this step read
        (a fallback that must not touch a failing branch); by default the unit's
        own. Narrowing costs one statement, and the next step widens again."""
        spaces = tuple(self._space_ids if space_ids is None else space_ids)
        try:
            if self._tx is None:
                await self._begin(spaces)
            elif set(spaces) != set(self._spaces):
                await self._conn.execute(_SET_SPACES, _space_literal(spaces))
                self._spaces = spaces
            yield self._conn
        except asyncio.CancelledError:
            self._tx = None  # the pool resets or discards the connection
            raise
        except BaseException as exc:
            self._db.note(exc)  # also when the caller degrades on it
            await self._abandon()
            raise

    async def _abandon(self) -> None:
        tx, self._tx = self._tx, None
        if tx is None:
            return
        try:
            await tx.rollback()
        except STORE_FAILURES:
            pass  # a broken connection: the next step fails, and the pool discards it

    async def commit(self) -> None:
        """Commit what the steps wrote (a recall's feedback snapshot) now; a later
        step opens a new transaction."""
        tx, self._tx = self._tx, None
        if tx is not None:
            await tx.commit()

    async def close(self, *, commit: bool) -> None:
        if commit:
            await self.commit()
        else:
            await self._abandon()


async def ping(db: Database) -> None:
    """Raise unless the server answers a trivial query."""
    async with db.pool.acquire(timeout=5) as conn:
        await conn.fetchval("SELECT 1")


async def pending_migrations(db: Database) -> list[migrations.Migration]:
    async with db.pool.acquire(timeout=5) as conn:
        return await migrations.pending(conn)
