"""The Model Context Protocol server for agents (docs/mcp.md).

``operations`` holds the GraphQL documents behind the tools and shapes their
compact answers; ``server`` builds the MCP server over the gateway app and
runs it over stdio or streamable HTTP.
"""

from gateway.mcp.server import Gateway, build_server, http_app, run_stdio

__all__ = ["Gateway", "build_server", "http_app", "run_stdio"]
