"""How ``serve`` runs uvicorn: read timeouts on the connection, and a drain on SIGTERM.

uvicorn bounds neither how long a client may take to send its headers (a
connection that opens and sends nothing, or a header line a minute) nor how
long it may take to send the body it announced (``Content-Length: 100`` and
then 10 bytes): each such connection is held open with no answer, and a few
hundred of them are a denial of service. :class:`TimedHttpToolsProtocol` is
uvicorn's httptools protocol with two timers: one from the first byte of a
request (or the connection's opening) until its headers are complete, one from
then until its body is complete. Either one firing answers 408
``REQUEST_READ_TIMEOUT`` with ``Connection: close`` (or just closes, when an
answer was already sent) and drops the connection; the request's handler sees
the client gone and stops.

It also bounds the request's head, so that every oversized URL or header gets
the gateway's coded JSON answer rather than uvicorn's plain-text 400
("Invalid HTTP request received."). httptools' URL parser stores offsets in
16 bits and refuses any URL longer than 65,535 bytes with
``HttpParserInvalidURLError``, raised inside uvicorn's ``on_headers_complete``,
which uvicorn turns into that plain-text answer; llhttp itself bounds neither
the URL nor the headers, so uvicorn would buffer a head of any size. Here a
URL over :data:`MAX_URL_BYTES` answers 413 ``REQUEST_TOO_LARGE`` (as a GET's
oversized query string does), headers whose names and values add up to more
than :data:`MAX_HEADER_BYTES` answer 431 ``REQUEST_HEADERS_TOO_LARGE``, both as
soon as the limit is passed (before the rest arrives); any other request
httptools cannot parse answers 400 ``BAD_REQUEST``. Each closes the connection.

:class:`Drain` is what SIGTERM does to a serving process: ``/readyz`` answers
503 at once, so that a load balancer takes the instance out, while requests are
still served for ``RECALL_SHUTDOWN_DRAIN_MS``; then uvicorn's own shutdown runs
(no new connections, in-flight requests get ``RECALL_SHUTDOWN_GRACE_MS`` to
finish before they are cancelled), and the lifespan closes the pool, so that
PostgreSQL's smart shutdown can complete.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("gateway.serving")

READ_TIMEOUT_CODE = "REQUEST_READ_TIMEOUT"

MAX_URL_BYTES = 65_535
"""The longest request target (path and query string) served: httptools' URL parser
refuses longer ones (its offsets are 16-bit)."""

MAX_HEADER_BYTES = 65_536
"""The most bytes of header names and values one request may send (cookies and
tokens included; common proxies allow 8-32 KiB)."""

HEAD_GUARD_BYTES = 4 * (MAX_URL_BYTES + MAX_HEADER_BYTES)
"""Raw bytes received without a complete head after which the connection is refused
even before httptools hands over a header (it buffers a header until it is complete)."""


@functools.cache
def _read_timeouts() -> tuple[float, float]:
    """(headers, body) in seconds, from the environment once per process: uvicorn
    builds the protocol itself, in every worker, with no way to hand it settings."""
    from gateway.settings import Settings

    settings = Settings()
    return settings.header_timeout_ms / 1000, settings.body_timeout_ms / 1000


def _coded_answer(status: str, message: str, extensions: dict[str, Any]) -> bytes:
    """A complete HTTP answer in the gateway's error shape, closing the connection."""
    body = json.dumps({"errors": [{"message": message, "extensions": extensions}]}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nx-content-type-options: nosniff\r\n"
        "cache-control: no-store\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


def _timeout_answer(phase: str, seconds: float) -> bytes:
    return _coded_answer(
        "408 Request Timeout",
        f"The request's {phase} did not arrive within {seconds:g} s.",
        {"code": READ_TIMEOUT_CODE},
    )


URL_TOO_LONG = _coded_answer(
    "413 Content Too Large",
    f"The request's URL is longer than {MAX_URL_BYTES} bytes.",
    {"code": "REQUEST_TOO_LARGE", "maxBytes": MAX_URL_BYTES},
)
HEADERS_TOO_LARGE = _coded_answer(
    "431 Request Header Fields Too Large",
    f"The request's headers are larger than {MAX_HEADER_BYTES} bytes.",
    {"code": "REQUEST_HEADERS_TOO_LARGE", "maxBytes": MAX_HEADER_BYTES},
)
UNPARSABLE = _coded_answer(
    "400 Bad Request", "The HTTP request could not be parsed.", {"code": "BAD_REQUEST"}
)


class _HeadRefused(Exception):
    """Raised from a parser callback to stop httptools; uvicorn then calls
    ``send_400_response``, which answers with the refusal kept on the protocol."""


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a headers timer and a body timer (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._headers_s, self._body_s = _read_timeouts()
        self._in_head = True  # between a request's start and its complete headers
        self._head_raw = 0  # bytes received while in a head (counted per chunk)
        self._header_bytes = 0
        self._refusal: bytes | None = None

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._read_timed_out, phase, seconds)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self, phase: str, seconds: float) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        answered = cycle is not None and phase == "body" and cycle.response_started
        log.info("%s: no complete request %s within %g s; closing", self.client, phase, seconds)
        if not answered:
            self.transport.write(_timeout_answer(phase, seconds))
        self.transport.close()

    def _refuse(self, answer: bytes) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()

    # --- uvicorn's callbacks ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused or timed out: nothing more is parsed
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            # Still no complete head after this chunk, so all of it was head (give or
            # take the end of a previous request on a kept-alive connection).
            self._head_raw += len(data)
            if self._head_raw > HEAD_GUARD_BYTES:
                log.info("%s: request head over %d bytes; refused", self.client, HEAD_GUARD_BYTES)
                self._refuse(HEADERS_TOO_LARGE)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request httptools could not parse (or that a callback
        here refused), in the gateway's coded JSON instead of plain text."""
        answer, self._refusal = self._refusal or UNPARSABLE, None
        self._refuse(answer)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            self._refusal = URL_TOO_LONG
            raise _HeadRefused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refusal = HEADERS_TOO_LARGE
            raise _HeadRefused
        super().on_header(name, value)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection that opens and sends nothing is a request whose headers are late.
        self._arm(self._headers_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._header_bytes = 0
        if self._read_timer is None:  # a later request on a kept-alive connection
            self._arm(self._headers_s, "headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        self._head_raw = 0
        super().on_headers_complete()
        self._arm(self._body_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def timeout_keep_alive_handler(self) -> None:
        self._disarm()
        super().timeout_keep_alive_handler()


class Drain:
    """SIGTERM handling of a serving process (see the module's docstring).

    Installed by the app's lifespan, which runs inside uvicorn's own signal
    capture in every worker: the handler it replaces is uvicorn's, and is
    called once the drain period is over (or at once on a second SIGTERM).
    """

    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.draining = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> bool:
        """Take over SIGTERM (main thread only); False when it cannot."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._loop = asyncio.get_running_loop()
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        return True

    def uninstall(self) -> None:
        if self._loop is None:
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous)
        self._loop = None

    def _on_sigterm(self, sig: int, frame: FrameType | None) -> None:
        if self.draining or self._loop is None or self.drain_s <= 0:
            self.draining = True
            self._stop(sig)
            return
        self.draining = True
        log.warning("SIGTERM: /readyz says 503; stopping in %g s", self.drain_s)
        # Called between two bytecodes of the loop's own thread: schedule, do not run.
        self._loop.call_soon_threadsafe(self._loop.call_later, self.drain_s, self._stop, sig)

    def _stop(self, sig: int) -> None:
        previous = self._previous
        if callable(previous):
            previous(sig, None)  # uvicorn's handler: its graceful shutdown
            return
        signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        signal.raise_signal(sig)
