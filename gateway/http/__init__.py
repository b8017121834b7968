"""The HTTP edge of the gateway: one concern per module, like starlette's layout.

``limits`` (hostile-query limits and the request body bound), ``cost`` (the
query cost validation rule), ``errors`` (error bodies outside GraphQL
execution), ``persisted`` (persisted queries), ``deadline`` (per-request
deadline, cancellation when the client goes away) and ``view`` (the
GraphQL-over-HTTP view that ties them together).
"""
