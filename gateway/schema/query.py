"""The Query root."""

from __future__ import annotations

import strawberry
from strawberry.types import Info

from gateway.schema.context import RequestContext
from gateway.schema.recall import recall_memory
from gateway.schema.recall_types import RecallResult
from gateway.schema.trace import trace_memory
from gateway.schema.trace_types import MemoryTrace
from gateway.schema.types import PrincipalKind, SpaceKind, Team, TokenBinding, Viewer


@strawberry.type
class Query:
    @strawberry.field(description="Who the bearer token belongs to and what it may read.")
    def viewer(self, info: Info[RequestContext, None]) -> Viewer:
        p = info.context.require_principal()
        return Viewer(
            principal_id=strawberry.ID(p.principal_id),
            display_name=p.display_name,
            kind=PrincipalKind(p.kind),
            team=Team(id=strawberry.ID(p.team_id), name=p.team_name),
            token_binding=TokenBinding(p.binding),
            readable_spaces=[SpaceKind(k) for k in p.space_kinds],
        )

    recall_memory: RecallResult = strawberry.field(
        resolver=recall_memory,
        description="Ranked, authorised, time-correct evidence about a query, with the "
        "relationships, communities, conflicts and hypotheses around it.",
    )

    trace_memory: MemoryTrace = strawberry.field(
        resolver=trace_memory,
        description="Why one relationship is believed: its evidence, history, equivalents, "
        "conflicts and bounded lineage, as known at one time.",
    )
