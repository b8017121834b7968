"""The GraphQL-over-HTTP view: media types, status codes, deadline, persisted queries.

What strawberry's ASGI view does not do by itself, following the
GraphQL-over-HTTP specification (checked by the graphql-http audit in CI):

- a client that accepts ``application/graphql-response+json`` gets it, and a
  request error (parse, validation, variable coercion, a refused limit) is then
  HTTP 400 with no ``data`` entry; with ``application/json`` it stays 200, as
  the specification asks for legacy clients;
- errors outside execution (bad JSON, batching off, a persisted-query miss)
  are GraphQL-shaped bodies with a code, never a plain-text reason;
- each request runs under the deadline (``RECALL_REQUEST_TIMEOUT_MS``), past
  which its work is cancelled and it answers 504 ``REQUEST_TIMEOUT``;
- the document of a persisted query is resolved before execution.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import orjson
from cross_web import AsyncHTTPRequestAdapter, HTTPException
from graphql import GraphQLError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send
from strawberry.asgi import GraphQL
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.schema import BaseSchema
from strawberry.schema.exceptions import InvalidOperationTypeError
from strawberry.types import ExecutionResult

from gateway.deadline import deadline
from gateway.errors import GatewayError, Unauthenticated
from gateway.graphiql import GraphiQLPage
from gateway.http.errors import (
    GRAPHQL_RESPONSE_JSON,
    JSON,
    REQUEST_ERROR,
    RequestRejected,
    code_for,
    error_response,
)
from gateway.http.limits import Limits
from gateway.http.persisted import PersistedQueries
from gateway.schema.context import RequestContext
from gateway.store import replicas

# What the client has seen (a position a response answered with), and the
# position a response answers with: read-your-writes over read replicas
# (gateway/store/replicas.py, docs/deploy.md).
POSITION_HEADER = "x-recall-min-position"
POSITION_ANSWER = "X-Recall-Position"

log = logging.getLogger("gateway.http")


def negotiate(accept: str | None) -> str:
    """``application/graphql-response+json`` when the client accepts it (with a
    quality not below JSON's), else ``application/json``."""
    quality: dict[str, float] = {}
    for part in (accept or "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        quality[media.lower()] = max(q, quality.get(media.lower(), 0.0))
    wanted = quality.get(GRAPHQL_RESPONSE_JSON, 0.0)
    if wanted > 0 and wanted >= quality.get(JSON, 0.0):
        return GRAPHQL_RESPONSE_JSON
    return JSON


_GATEWAY_STATUS = {"DATABASE_UNAVAILABLE": 503, "REQUEST_TIMEOUT": 504}
# How long a client should wait before retrying a request that failed only
# because the database was away (a restart or failover takes seconds).
RETRY_AFTER_S = "5"


def _retry_headers(code: str) -> dict[str, str] | None:
    return {"Retry-After": RETRY_AFTER_S} if code == "DATABASE_UNAVAILABLE" else None


def _failed_for_the_database(data: GraphQLHTTPResponse) -> bool:
    """Nothing answered (no data, or only nulls at the top) and every error is
    DATABASE_UNAVAILABLE: the request as a whole failed for the database, so the
    status says so (503), and a load balancer or client can retry elsewhere."""
    errors: list[dict[str, Any]] = list(data.get("errors") or [])  # type: ignore[arg-type]
    answered = data.get("data")
    return (
        bool(errors)
        and all((e.get("extensions") or {}).get("code") == "DATABASE_UNAVAILABLE" for e in errors)
        and (answered is None or all(v is None for v in answered.values()))
    )


MAX_JSON_DEPTH = 64
"""Nesting of a request's JSON (body, GET ``variables`` and ``extensions``):
far above any real input, far below Python's recursion limit."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_METHODS = ("GET", "POST")
_SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store")]


def _bad_request(message: str, **extra: object) -> RequestRejected:
    return RequestRejected(400, "BAD_REQUEST", message, extra)


def _path(trail: tuple[str | int, ...]) -> str:
    text = ""
    for part in trail:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def check_json(value: object) -> None:
    """Refuse JSON nested deeper than ``MAX_JSON_DEPTH`` and text that is not
    Unicode (a lone surrogate, which JSON's ``\\ud800`` escapes can produce and
    which UTF-8 cannot encode). Iterative: the nesting is what is being checked."""
    pending: list[tuple[object, tuple[str | int, ...]]] = [(value, ())]
    while pending:
        current, trail = pending.pop()
        if len(trail) > MAX_JSON_DEPTH:
            raise _bad_request(f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep.")
        if isinstance(current, str):
            if _SURROGATE.search(current):
                where = _path(trail) or "the body"
                raise _bad_request(
                    f"{where} is not valid Unicode text (it holds a lone surrogate).",
                    field=where,
                )
        elif isinstance(current, dict):
            for key, item in current.items():
                if _SURROGATE.search(key):
                    raise _bad_request("A JSON key is not valid Unicode text.")
                pending.append((item, (*trail, key)))
        elif isinstance(current, list):
            pending.extend((item, (*trail, i)) for i, item in enumerate(current))


def decode_json(data: str | bytes) -> object:
    """JSON of a request: UTF-8 only (never guessed), bounded nesting, Unicode text.

    ``bytes`` is a POST body, which must be an object (or, batched, an array of
    objects); ``str`` is a GET's ``variables`` or ``extensions``, whose type
    strawberry checks."""
    body = isinstance(data, bytes)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad_request("The body is not UTF-8 text.") from None
    try:
        value = json.loads(data)
    except RecursionError:
        raise _bad_request(f"The JSON is nested more than {MAX_JSON_DEPTH} levels deep.") from None
    check_json(value)
    if body:
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, dict) for item in items):
            raise _bad_request(
                "The body must be a JSON object with the GraphQL request "
                '({"query": ...}), or an array of them when batching is on.'
            )
    return value


def encode_json(data: object) -> bytes:
    """A response body as compact UTF-8 JSON, with orjson: a full recall's answer
    (about 6 KB) takes a tenth of the standard library encoder's time
    (docs/benchmarks.md, "Worker CPU per recall at 100k"). The same JSON
    values as ``json.dumps``; text that is not ASCII is written as UTF-8
    rather than ``\\u`` escapes. What orjson
    refuses (a lone surrogate in a string, an integer beyond 64 bits, a key
    that is not a string, a subclass of ``float``) is encoded by the standard
    library as before. The schema has no ``Float`` field and graphql-core
    refuses non-finite numbers, so orjson's ``null`` for ``NaN`` (where the
    standard library wrote the invalid token ``NaN``) is never reached. Bytes
    suit HTTP bodies only: strawberry would send them over a WebSocket as
    binary frames, and the gateway routes no WebSocket (app.py)."""
    try:
        return orjson.dumps(data)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(data, separators=(",", ":")).encode()


def _charset(content_type: str | None) -> str | None:
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def _is_request_error(result: ExecutionResult) -> bool:
    """Refused before execution: no data, and no error belongs to a field."""
    return (
        bool(result.errors)
        and result.data is None
        and all(e.path is None for e in result.errors or ())
    )


def _code_stray(error: dict[str, Any], raw: GraphQLError, request_id: str) -> None:
    """Mask an error that no extension saw: strawberry turns an exception raised
    outside the extensions' reach (in a validation rule's constructor, say) into
    an error carrying the exception's own text. Like every unexpected error, it
    becomes INTERNAL with the request ID, and the log has the stack trace."""
    log.error("request %s failed", request_id, exc_info=raw.original_error)
    error.clear()
    error["message"] = "Internal server error"
    error["extensions"] = {"code": "INTERNAL", "requestId": request_id}


class GraphQLHTTPView(GraphQL[RequestContext, None]):
    """Strawberry's ASGI view with the behaviour above; app.py adds the context."""

    def __init__(self, schema: BaseSchema, limits: Limits) -> None:
        super().__init__(
            schema,
            graphql_ide="graphiql" if limits.graphiql else None,
            allow_queries_via_get=True,
        )
        self.limits = limits
        # The gateway's own GraphiQL page (no CDN); app.py routes its files.
        self.ide = GraphiQLPage() if limits.graphiql else None
        # Set by the app's lifespan once the database is open.
        self.persisted: PersistedQueries | None = None
        self.reads: replicas.ReadRouter | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        request = Request(scope=scope, receive=receive)
        media = negotiate(request.headers.get("accept"))
        request.state.graphql_media = media

        async def send_secured(message: Message) -> None:
            # Answers are per caller and typed by their header: no cache keeps
            # them, no browser sniffs them as something else.
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                # the GraphiQL page sets them itself: one of each, not two
                headers += [(n, v) for n, v in _SECURITY_HEADERS if n not in present]
                message["headers"] = headers
            await send(message)

        response: Response
        seconds = self.limits.request_timeout_ms / 1000
        try:
            if request.method not in _METHODS:
                raise RequestRejected(
                    405,
                    "METHOD_NOT_ALLOWED",
                    f"{request.method} is not supported: send GraphQL with GET or POST.",
                )
            with deadline(seconds), replicas.read_scope(request.headers.get(POSITION_HEADER)):
                async with asyncio.timeout(seconds):
                    response = await self.run(request)
        except HTTPException as exc:
            if isinstance(exc.__cause__, InvalidOperationTypeError):
                # a mutation over GET: only POST can carry it
                response = error_response(
                    405,
                    "METHOD_NOT_ALLOWED",
                    exc.reason,
                    media_type=media,
                    headers={"Allow": "POST"},
                )
            else:
                response = error_response(
                    exc.status_code,
                    code_for(exc.status_code, exc.reason),
                    exc.reason,
                    media_type=media,
                )
        except RequestRejected as exc:
            status = exc.status
            if status == REQUEST_ERROR:
                status = 400 if media == GRAPHQL_RESPONSE_JSON else 200
            response = error_response(
                status,
                exc.code,
                exc.message,
                media_type=media,
                extra=exc.extra,
                headers={"Allow": "GET, POST"} if status == 405 else None,
            )
        except TimeoutError:
            log.warning("request %s passed its deadline", getattr(request.state, "request_id", "?"))
            response = error_response(
                504,
                "REQUEST_TIMEOUT",
                f"The request took longer than {self.limits.request_timeout_ms} ms.",
                media_type=media,
            )
        except GatewayError as exc:  # before execution: e.g. the APQ store's database
            status = _GATEWAY_STATUS.get(exc.code, 400)
            response = error_response(
                status, exc.code, exc.message, media_type=media, headers=_retry_headers(exc.code)
            )
        except Exception:
            request_id = getattr(request.state, "request_id", "?")
            log.exception("request %s failed", request_id)
            response = error_response(
                500,
                "INTERNAL",
                "Internal server error",
                media_type=media,
                extra={"requestId": request_id},
            )
        await response(scope, receive, send_secured)

    def decode_json(self, data: str | bytes) -> object:
        return decode_json(data)

    def encode_json(self, data: object) -> bytes:
        return encode_json(data)

    def should_render_graphql_ide(self, request: Any) -> bool:
        """Not for an APQ GET, which has ``extensions`` and no ``query``."""
        if request.query_params.get("extensions") is not None:
            return False
        return super().should_render_graphql_ide(request)

    async def render_graphql_ide(self, request: Request) -> Response:
        assert self.ide is not None  # strawberry renders the IDE only when it is on
        return self.ide.render(request.url.path)

    async def get_sub_response(self, request: Any) -> Response:
        sub = await super().get_sub_response(request)
        sub.media_type = getattr(request.state, "graphql_media", JSON)
        request.state.sub_response = sub
        return sub

    async def parse_http_body(
        self, request: AsyncHTTPRequestAdapter
    ) -> GraphQLRequestData | list[GraphQLRequestData]:
        if request.method == "POST":
            charset = _charset(request.content_type)
            if charset not in (None, "utf-8", "utf8"):
                raise RequestRejected(
                    415,
                    "UNSUPPORTED_MEDIA_TYPE",
                    f"charset={charset} is not supported: send UTF-8.",
                )
            media = (request.content_type or "").split(";")[0].strip().lower()
            multipart = self.multipart_uploads_enabled and media == "multipart/form-data"
            # strawberry's own test, with its bare "Unsupported content type": say
            # what came and what to send (curl -d without a Content-Type header
            # sends a form, the commonest first mistake)
            if "application/json" not in media and not multipart:
                raise _bad_request(
                    f"Unsupported content type (got {media[:100] or 'none'}): send the GraphQL "
                    "request as a JSON body with the header Content-Type: application/json."
                )
        return await super().parse_http_body(request)

    async def execute_operation(
        self,
        request: Any,
        request_adapter: AsyncHTTPRequestAdapter,
        request_data: GraphQLRequestData | list[GraphQLRequestData],
        context: Any,
        root_value: Any,
        sub_response: Any,
    ) -> Any:
        """Resolve persisted queries (they need the caller, known by now: strawberry
        builds the context before it reads the body), run, then keep the
        documents that validated."""
        persisted = self.persisted
        if persisted is None:
            return await super().execute_operation(
                request, request_adapter, request_data, context, root_value, sub_response
            )
        principal = getattr(context, "principal", None)
        auth_error = getattr(context, "auth_error", None)
        unavailable = None if isinstance(auth_error, Unauthenticated) else auth_error
        items = request_data if isinstance(request_data, list) else [request_data]
        resolved = [await persisted.resolve(item, principal, unavailable) for item in items]
        data = [item for item, _ in resolved]
        result = await super().execute_operation(
            request,
            request_adapter,
            data if isinstance(request_data, list) else data[0],
            context,
            root_value,
            sub_response,
        )
        results = result if isinstance(result, list) else [result]
        for (_, registration), outcome in zip(resolved, results, strict=False):
            if registration is None or not isinstance(outcome, ExecutionResult):
                continue
            if _is_request_error(outcome):
                continue  # junk never takes a slot
            try:
                await persisted.register(registration)
            except Exception:  # a cache: the answer stands without it
                log.warning("persisted query not kept", exc_info=True)
        return result

    async def process_result(self, request: Any, result: ExecutionResult) -> GraphQLHTTPResponse:
        data = await super().process_result(request, result)
        reads = self.reads
        if reads is not None and reads.enabled and result.data is not None:
            consistency = await reads.consistency()
            extensions = dict(data.get("extensions") or {})
            extensions["consistency"] = consistency
            data["extensions"] = extensions
            if "position" in consistency:
                request.state.sub_response.headers[POSITION_ANSWER] = consistency["position"]
        formatted: list[dict[str, Any]] = list(data.get("errors") or [])  # type: ignore[arg-type]
        for error, raw in zip(formatted, result.errors or [], strict=False):
            if "code" not in (error.get("extensions") or {}):
                _code_stray(error, raw, getattr(request.state, "request_id", "?"))
        if _is_request_error(result) and request.state.graphql_media == GRAPHQL_RESPONSE_JSON:
            data.pop("data", None)
            sub: Response = request.state.sub_response
            if sub.status_code is None:
                sub.status_code = 400
        if _failed_for_the_database(data):
            sub = request.state.sub_response
            sub.status_code = 503
            sub.headers["Retry-After"] = RETRY_AFTER_S
        return data

    def create_response(
        self,
        response_data: GraphQLHTTPResponse | list[GraphQLHTTPResponse],
        sub_response: Response,
    ) -> Response:
        response = Response(
            self.encode_json(response_data),
            status_code=sub_response.status_code or 200,
            media_type=sub_response.media_type or JSON,
        )
        response.headers.raw.extend(sub_response.headers.raw)
        if sub_response.background:
            response.background = sub_response.background
        return response
