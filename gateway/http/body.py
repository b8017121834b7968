"""The request body: read once, bounded, and the client's going away seen.

The body is refused with 413 and the code ``REQUEST_TOO_LARGE`` past
``RECALL_MAX_BODY_BYTES``, and a GET's query string past that or 64 KiB,
whichever is smaller, before anything parses them. Once it is read, this middleware owns the client's channel: when the
client disconnects before the answer is ready, the request's work is
cancelled (its database statements with it: asyncpg cancels a query whose
task is cancelled) instead of running on for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("gateway.http")

MAX_QUERY_STRING_BYTES = 65_536
"""A GET's query string is bounded below the body limit. Under ``serve`` the URL as a
whole is bounded first, at 65,535 bytes, by gateway/serving.py (httptools' URL
parser refuses longer ones), with the same coded 413."""


def _too_large(limit: int) -> bytes:
    return json.dumps(
        {
            "errors": [
                {
                    "message": f"The request is larger than {limit} bytes.",
                    "extensions": {"code": "REQUEST_TOO_LARGE", "maxBytes": limit},
                }
            ]
        }
    ).encode()


class RequestBodyMiddleware:
    """Read the body bounded by ``max_bytes``; cancel the request if the client leaves."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Send, limit: int | None = None) -> None:
        body = _too_large(self.max_bytes if limit is None else limit)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query_limit = min(self.max_bytes, MAX_QUERY_STRING_BYTES)
        if len(scope.get("query_string", b"")) > query_limit:
            await self._refuse(send, query_limit)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        await self._run(scope, body, receive, send)

    async def _run(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        replayed = False

        async def app_receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def run() -> None:
            await self.app(scope, app_receive, send)

        work = asyncio.create_task(run())
        watcher = asyncio.create_task(watch())
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not work.done():
                log.info(
                    "client went away; request %s cancelled",
                    scope.get("state", {}).get("request_id"),
                )
                work.cancel()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        with contextlib.suppress(asyncio.CancelledError):
            await work
        if not work.cancelled():
            work.result()
