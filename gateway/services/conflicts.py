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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from gateway.errors import DatabaseUnavailable
from gateway.store import conflicts as store
from gateway.store.database import STORE_FAILURES, Database

if TYPE_CHECKING:
    from gateway.services.recall import EvidenceResult, ReadView

__all__ = [
    "MAX_CONFLICTS",
    "MAX_SUPPORTERS",
    "ConflictView",
    "EvidenceConflictView",
    "PositionView",
    "Reach",
    "RelationshipConflictView",
    "answer_reach",
    "reachable_conflicts",
]

MAX_CONFLICTS: Final = 10
"""Conflicts per answer, both kinds together."""

MAX_SUPPORTERS: Final = 5
"""Supporters listed per position; ``supporter_count`` always gives the total."""


_STATE = {"open": "open", "resolve": "resolved", "reopen": "reopened"}


@dataclass(frozen=True, slots=True)
class Reach:
    """How near the top of the answer each returned evidence and relationship is."""

    evidence: dict[str, int]
    relationships: dict[str, int]


def answer_reach(
    results: Sequence[EvidenceResult], more_relationship_ids: Iterable[str] = ()
) -> Reach:
    """Reach ranks of the answer's material.

    An evidence reaches at its rank; a relationship at the rank of the first
    result it supports. ``more_relationship_ids`` (relationships returned by
    other frontiers, in their order) reach after every evidence result.
    """
    evidence: dict[str, int] = {}
    relationships: dict[str, int] = {}
    for r in results:
        evidence.setdefault(r.evidence.id, r.rank)
        for rel in r.evidence.relationship_ids:
            relationships.setdefault(rel, r.rank)
    after = max((r.rank for r in results), default=0)
    for i, rel in enumerate(more_relationship_ids, start=after + 1):
        relationships.setdefault(rel, i)
    return Reach(evidence, relationships)


@dataclass(frozen=True, slots=True)
class PositionView:
    id: str
    label: str
    disposition: str  # contested | preferred | dispreferred
    relationship_ids: tuple[str, ...]
    supporter_count: int
    supporters: tuple[store.SupporterRow, ...]
    supporters_truncated: bool


@dataclass(frozen=True, slots=True)
class RelationshipConflictView:
    id: str
    question: str
    state: str  # open | resolved | reopened
    preferred_position_id: str | None
    state_changed_at: datetime
    positions: tuple[PositionView, ...]
    reach: int


@dataclass(frozen=True, slots=True)
class EvidenceConflictView:
    id: str
    question: str
    positions: tuple[store.CitationRow, ...]
    reach: int


ConflictView = RelationshipConflictView | EvidenceConflictView


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


async def reachable_conflicts(db: Database, view: ReadView, reach: Reach) -> list[ConflictView]:
    """The conflicts the answer reaches, at the view's time, nearest first, capped."""
    if not reach.evidence and not reach.relationships:
        return []
    try:
        async with db.tenant(view.team_id, view.space_ids) as conn:
            cases = await store.relationship_cases(
                conn,
                view.team_id,
                view.space_ids,
                reach.relationships,
                view.t_sys,
                cap=MAX_CONFLICTS,
                supporter_cap=MAX_SUPPORTERS,
            )
            evidence = await store.evidence_conflicts(
                conn, view.team_id, view.space_ids, reach.evidence, view.t_sys, cap=MAX_CONFLICTS
            )
    except STORE_FAILURES as exc:
        raise DatabaseUnavailable("the conflicts of the answer could not be loaded") from exc
    found: list[ConflictView] = [_case_view(c) for c in cases]
    found += [EvidenceConflictView(e.id, e.question, e.positions, e.reach) for e in evidence]
    return sorted(found, key=_order)[:MAX_CONFLICTS]
