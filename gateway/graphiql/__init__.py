"""GraphiQL served by the gateway itself, offline (docs/graphiql.md).

``assets`` records and verifies the IDE's third-party files (npm packages
pinned at set-up time); ``page`` renders the page with the example operations
and serves the files under ``/graphiql/<version>/``.
"""

from gateway.graphiql.assets import AssetError, vendor
from gateway.graphiql.page import GraphiQLPage

__all__ = ["AssetError", "GraphiQLPage", "vendor"]
