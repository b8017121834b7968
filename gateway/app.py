"""The Starlette application: ``/graphql``, ``/healthz`` and ``/readyz``.

The lifespan owns the process-wide resources (the database, started embedded
when no DSN is configured, the pool and the embedding provider); each request
gets its own context with the authenticated caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from strawberry.schema.config import StrawberryConfig

from gateway import heap
from gateway.embedded import EmbeddedPostgres, ServerMemory, machine_memory_mb
from gateway.embeddings import EmbeddingProvider, StoreModel, create_provider
from gateway.errors import ConfigurationError, DatabaseUnavailable, GatewayError, Unauthenticated
from gateway.http import limits as http_limits
from gateway.http.body import RequestBodyMiddleware
from gateway.http.documents import Documents
from gateway.http.errors import error_response
from gateway.http.persisted import PersistedQueries, load_manifest
from gateway.http.view import GraphQLHTTPView
from gateway.observability import Observability, logs
from gateway.schema import build_schema
from gateway.schema.context import RequestContext
from gateway.services.auth import authenticate, bearer
from gateway.services.feedback import FeedbackService
from gateway.services.mutations import MutationService
from gateway.services.recall import RecallService, plan_cache_mode
from gateway.services.reembed import read_store_model, watch_store_model
from gateway.services.warmup import WarmUp
from gateway.services.warmup import budget_mb as warm_up_budget
from gateway.services.warmup import check_budget as check_warm_up_budget
from gateway.services.writes import WriteService
from gateway.serving import Drain
from gateway.settings import Settings
from gateway.store.database import Database, pending_migrations, ping, prepare
from gateway.store.replicas import ReadRouter, commit_settings

log = logging.getLogger("gateway")
# How often a serving process looks at the store's model: after a re-embed's
# switch, questions are embedded with the new model within this many seconds.
STORE_MODEL_POLL_S = 1.0
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


@dataclass
class Services:
    """What one process shares across requests."""

    settings: Settings
    db: Database
    # Which pool recall and trace read from: a read replica or ``db``.
    reads: ReadRouter
    embedder: EmbeddingProvider
    writes: WriteService
    recall: RecallService
    feedback: FeedbackService
    mutations: MutationService
    # The store's model as last read; None for services built without one (no check).
    store_model: StoreModel | None = None


class RequestIdMiddleware:
    """Give every request an ID (the client's ``X-Request-ID`` if well-formed) and
    return it, so a masked error in a response can be found in the logs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        await self.app(scope, receive, send_with_id)


class GatewayGraphQL(GraphQLHTTPView):
    async def get_context(self, request: Any, response: Any) -> RequestContext:
        services: Services = request.app.state.services
        ctx = RequestContext(
            request=request,
            response=response,
            services=services,
            request_id=getattr(request.state, "request_id", uuid.uuid4().hex),
        )
        raw = bearer(request.headers.get("authorization"))
        if raw is not None:
            try:
                ctx.principal = await authenticate(services.db, raw)
            except (Unauthenticated, DatabaseUnavailable) as exc:
                # Raised by the first field that needs the caller: a database that
                # is down answers DATABASE_UNAVAILABLE, not a 500.
                ctx.auth_error = exc
        return ctx


async def not_found(request: Request, exc: Exception) -> Response:
    """A path the gateway does not serve: a coded JSON 404 that says where GraphQL
    is, instead of Starlette's plain-text "Not Found" (what a newcomer opening
    the server's root in a browser got)."""
    return error_response(
        404,
        "NOT_FOUND",
        f"nothing is served at '{request.url.path[:200]}': GraphQL is at /graphql "
        "(POST, or GET; GraphiQL there in a browser when it is on), health at /healthz "
        "and /readyz",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    drain: Drain | None = request.app.state.drain
    if drain is not None and drain.draining:
        # SIGTERM: out of the load balancer at once, before anything else is asked.
        return JSONResponse({"status": "not ready", "reason": "shutting down"}, 503)
    services: Services = request.app.state.services
    try:
        await ping(services.db)
        waiting = await pending_migrations(services.db)
    except (GatewayError, OSError, TimeoutError) as exc:
        log.warning("not ready: %s", exc)
        return JSONResponse({"status": "not ready", "reason": "database unavailable"}, 503)
    except Exception:  # asyncpg raises many kinds when the server is away
        log.warning("not ready", exc_info=True)
        return JSONResponse({"status": "not ready", "reason": "database unavailable"}, 503)
    if waiting:
        return JSONResponse(
            {"status": "not ready", "reason": f"{len(waiting)} migration(s) pending"}, 503
        )
    warm: WarmUp | None = getattr(request.app.state, "warmup", None)
    if warm is not None and warm.warming:
        return JSONResponse({"status": "not ready", "reason": warm.progress()}, 503)
    mismatch = services.store_model.mismatch() if services.store_model is not None else None
    if mismatch is not None:
        # Still 200: reads answer (without their vector lists), and a 503 would take
        # every replica out of service at once when a reembed moves the store on.
        return JSONResponse({"status": "degraded", "reason": f"{mismatch}; writes are refused"})
    return JSONResponse({"status": "ready"})


SERVES_EMBEDDED_ENV = "RECALL_SERVE_EMBEDDED_SERVER"
"""``1`` when the DSN that ``serve`` hands its worker processes (as
``RECALL_DATABASE_URL``) is the embedded server it started: set by the CLI, not
by users. The workers then apply the embedded server's defaults (the warm-up's
budget), not an external server's."""


def create_served_app() -> Starlette:
    """The app of ``serve`` worker processes (uvicorn's factory): settings from the
    environment, SIGTERM drained, the start-up heap frozen."""
    return create_app(
        handle_sigterm=True,
        settle_heap=True,
        embedded_server=os.environ.get(SERVES_EMBEDDED_ENV) == "1",
    )


def create_app(
    settings: Settings | None = None,
    observability: Observability | None = None,
    *,
    handle_sigterm: bool = False,
    settle_heap: bool = False,
    embedded_server: bool = False,
) -> Starlette:
    """The ASGI application. With no ``database_url`` it runs the embedded PostgreSQL.

    ``handle_sigterm``: the process is a server whose SIGTERM should drain it
    (gateway/serving.py); off for an app embedded elsewhere, tests included.
    ``settle_heap``: the process serves this app and nothing else, so once it is
    ready its start-up heap is frozen and the collector runs less often
    (gateway/heap.py); off elsewhere, where the process has other work.
    ``embedded_server``: ``settings.database_url`` is the embedded server that
    ``serve`` started (or found running) for this app, so the embedded server's
    defaults apply: the start-up warm-up runs unless RECALL_WARM_UP_MB says
    otherwise (with a server of the user's own it is off by default)."""
    settings = settings or Settings()
    grace_s = settings.shutdown_grace_ms / 1000
    logs.configure(settings.log_level, settings.log_format)
    observability = observability or Observability.from_environment(
        metrics_enabled=settings.metrics
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        embedded: EmbeddedPostgres | None = None
        dsn = settings.database_url
        local = dsn is None or embedded_server
        if local:
            check_warm_up_budget(settings.warm_up_mb, machine_memory_mb())
        if dsn is None:
            memory = ServerMemory.from_settings(settings)
            embedded = EmbeddedPostgres(settings.data_dir, memory=memory).start()
            dsn = embedded.dsn
        try:
            await prepare(dsn, migrate=settings.migrate_on_start)
            db = await Database.open(
                dsn,
                min_size=settings.pool_min_size,
                max_size=settings.pool_max_size,
                statement_timeout_ms=settings.statement_timeout_ms,
                # read-your-writes on replicas needs commits flushed before they return
                settings=await commit_settings(dsn) if settings.read_urls else None,
                side_connections=settings.side_connections,
                side_plan_cache_mode=plan_cache_mode(settings.plan_cache_mode),
            )
            # The store's model decides the local model under RECALL_EMBEDDING_MODEL=auto.
            held = await read_store_model(db)
            embedder = observability.embedder(create_provider(settings, held))
            store_model = StoreModel(embedder, held)
            mismatch = store_model.mismatch()
            if mismatch is not None:
                log.warning(
                    "%s: recall skips its vector lists and writes are refused until they "
                    "match (RECALL_EMBEDDING_PROVIDER, RECALL_EMBEDDING_MODEL, "
                    "RECALL_OPENAI_MODEL; or run reembed)",
                    mismatch,
                )
            # Load (and checksum) a local model now, so a bad file fails the start,
            # not the first request.
            load = getattr(embedder, "load", None)
            if callable(load):
                await asyncio.to_thread(load)
            watcher = asyncio.create_task(
                watch_store_model(dsn, store_model, STORE_MODEL_POLL_S), name="store-model-watch"
            )
            reads = await ReadRouter.open(
                db,
                settings.read_urls,
                max_size=settings.pool_max_size,
                statement_timeout_ms=settings.statement_timeout_ms,
                side_connections=settings.side_connections,
                side_plan_cache_mode=plan_cache_mode(settings.plan_cache_mode),
                max_lag_s=settings.replica_max_lag_ms / 1000,
                wait_s=settings.replica_wait_ms / 1000,
                interval_s=settings.replica_check_interval_ms / 1000,
                # a knownAt instant has settled once every write transaction that
                # started before it has ended: a mutation within its request deadline
                settle_s=limits.request_timeout_ms / 1000,
            )
            feedback = FeedbackService(db, enabled=settings.feedback_enabled)
            writes = WriteService(db, embedder)
            app.state.services = Services(
                settings,
                db,
                reads,
                embedder,
                writes,
                observability.recall_service(
                    db,
                    embedder,
                    feedback,
                    store_model,
                    reads,
                    plan_mode=plan_cache_mode(settings.plan_cache_mode),
                ),
                feedback,
                MutationService(writes),
                store_model,
            )
            graphql.reads = reads
            graphql.persisted = _persisted(settings, limits, db)
            # in the background: /readyz says 503 until it ends, requests are served
            warm = WarmUp(
                dsn,
                warm_up_budget(settings.warm_up_mb, embedded=local),
                settings.statement_timeout_ms,
                machine_mb=machine_memory_mb() if local else None,
            )
            app.state.warmup = warm
            warming = asyncio.create_task(warm.run(), name="warm-up")
            drain = Drain(settings.shutdown_drain_ms / 1000) if handle_sigterm else None
            app.state.drain = drain if drain is not None and drain.install() else None
            if settle_heap:
                heap.settle()
            try:
                yield
            finally:
                if drain is not None:
                    drain.uninstall()
                for task in (watcher, warming):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await reads.close(wait_s=grace_s)
                # Connections still in use after the grace period are cut: an
                # idle pool must not keep PostgreSQL's smart shutdown waiting.
                await db.close(wait_s=grace_s)
                await embedder.aclose()
                await observability.shutdown()
        finally:
            if embedded is not None:
                embedded.stop()

    limits = http_limits.resolve(settings)
    documents = Documents()  # parsed documents and validation answers, bounded in bytes
    schema = build_schema(
        extensions=[
            *http_limits.validation_extensions(limits, documents),
            *observability.extensions(),
        ],
        hide_suggestions=not limits.introspection,
        config=StrawberryConfig(
            batching_config={"max_operations": limits.max_batch_size} if limits.batching else None
        ),
    )
    graphql = GatewayGraphQL(schema, limits)
    app = Starlette(
        routes=[
            # every method reaches the view, which answers the others with a
            # coded 405 (Starlette's own is plain text and lists HEAD)
            Route("/graphql", graphql),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            *(graphql.ide.routes() if graphql.ide else []),
            *observability.routes(),
        ],
        exception_handlers={404: not_found},
        lifespan=lifespan,
    )
    app.state.drain = None
    app.state.documents = documents
    # The MCP server runs its tools through the same view (schema, limits).
    app.state.graphql = graphql
    app.add_middleware(RequestBodyMiddleware, max_bytes=limits.max_body_bytes)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=[
                "authorization",
                "content-type",
                "x-request-id",
                "x-recall-min-position",
            ],
            expose_headers=["x-request-id", "x-recall-position"],
            max_age=600,
        )
    observability.install(app)
    app.add_middleware(RequestIdMiddleware)
    observability.wrap_outermost(app)
    return app


def _persisted(settings: Settings, limits: http_limits.Limits, db: Database) -> PersistedQueries:
    """The persisted-query resolver of the configured mode (``off`` refuses the extension)."""
    manifest = None
    if settings.persisted_queries == "allowlist":
        if settings.persisted_query_manifest is None:
            raise ConfigurationError(
                "RECALL_PERSISTED_QUERIES=allowlist needs RECALL_PERSISTED_QUERY_MANIFEST"
            )
        manifest = load_manifest(settings.persisted_query_manifest)
    return PersistedQueries(
        db,
        settings.persisted_queries,
        max_entries=settings.persisted_query_max_entries,
        max_bytes=settings.persisted_query_max_bytes,
        manifest=manifest,
    )
