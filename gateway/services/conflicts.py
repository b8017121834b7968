"""The conflict frontier of recallMemory (SPEC section 3, step 7).

Conflicts are returned only when the answer reaches them: a relationship
conflict case when one of its positions holds a relationship the answer
returns (the returned evidence's supporting relationships, then those of the
related-relationship and community frontiers, passed as
``more_relationship_ids``), an evidence
conflict when one of its positions cites a returned evidence. Everything is
read at the view's system time, so a case appears as it stood then.

Order: by reach (the rank of the earliest returned evidence that reaches the
conflict; relationships of later frontiers reach after every evidence result,
in the order given), then relationship cases before evidence conflicts, then
ID. At most :data:`MAX_CONFLICTS` are returned. Loading them is required, not
optional: a case's resolution decides which support paths count, so an
answer that silently lost its conflicts would overstate agreement. A store
failure is therefore ``DATABASE_UNAVAILABLE``, never an empty list.

A case's resolution never turns anything into evidence: positions carry
relationship IDs and supporter summaries, evidence conflicts carry quotes,
and none of them is added to the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, overload

from gateway.errors import DatabaseUnavailable
from gateway.services.recall_types import (
    ConflictView,
    EvidenceConflictView,
    PositionView,
    Reach,
    ReadView,
    RelationshipConflictView,
)
from gateway.stages import stage
from gateway.store import conflicts as store
from gateway.store.database import STORE_FAILURES, Unit

__all__ = [
    "MAX_CONFLICTS",
    "MAX_SUPPORTERS",
    "conflict_query",
    "nearest",
    "reachable_conflicts",
]

MAX_CONFLICTS: Final = 10
"""Conflicts per answer, both kinds together."""

MAX_SUPPORTERS: Final = 5
"""Supporters listed per position; ``supporter_count`` always gives the total."""


_STATE = {"open": "open", "resolve": "resolved", "reopen": "reopened"}


def _disposition(case: store.CaseRow, position_id: str) -> str:
    if case.preferred_position_id is None:
        return "contested"
    return "preferred" if position_id == case.preferred_position_id else "dispreferred"


def _case_view(case: store.CaseRow) -> RelationshipConflictView:
    return RelationshipConflictView(
        id=case.id,
        question=case.question,
        state=_STATE[case.event],
        preferred_position_id=case.preferred_position_id,
        state_changed_at=case.state_at,
        positions=tuple(
            PositionView(
                id=p.id,
                label=p.label,
                disposition=_disposition(case, p.id),
                relationship_ids=p.relationship_ids,
                supporter_count=p.supporter_count,
                supporters=p.supporters,
                supporters_truncated=p.supporter_count > len(p.supporters),
            )
            for p in case.positions
        ),
        reach=case.reach,
    )


def _order(c: ConflictView) -> tuple[int, int, str]:
    return (c.reach, 0 if isinstance(c, RelationshipConflictView) else 1, c.id)


@overload
def conflict_query(
    view: ReadView, reach: Reach, *, always: Literal[True]
) -> store.ConflictQuery: ...


@overload
def conflict_query(
    view: ReadView, reach: Reach, *, always: bool = False
) -> store.ConflictQuery | None: ...


def conflict_query(
    view: ReadView, reach: Reach, *, always: bool = False
) -> store.ConflictQuery | None:
    """What the answer reaches, as the statements' query; None: it reaches nothing
    (``always``: a query even then, for a statement that adds the related
    frontiers' handles to the reach: gateway/store/round_trips.py)."""
    if not always and not reach.evidence and not reach.relationships:
        return None
    return store.ConflictQuery(
        team=view.team_id,
        space_ids=view.space_ids,
        evidence_reach=reach.evidence,
        relationship_reach=reach.relationships,
        t_sys=view.t_sys,
        cap=MAX_CONFLICTS,
        supporter_cap=MAX_SUPPORTERS,
    )


@stage("conflicts")
async def reachable_conflicts(unit: Unit, view: ReadView, reach: Reach) -> list[ConflictView]:
    """The conflicts the answer reaches, at the view's time, nearest first, capped."""
    query = conflict_query(view, reach)
    if query is None:
        return []
    try:
        async with unit.step() as conn:
            cases = await store.relationship_cases(
                conn,
                query.team,
                query.space_ids,
                query.relationship_reach,
                query.t_sys,
                cap=query.cap,
                supporter_cap=query.supporter_cap,
            )
            evidence = await store.evidence_conflicts(
                conn, query.team, query.space_ids, query.evidence_reach, query.t_sys, cap=query.cap
            )
    except STORE_FAILURES as exc:
        raise DatabaseUnavailable("the conflicts of the answer could not be loaded") from exc
    return nearest(cases, evidence)


def nearest(
    cases: Sequence[store.CaseRow], evidence: Sequence[store.EvidenceConflictRow]
) -> list[ConflictView]:
    """Both kinds in one order (reach, relationship cases first, ID), capped."""
    found: list[ConflictView] = [_case_view(c) for c in cases]
    found += [EvidenceConflictView(e.id, e.question, e.positions, e.reach) for e in evidence]
    return sorted(found, key=_order)[:MAX_CONFLICTS]
