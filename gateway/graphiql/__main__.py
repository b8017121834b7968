"""``python -m gateway.graphiql NODE_MODULES``: verify and install the IDE's files."""

from gateway.graphiql.assets import main

raise SystemExit(main())
