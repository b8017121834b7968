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


@functools.cache
def _read_timeouts() -> tuple[float, float]:
    """(headers, body) in seconds, from the environment once per process: uvicorn
    builds the protocol itself, in every worker, with no way to hand it settings."""
    from gateway.settings import Settings

    settings = Settings()
    return settings.header_timeout_ms / 1000, settings.body_timeout_ms / 1000


def _timeout_answer(phase: str, seconds: float) -> bytes:
    body = json.dumps(
        {
            "errors": [
                {
                    "message": f"The request's {phase} did not arrive within {seconds:g} s.",
                    "extensions": {"code": READ_TIMEOUT_CODE},
                }
            ]
        }
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a headers timer and a body timer (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._headers_s, self._body_s = _read_timeouts()

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

    # --- uvicorn's callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection that opens and sends nothing is a request whose headers are late.
        self._arm(self._headers_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:  # a later request on a kept-alive connection
            self._arm(self._headers_s, "headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm(self._body_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
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
