"""The GraphiQL page and its files, served by the gateway under a versioned path.

The page loads only ``/graphiql/<version>/...`` from the gateway itself, and its
Content-Security-Policy forbids every other host (scripts only from the
gateway, requests only to it), so the IDE works offline and no third party
runs code in the page of a memory store. The example operations come from
``examples/`` (a ``.graphql`` document and its ``.json`` variables each).

The files are read and checked once per process, on first use. Without them
(a source checkout where ``npm`` never ran) the page answers 503 and says how
to install them; the rest of the gateway is unaffected.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from gateway.graphiql.assets import HERE, VENDOR_DIR, AssetError, load, read_manifest

log = logging.getLogger("gateway.graphiql")

STATIC_DIR = HERE / "static"
EXAMPLES_DIR = HERE / "examples"

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        # GraphiQL's editors set style attributes; scripts stay strictly same-origin.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
_IMMUTABLE = "public, max-age=31536000, immutable"
_OWN_FILES = {"recall-graphiql.js": "text/javascript", "recall-graphiql.css": "text/css"}

_MISSING = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>GraphiQL is not installed</title></head>
<body><h1>GraphiQL's files are not installed</h1>
<p>{reason}</p>
<p>The gateway serves GraphiQL from its own copy of the npm packages pinned in
<code>graphiql/package-lock.json</code>. From a source checkout run
<code>bash scripts/setup</code> (it needs <code>npm</code>), or see
<em>GraphiQL</em> in the README. The GraphQL endpoint works without them.</p>
</body></html>
"""


@dataclass(frozen=True, slots=True)
class Example:
    """One example operation, opened as a tab of its own."""

    name: str
    query: str
    variables: str


def examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    out = []
    for document in sorted(directory.glob("*.graphql")):
        variables = document.with_suffix(".json")
        out.append(
            Example(
                document.stem,
                document.read_text(encoding="utf-8"),
                variables.read_text(encoding="utf-8") if variables.is_file() else "",
            )
        )
    return out


class GraphiQLPage:
    """Renders the page and serves its files; one per process."""

    def __init__(self, vendor_dir: Path = VENDOR_DIR) -> None:
        self.manifest = read_manifest()
        self.prefix = f"/graphiql/{self.manifest.graphiql_version}/"
        self.vendor_dir = vendor_dir
        self._files: dict[str, tuple[bytes, str]] | None = None
        self._error: str | None = None
        self._examples = examples()

    def _load(self) -> dict[str, tuple[bytes, str]] | None:
        if self._files is None and self._error is None:
            try:
                vendored = load(self.vendor_dir, self.manifest)
            except AssetError as exc:
                self._error = str(exc)
                log.warning("GraphiQL is unavailable: %s", exc)
                return None
            media = {a.name: a.media_type for a in self.manifest.files if a.media_type}
            files = {name: (data, media[name]) for name, data in vendored.items()}
            for name, media_type in _OWN_FILES.items():
                files[name] = ((STATIC_DIR / name).read_bytes(), media_type)
            self._files = files
        return self._files

    def _url(self, name: str, files: dict[str, tuple[bytes, str]]) -> str:
        url = self.prefix + name
        if name in _OWN_FILES:  # changes with the gateway, not with GraphiQL's version
            url += "?v=" + hashlib.sha256(files[name][0]).hexdigest()[:12]
        return url

    def render(self, endpoint: str) -> Response:
        """The IDE for ``endpoint`` (the path it was asked for, so a mounted gateway works)."""
        files = self._load()
        if files is None:
            reason = html.escape(self._error or "unknown reason")
            return HTMLResponse(_MISSING.format(reason=reason), status_code=503)
        config = {
            "endpoint": endpoint,
            "examples": [
                {"name": e.name, "query": e.query, "variables": e.variables} for e in self._examples
            ],
        }
        # Inside <script>, "</" would end the block: JSON allows escaping "<".
        data = json.dumps(config).replace("<", "\\u003c")
        scripts = "\n".join(
            f'<script src="{self._url(name, files)}"></script>'
            for name in (
                "react.production.min.js",
                "react-dom.production.min.js",
                "graphiql.min.js",
            )
        )
        page = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Recall Gateway - GraphiQL</title>
<link rel="stylesheet" href="{self._url("graphiql.min.css", files)}">
<link rel="stylesheet" href="{self._url("recall-graphiql.css", files)}">
</head>
<body>
<div id="graphiql">Loading GraphiQL...</div>
{scripts}
<script id="recall-graphiql-config" type="application/json">{data}</script>
<script src="{self._url("recall-graphiql.js", files)}"></script>
</body>
</html>
"""
        return HTMLResponse(
            page,
            headers={
                "content-security-policy": CSP,
                "x-content-type-options": "nosniff",
                "referrer-policy": "no-referrer",
                "cache-control": "no-store",
            },
        )

    async def asset(self, request: Request) -> Response:
        files = self._load()
        name = request.path_params["name"]
        if files is None or name not in files:
            # the app's 404 handler answers: coded JSON, like any unserved path
            raise HTTPException(404)
        data, media_type = files[name]
        return Response(
            data,
            media_type=media_type,
            headers={"cache-control": _IMMUTABLE, "x-content-type-options": "nosniff"},
        )

    def routes(self) -> list[Route]:
        """Only names of the manifest and the page's own files are served (no paths)."""
        return [Route(self.prefix + "{name}", self.asset, methods=["GET", "HEAD"])]
