"""Small, readable memory scenarios written as loader records (JSON Lines)."""

from __future__ import annotations

import json
from typing import Any


def jsonl(records: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(r) for r in records) + "\n"


def team_records(
    team: str, *, principals: tuple[str, ...] = ("alice", "bob")
) -> list[dict[str, Any]]:
    """A team with principals (each with a private space), shared and private memory."""
    out: list[dict[str, Any]] = [{"kind": "team", "id": team, "name": f"Team {team}"}]
    for p in principals:
        out.append({"kind": "principal", "team": team, "id": p, "display_name": p.title()})
    out += [
        {
            "kind": "source",
            "team": team,
            "id": "src-handbook",
            "type": "document",
            "title": "Handbook",
            "authority": "high",
        },
        {
            "kind": "entity",
            "team": team,
            "id": "billing",
            "name": "Billing service",
            "type": "system",
        },
        {
            "kind": "entity",
            "team": team,
            "id": "payments-team",
            "name": "Payments team",
            "type": "organization",
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-owner",
            "source": "src-handbook",
            "content": f"The billing service of {team} is owned by the payments team.",
            "occurrences": [{"id": "occ-owner", "start": 4, "end": 19}],
            "mentions": [
                {"entity": "billing", "occurrence": "occ-owner"},
                {"entity": "payments-team"},
            ],
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-owner",
            "subject": "billing",
            "predicate": "owned_by",
            "object": "payments-team",
            "owner": principals[0],
            "supports": [{"id": "sup-owner", "evidence": "ev-owner", "occurrence": "occ-owner"}],
        },
        {
            "kind": "source",
            "team": team,
            "id": "src-notes",
            "space": f"private:{principals[0]}",
            "type": "conversation",
            "title": "Private notes",
            "authority": "low",
        },
        {
            "kind": "entity",
            "team": team,
            "id": "p-billing",
            "space": f"private:{principals[0]}",
            "name": "Billing service",
            "type": "system",
        },
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-private",
            "source": "src-notes",
            "content": f"Private note of {principals[0]}: billing latency spikes at noon.",
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-private",
            "space": f"private:{principals[0]}",
            "subject": "p-billing",
            "predicate": "spikes_at",
            "object_value": "noon",
            "supports": [{"id": "sup-private", "evidence": "ev-private"}],
        },
    ]
    return out
