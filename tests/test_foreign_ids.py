"""Every ID argument of every mutation, given an ID the caller may not read.

The rule (SPEC sections 4-6, docs/errors.md): an ID of another team, of another
principal's private space, or of the caller's own private space under a
``shared_only`` token looks exactly like an ID that exists nowhere. Here each
ID argument of each mutation (``remember``'s nested references included) is
sent twice by the same caller: once with such an ID, once with a made-up one,
in otherwise identical input (the same change ``id``). The two whole responses
must be equal once the ID itself is swapped (message, ``extensions``, ``path``,
``locations``, ``data``), nothing of the unreadable memory may appear in
either, and nothing may be written: the refused call leaves no idempotency
claim (the second call, with the same change ``id``, would otherwise be an
``IDEMPOTENCY_CONFLICT``), ``write_log`` keeps its count and the target keeps
its state. The targets are chosen so that a check made before the visibility
check would answer differently (restoring an active source, reinstating a
granted support, resolving a resolved case, reopening a resolved case).

Then the idempotency keys: another team's reuse of a team's keys (change IDs,
record IDs, feedback IDs) is a fresh write of its own, answered exactly like
a key nobody used; and replays of writes the token may read stay replays
(``created: false``), also after the space was reset.

The world is written by the operator (the loader's records). Team A has
principals alice and bob, the shared memory of ``tests.factories.team_records``
and more private memory of alice's (a second evidence with an occurrence, a
second relationship, a resolved private conflict case); team B (principal
carol) has memory of its own under IDs team A does not use.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.services.writes import WriteService
from gateway.store.database import Database

from .conftest import load_jsonl, unique
from .factories import jsonl, team_records
from .test_recall import token

RECEIPT = "kind id created recordedAt"

# What each mutation returns (its input type and selection).
MUTATIONS: dict[str, tuple[str, str]] = {
    "remember": ("RememberInput", f"receipts {{ {RECEIPT} }}"),
    "withdrawSource": ("SourceLifecycleInput", RECEIPT),
    "restoreSource": ("SourceLifecycleInput", RECEIPT),
    "withdrawEvidence": ("EvidenceLifecycleInput", RECEIPT),
    "quarantineEvidence": ("EvidenceLifecycleInput", RECEIPT),
    "restoreEvidence": ("EvidenceLifecycleInput", RECEIPT),
    "grantSupport": ("GrantSupportInput", RECEIPT),
    "revokeSupport": ("SupportDecisionInput", RECEIPT),
    "reinstateSupport": ("SupportDecisionInput", RECEIPT),
    "transitionRelationship": ("RelationshipTransitionInput", RECEIPT),
    "openConflictCase": ("OpenConflictCaseInput", RECEIPT),
    "resolveConflictCase": ("ResolveConflictCaseInput", RECEIPT),
    "reopenConflictCase": ("ReopenConflictCaseInput", RECEIPT),
    "openEvidenceConflict": ("OpenEvidenceConflictInput", RECEIPT),
    "resetSpace": ("ResetSpaceInput", RECEIPT),
    "proposeHypothesis": ("ProposeHypothesisInput", RECEIPT),
    "resolveDreamFeedback": (
        "ResolveDreamFeedbackInput",
        f"hypothesisId status receipt {{ {RECEIPT} }}",
    ),
    "submitRecallSessionFeedback": (
        "RecallSessionFeedbackInput",
        "feedbackId recallEventId created recordedAt",
    ),
}

RECALL = """
query R($q: String) { recallMemory(query: $q) { recallEventId results { evidenceId } } }
"""


async def mutate(
    client: httpx.AsyncClient, tok: str, name: str, data: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    input_type, selection = MUTATIONS[name]
    query = f"mutation M($input: {input_type}!) {{ {name}(input: $input) {{ {selection} }} }}"
    r = await client.post(
        "/graphql",
        json={"query": query, "variables": {"input": data}},
        headers={"Authorization": f"Bearer {tok}"},
    )
    body: dict[str, Any] = r.json()
    return r.status_code, body


# --- the world ---------------------------------------------------------------------------


def alice_private_extra(team: str) -> list[dict[str, Any]]:
    """More of alice's private memory than team_records gives: an evidence with an
    occurrence, a second relationship, a resolved private conflict case."""
    private = "private:alice"
    return [
        {
            "kind": "evidence",
            "team": team,
            "id": "ev-private2",
            "source": "src-notes",
            "content": "Secret plan of alice: move billing to the night shift.",
            "occurrences": [
                {"id": "occ-private", "start": 0, "end": 11},
                {"id": "occ-private2", "start": 12, "end": 20},
            ],
            "mentions": [{"entity": "p-billing", "occurrence": "occ-private"}],
        },
        {
            "kind": "relationship",
            "team": team,
            "id": "rel-private2",
            "space": private,
            "subject": "p-billing",
            "predicate": "moves_to",
            "object_value": "night shift",
            "supports": [{"id": "sup-private2", "evidence": "ev-private2"}],
        },
        {
            "kind": "conflict_case",
            "team": team,
            "id": "case-private",
            "space": private,
            "question": "Secret question of alice?",
            "positions": [
                {"id": "pos-private-a", "label": "noon", "relationships": ["rel-private"]},
                {"id": "pos-private-b", "label": "night", "relationships": ["rel-private2"]},
            ],
        },
        {
            "kind": "conflict_resolution",
            "team": team,
            "id": "res-private",
            "case": "case-private",
            "preferred_position": "pos-private-a",
        },
    ]


def shared_extra(team: str, p: str = "") -> list[dict[str, Any]]:
    """Shared memory under IDs prefixed ``p``: a source, two entities, an evidence
    with an occurrence, two relationships, a resolved conflict case between them and
    a hypothesis. Team A's has no prefix (IDs ``a-...``), team B's ``b-``."""
    return [
        {
            "kind": "source",
            "team": team,
            "id": f"{p}src",
            "type": "document",
            "title": f"Wiki of {team}",
        },
        {"kind": "entity", "team": team, "id": f"{p}ent", "name": f"Dock of {team}"},
        {"kind": "entity", "team": team, "id": f"{p}ent2", "name": f"Crane of {team}"},
        {
            "kind": "evidence",
            "team": team,
            "id": f"{p}ev",
            "source": f"{p}src",
            "content": f"The dock of {team} is served by the crane.",
            "occurrences": [{"id": f"{p}occ", "start": 4, "end": 8}],
            "mentions": [{"entity": f"{p}ent", "occurrence": f"{p}occ"}],
        },
        {
            "kind": "relationship",
            "team": team,
            "id": f"{p}rel",
            "subject": f"{p}ent",
            "predicate": "served_by",
            "object": f"{p}ent2",
            "owner": "carol" if p == "b-" else "alice",
            "supports": [{"id": f"{p}sup", "evidence": f"{p}ev", "occurrence": f"{p}occ"}],
        },
        {
            "kind": "relationship",
            "team": team,
            "id": f"{p}rel2",
            "subject": f"{p}ent",
            "predicate": "served_by",
            "object_value": "a forklift",
            "owner": "carol" if p == "b-" else "alice",
            "supports": [{"id": f"{p}sup2", "evidence": f"{p}ev"}],
        },
        {
            "kind": "conflict_case",
            "team": team,
            "id": f"{p}case",
            "question": f"What serves the dock of {team}?",
            "positions": [
                {"id": f"{p}pos-a", "label": "crane", "relationships": [f"{p}rel"]},
                {"id": f"{p}pos-b", "label": "forklift", "relationships": [f"{p}rel2"]},
            ],
        },
        {
            "kind": "conflict_resolution",
            "team": team,
            "id": f"{p}res",
            "case": f"{p}case",
            "preferred_position": f"{p}pos-a",
        },
        {
            "kind": "conflict_case",
            "team": team,
            "id": f"{p}case-open",
            "question": f"Is the dock of {team} open?",
            "positions": [
                {"id": f"{p}pos-oa", "label": "yes", "relationships": [f"{p}rel"]},
                {"id": f"{p}pos-ob", "label": "no", "relationships": [f"{p}rel2"]},
            ],
        },
        {
            "kind": "hypothesis",
            "team": team,
            "id": f"{p}hyp",
            "statement": f"The dock of {team} needs a second crane?",
            "relationships": [f"{p}rel"],
            "evidence": [f"{p}ev"],
        },
    ]


@dataclass
class World:
    team_a: str
    team_b: str
    alice: str  # private-bound
    alice_shared: str  # alice's shared_only token
    bob: str  # private-bound
    carol: str  # team B, private-bound


async def world(writes: WriteService) -> World:
    a, b = unique("fida"), unique("fidb")
    records = team_records(a) + alice_private_extra(a) + shared_extra(a, "a-")
    records += [
        {"kind": "team", "id": b, "name": f"Team {b}"},
        {"kind": "principal", "team": b, "id": "carol", "display_name": "Carol"},
        *shared_extra(b, "b-"),
    ]
    await load_jsonl(writes, jsonl(records))
    return World(
        a,
        b,
        await token(writes, a, "alice"),
        await token(writes, a, "alice", "shared_only"),
        await token(writes, a, "bob"),
        await token(writes, b, "carol"),
    )


# --- the cases ---------------------------------------------------------------------------

# A case: (name, mutation, input as a function of the ID under test).
Input = Callable[[str], dict[str, Any]]
Case = tuple[str, str, Input]


def remember_with(**changes: Any) -> dict[str, Any]:
    """A remember input of a new source (or ``sourceId``), entity, evidence and
    relationship in the shared space, with ``changes`` applied."""
    data: dict[str, Any] = {
        "space": "SHARED",
        "source": {"id": "n-src", "type": "DOCUMENT", "title": "New notes"},
        "entities": [{"id": "n-ent", "name": "Gate"}],
        "evidence": [
            {
                "id": "n-ev",
                "content": "The gate opens at six.",
                "occurrences": [{"id": "n-occ", "start": 4, "end": 8}],
            }
        ],
        "relationships": [
            {
                "id": "n-rel",
                "subject": "n-ent",
                "predicate": "opens_at",
                "objectValue": "six",
                "supports": [{"id": "n-sup", "evidence": "n-ev"}],
            }
        ],
    }
    data.update(changes)
    return data


def cases(own: Callable[[str], str]) -> list[Case]:
    """Every ID argument of every mutation; ``own(x)`` names the caller's own
    readable object of kind ``x`` (for the other arguments of the input), so that
    only the argument under test is unreadable."""
    rel, ev, occ, pos = own("rel"), own("ev"), own("occ"), own("pos-a")
    open_case = own("case-open")
    return [
        ("withdrawSource.source", "withdrawSource", lambda x: {"id": "c1", "source": x}),
        # active: a state check before the visibility check would say "already active"
        ("restoreSource.source", "restoreSource", lambda x: {"id": "c2", "source": x}),
        ("withdrawEvidence.evidence", "withdrawEvidence", lambda x: {"id": "c3", "evidence": x}),
        (
            "quarantineEvidence.evidence",
            "quarantineEvidence",
            lambda x: {"id": "c4", "evidence": x},
        ),
        ("restoreEvidence.evidence", "restoreEvidence", lambda x: {"id": "c5", "evidence": x}),
        (
            "grantSupport.relationship",
            "grantSupport",
            lambda x: {"id": "c6", "relationship": x, "evidence": ev},
        ),
        (
            "grantSupport.evidence",
            "grantSupport",
            lambda x: {"id": "c7", "relationship": rel, "evidence": x},
        ),
        (
            "grantSupport.occurrence",
            "grantSupport",
            lambda x: {"id": "c8", "relationship": rel, "evidence": ev, "occurrence": x},
        ),
        ("revokeSupport.support", "revokeSupport", lambda x: {"id": "c9", "support": x}),
        # granted: a decision check first would say "cannot reinstate a granted support"
        ("reinstateSupport.support", "reinstateSupport", lambda x: {"id": "c10", "support": x}),
        (
            "transitionRelationship.relationship",
            "transitionRelationship",
            lambda x: {"id": "c11", "relationship": x, "status": "RETRACTED"},
        ),
        (
            "transitionRelationship.supersededBy",
            "transitionRelationship",
            lambda x: {"id": "c12", "relationship": rel, "status": "SUPERSEDED", "supersededBy": x},
        ),
        (
            "openConflictCase.positions.relationships",
            "openConflictCase",
            lambda x: {
                "id": "c13",
                "question": "which?",
                "positions": [
                    {"id": "c13-a", "label": "a", "relationships": [rel]},
                    {"id": "c13-b", "label": "b", "relationships": [x]},
                ],
            },
        ),
        # resolved: "already resolved" first would tell the case exists
        (
            "resolveConflictCase.case",
            "resolveConflictCase",
            lambda x: {"id": "c14", "case": x, "preferredPosition": pos},
        ),
        (
            "resolveConflictCase.preferredPosition",
            "resolveConflictCase",
            lambda x: {"id": "c15", "case": open_case, "preferredPosition": x},
        ),
        # resolved: "only a resolved case can be reopened" is not what tells it apart
        ("reopenConflictCase.case", "reopenConflictCase", lambda x: {"id": "c15r", "case": x}),
        (
            "openEvidenceConflict.positions.evidence",
            "openEvidenceConflict",
            lambda x: {
                "id": "c16",
                "question": "which?",
                "positions": [
                    {"id": "c16-a", "label": "a", "evidence": ev, "occurrence": occ},
                    {"id": "c16-b", "label": "b", "evidence": x, "occurrence": occ},
                ],
            },
        ),
        (
            "openEvidenceConflict.positions.occurrence",
            "openEvidenceConflict",
            lambda x: {
                "id": "c17",
                "question": "which?",
                "positions": [
                    {"id": "c17-a", "label": "a", "evidence": ev, "occurrence": occ},
                    {"id": "c17-b", "label": "b", "evidence": ev, "occurrence": x},
                ],
            },
        ),
        (
            "proposeHypothesis.relationships",
            "proposeHypothesis",
            lambda x: {"id": "c18", "statement": "maybe?", "relationships": [rel, x]},
        ),
        (
            "proposeHypothesis.evidence",
            "proposeHypothesis",
            lambda x: {"id": "c19", "statement": "maybe?", "evidence": [ev, x]},
        ),
        (
            "resolveDreamFeedback.hypothesisId",
            "resolveDreamFeedback",
            lambda x: {"feedbackId": "c20", "hypothesisId": x, "decision": "REJECT"},
        ),
        (
            "remember.sourceId",
            "remember",
            lambda x: remember_with(source=None, sourceId=x),
        ),
        (
            "remember.relationships.subject",
            "remember",
            lambda x: remember_with(
                relationships=[{"id": "n-rel", "subject": x, "predicate": "p", "objectValue": "v"}]
            ),
        ),
        (
            "remember.relationships.object",
            "remember",
            lambda x: remember_with(
                relationships=[{"id": "n-rel", "subject": "n-ent", "predicate": "p", "object": x}]
            ),
        ),
        (
            "remember.evidence.mentions.entity",
            "remember",
            lambda x: remember_with(
                evidence=[{"id": "n-ev", "content": "The gate.", "mentions": [{"entity": x}]}]
            ),
        ),
        (
            "remember.relationships.supports.evidence",
            "remember",
            lambda x: remember_with(
                relationships=[
                    {
                        "id": "n-rel",
                        "subject": "n-ent",
                        "predicate": "p",
                        "objectValue": "v",
                        "supports": [{"id": "n-sup", "evidence": x}],
                    }
                ]
            ),
        ),
        (
            "remember.relationships.supports.occurrence",
            "remember",
            lambda x: remember_with(
                relationships=[
                    {
                        "id": "n-rel",
                        "subject": "n-ent",
                        "predicate": "p",
                        "objectValue": "v",
                        "supports": [{"id": "n-sup", "evidence": "n-ev", "occurrence": x}],
                    }
                ]
            ),
        ),
    ]


# The unreadable ID each case sends, per kind of target: alice's private memory
# (for bob and for alice's shared_only token) and team A's shared memory (for carol).
PRIVATE_TARGETS = {
    "withdrawSource.source": "src-notes",
    "restoreSource.source": "src-notes",
    "withdrawEvidence.evidence": "ev-private",
    "quarantineEvidence.evidence": "ev-private",
    "restoreEvidence.evidence": "ev-private",
    "grantSupport.relationship": "rel-private",
    "grantSupport.evidence": "ev-private",
    "grantSupport.occurrence": "occ-private",
    "revokeSupport.support": "sup-private",
    "reinstateSupport.support": "sup-private",
    "transitionRelationship.relationship": "rel-private",
    "transitionRelationship.supersededBy": "rel-private",
    "openConflictCase.positions.relationships": "rel-private",
    "resolveConflictCase.case": "case-private",
    "resolveConflictCase.preferredPosition": "pos-private-a",
    "reopenConflictCase.case": "case-private",
    "openEvidenceConflict.positions.evidence": "ev-private2",
    "openEvidenceConflict.positions.occurrence": "occ-private",
    "proposeHypothesis.relationships": "rel-private",
    "proposeHypothesis.evidence": "ev-private",
    "remember.sourceId": "src-notes",
    "remember.relationships.subject": "p-billing",
    "remember.relationships.object": "p-billing",
    "remember.evidence.mentions.entity": "p-billing",
    "remember.relationships.supports.evidence": "ev-private",
    "remember.relationships.supports.occurrence": "occ-private",
}
FOREIGN_TARGETS = {
    "withdrawSource.source": "a-src",
    "restoreSource.source": "a-src",
    "withdrawEvidence.evidence": "a-ev",
    "quarantineEvidence.evidence": "a-ev",
    "restoreEvidence.evidence": "a-ev",
    "grantSupport.relationship": "a-rel",
    "grantSupport.evidence": "a-ev",
    "grantSupport.occurrence": "a-occ",
    "revokeSupport.support": "a-sup",
    "reinstateSupport.support": "a-sup",
    "transitionRelationship.relationship": "a-rel",
    "transitionRelationship.supersededBy": "a-rel",
    "openConflictCase.positions.relationships": "a-rel",
    "resolveConflictCase.case": "a-case",
    "resolveConflictCase.preferredPosition": "a-pos-a",
    "reopenConflictCase.case": "a-case",
    "openEvidenceConflict.positions.evidence": "a-ev",
    "openEvidenceConflict.positions.occurrence": "a-occ",
    "proposeHypothesis.relationships": "a-rel",
    "proposeHypothesis.evidence": "a-ev",
    "resolveDreamFeedback.hypothesisId": "a-hyp",
    "remember.sourceId": "a-src",
    "remember.relationships.subject": "a-ent",
    "remember.relationships.object": "a-ent2",
    "remember.evidence.mentions.entity": "a-ent",
    "remember.relationships.supports.evidence": "a-ev",
    "remember.relationships.supports.occurrence": "a-occ",
}

# Text of alice's private memory and of team A's, which must never come back.
ALICE_PRIVATE_TEXT = ["Private note", "latency spikes", "Secret plan", "Secret question", "night"]


def team_a_text(team_a: str) -> list[str]:
    """Team A's ID (in all its memory's text) and its team_records text."""
    return [team_a, "billing service of", "payments team", "Handbook"]


async def write_count(db: Database, *teams: str) -> int:
    async with db.pool.acquire() as conn:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM write_log WHERE team_id = ANY($1::text[])", list(teams)
        )
        return n


def swapped(body: dict[str, Any], ident: str, missing: str) -> str:
    """The response as text with the quoted ID swapped for ``missing``'s."""
    return json.dumps(body, sort_keys=True).replace(f"'{ident}'", f"'{missing}'")


async def check_cases(
    client: httpx.AsyncClient,
    db: Database,
    w: World,
    tok: str,
    targets: dict[str, str],
    own: Callable[[str], str],
    forbidden: list[str],
) -> list[str]:
    """Run every case of ``targets`` as ``tok``; the mismatches found (empty: none)."""
    problems: list[str] = []
    for name, mutation, build in cases(own):
        if name not in targets:
            continue
        target = targets[name]
        missing = "zz-missing-" + secrets.token_hex(3)
        before = await write_count(db, w.team_a, w.team_b)
        status, refused = await mutate(client, tok, mutation, build(target))
        _, absent = await mutate(client, tok, mutation, build(missing))
        after = await write_count(db, w.team_a, w.team_b)
        if not refused.get("errors") or refused.get("data") is not None:
            problems.append(f"{name}: {target!r} was accepted: {refused}")
            continue
        code = refused["errors"][0].get("extensions", {}).get("code")
        if code != "NOT_FOUND":
            problems.append(f"{name}: {target!r} answered {code}, not NOT_FOUND: {refused}")
        if swapped(refused, target, missing) != json.dumps(absent, sort_keys=True):
            problems.append(f"{name}: {target!r} answered {refused}, a missing ID {absent}")
        text = json.dumps(refused)
        problems += [f"{name}: {t!r} in {refused}" for t in forbidden if t in text]
        if status != 200 or after != before:
            problems.append(f"{name}: status {status}, write_log {before} -> {after}")
    return problems


def own_shared(x: str) -> str:
    return f"a-{x}"


def own_b(x: str) -> str:
    return f"b-{x}"


async def test_another_principals_private_ids_look_missing_in_every_mutation(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    w = await world(writes)
    problems = await check_cases(
        client, db, w, w.bob, PRIVATE_TARGETS, own_shared, ALICE_PRIVATE_TEXT
    )
    assert not problems, "\n".join(problems)
    # alice's own private memory is untouched: she may still do what bob could not
    _, done = await mutate(
        client, w.alice, "reopenConflictCase", {"id": "ok-1", "case": "case-private"}
    )
    assert "errors" not in done, done


async def test_a_shared_only_token_sees_its_owners_private_ids_as_missing(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    w = await world(writes)
    problems = await check_cases(
        client, db, w, w.alice_shared, PRIVATE_TARGETS, own_shared, ALICE_PRIVATE_TEXT
    )
    assert not problems, "\n".join(problems)
    # Naming the private space is refused the same way by every mutation that takes a space.
    before = await write_count(db, w.team_a)
    for mutation, data in (
        ("resetSpace", {"id": "s1", "space": "PRIVATE"}),
        (
            "openConflictCase",
            {
                "id": "s2",
                "space": "PRIVATE",
                "question": "q?",
                "positions": [
                    {"id": "s2-a", "label": "a", "relationships": ["rel-private"]},
                    {"id": "s2-b", "label": "b", "relationships": ["rel-private2"]},
                ],
            },
        ),
        (
            "openEvidenceConflict",
            {
                "id": "s3",
                "space": "PRIVATE",
                "question": "q?",
                "positions": [
                    {
                        "id": "s3-a",
                        "label": "a",
                        "evidence": "ev-private2",
                        "occurrence": "occ-private",
                    },
                    {
                        "id": "s3-b",
                        "label": "b",
                        "evidence": "ev-private2",
                        "occurrence": "occ-private2",
                    },
                ],
            },
        ),
        ("remember", remember_with(space="PRIVATE")),
    ):
        _, body = await mutate(client, w.alice_shared, mutation, data)
        assert body["data"] is None, body
        assert [e["extensions"] for e in body["errors"]] == [
            {"code": "NOT_FOUND", "field": "space"}
        ], body
        assert body["errors"][0]["message"] == f"no space 'private:alice' in team '{w.team_a}'"
    assert await write_count(db, w.team_a) == before


async def test_another_teams_ids_look_missing_in_every_mutation(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    w = await world(writes)
    problems = await check_cases(
        client, db, w, w.carol, FOREIGN_TARGETS, own_b, team_a_text(w.team_a)
    )
    # and team A's private IDs too, for the arguments that take them
    problems += await check_cases(
        client,
        db,
        w,
        w.carol,
        PRIVATE_TARGETS,
        own_b,
        team_a_text(w.team_a) + ALICE_PRIVATE_TEXT,
    )
    assert not problems, "\n".join(problems)


# --- idempotency keys ---------------------------------------------------------------------


async def recall_event(client: httpx.AsyncClient, tok: str, q: str) -> str:
    r = await client.post(
        "/graphql",
        json={"query": RECALL, "variables": {"q": q}},
        headers={"Authorization": f"Bearer {tok}"},
    )
    event: str = r.json()["data"]["recallMemory"]["recallEventId"]
    assert event, r.text
    return event


def receipts(body: dict[str, Any], name: str) -> list[bool]:
    """The ``created`` flags of a mutation's answer (its receipts, or its one receipt)."""
    assert "errors" not in body, body
    data = body["data"][name]
    if "receipts" in data:
        return [r["created"] for r in data["receipts"]]
    return [data["receipt"]["created"] if "receipt" in data else data["created"]]


async def test_another_teams_keys_are_a_fresh_namespace(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """Team B reusing team A's keys (a change ID, record IDs, feedback IDs) writes
    its own, exactly as with keys nobody used: no IDEMPOTENCY_CONFLICT, no replay of
    team A's receipt, nothing of team A's in the answer. And team A's exact input,
    key included, sent by team B is a missing ID like any other."""
    w = await world(writes)
    forbidden = team_a_text(w.team_a)
    # team A uses the keys
    _, body = await mutate(client, w.alice, "withdrawSource", {"id": "k-1", "source": "a-src"})
    assert receipts(body, "withdrawSource") == [True]
    note = remember_with(source={"id": "k-src", "type": "DOCUMENT", "title": "Shared note"})
    _, body = await mutate(client, w.alice, "remember", note)
    assert receipts(body, "remember") == [True] * 4
    decision = {"feedbackId": "k-df", "hypothesisId": "a-hyp", "decision": "CONFIRM"}
    _, body = await mutate(client, w.alice, "resolveDreamFeedback", decision)
    assert receipts(body, "resolveDreamFeedback") == [True]
    alice_event = await recall_event(client, w.alice, "dock crane")
    _, body = await mutate(
        client,
        w.alice,
        "submitRecallSessionFeedback",
        {"feedbackId": "k-fb", "recallEventId": alice_event, "used": True},
    )
    assert receipts(body, "submitRecallSessionFeedback") == [True]

    # team A's exact input with its key, from team B: a missing ID, nothing more
    for name, data, target in (
        ("withdrawSource", {"id": "k-1", "source": "a-src"}, "a-src"),
        ("resolveDreamFeedback", decision, "a-hyp"),
    ):
        missing = "zz-missing-" + secrets.token_hex(3)
        _, refused = await mutate(client, w.carol, name, data)
        swapped_data = json.loads(json.dumps(data).replace(f'"{target}"', f'"{missing}"'))
        _, absent = await mutate(client, w.carol, name, swapped_data)
        assert refused["errors"][0]["extensions"]["code"] == "NOT_FOUND", refused
        assert swapped(refused, target, missing) == json.dumps(absent, sort_keys=True)
    nobody = "00000000-0000-4000-8000-000000000000"
    feedback = {"feedbackId": "k-fb", "recallEventId": alice_event, "used": True}
    _, refused = await mutate(client, w.carol, "submitRecallSessionFeedback", feedback)
    _, absent = await mutate(
        client, w.carol, "submitRecallSessionFeedback", {**feedback, "recallEventId": nobody}
    )
    assert refused["errors"][0]["extensions"]["code"] == "NOT_FOUND", refused
    assert swapped(refused, alice_event, nobody) == json.dumps(absent, sort_keys=True)

    # the same keys in team B: fresh writes of its own
    answers = []
    reused: tuple[tuple[str, dict[str, Any]], ...] = (
        ("withdrawSource", {"id": "k-1", "source": "b-src"}),
        ("remember", note),  # team A's very input: record IDs and content alike
        ("resolveDreamFeedback", {**decision, "hypothesisId": "b-hyp"}),
        (
            "submitRecallSessionFeedback",
            {**feedback, "recallEventId": await recall_event(client, w.carol, "dock crane")},
        ),
    )
    for name, data in reused:
        _, body = await mutate(client, w.carol, name, data)
        assert all(receipts(body, name)), (name, body)
        answers.append(body)
    text = json.dumps(answers)
    assert not [t for t in forbidden if t in text], text
    # and their replays in team B are team B's own
    _, again = await mutate(client, w.carol, "remember", note)
    assert receipts(again, "remember") == [False] * 4
    async with db.pool.acquire() as conn:
        owners = await conn.fetch(
            "SELECT team_id, recorded_by FROM write_log WHERE client_id = 'k-src' "
            "AND team_id = ANY($1::text[])",
            [w.team_a, w.team_b],
        )
    assert sorted((r["team_id"], r["recorded_by"]) for r in owners) == sorted(
        [(w.team_a, "principal:alice"), (w.team_b, "principal:carol")]
    )


async def test_a_shared_only_token_cannot_replay_its_owners_private_writes(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """A replay (the same key, the same content, the same principal) answers the
    earlier receipt; but a shared_only token may not read its principal's private
    space, so its replay of a private write, and any guess at that write's content
    under the same key, must answer exactly what its write under a fresh key
    answers (NOT_FOUND): neither the receipt nor a conflict may tell the exact
    content of the private write (docs/feedback.md refuses the same for recall
    events of private-bound tokens, for that reason)."""
    w = await world(writes)
    event = await recall_event(client, w.alice, "Private note billing latency spikes at noon")
    feedback = {
        "feedbackId": "pw-fb",
        "recallEventId": event,
        "used": True,
        "irrelevantResults": [{"frontier": "EVIDENCE", "id": "ev-private"}],
    }

    def rekeyed(name: str, sent: dict[str, Any]) -> dict[str, Any]:
        """The same input under a key nobody used (the key of its first record)."""
        if name == "remember":
            return {**sent, "source": {**sent["source"], "id": "f-src"}}
        key = "feedbackId" if name == "submitRecallSessionFeedback" else "id"
        return {**sent, key: sent[key] + "-fresh"}

    # (mutation, alice's private write, guesses at it under its key)
    cases: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
        (
            "withdrawEvidence",
            {"id": "pw-1", "evidence": "ev-private2", "reason": "moved"},
            [
                {"id": "pw-1", "evidence": "ev-private2", "reason": "other guess"},
                {"id": "pw-1", "evidence": "ev-private", "reason": "moved"},
            ],
        ),
        (
            "remember",
            remember_with(space="PRIVATE"),
            [
                remember_with(
                    space="PRIVATE",
                    source={"id": "n-src", "type": "DOCUMENT", "title": "Other title"},
                )
            ],
        ),
        (
            "submitRecallSessionFeedback",
            feedback,
            [
                {**feedback, "irrelevantResults": [{"frontier": "EVIDENCE", "id": "ev-owner"}]},
                {**feedback, "used": False},
            ],
        ),
    ]
    problems = []
    for name, data, guesses in cases:
        _, done = await mutate(client, w.alice, name, data)
        assert all(receipts(done, name)), done
        for sent in [data, *guesses]:
            _, answer = await mutate(client, w.alice_shared, name, sent)
            _, first_write = await mutate(client, w.alice_shared, name, rekeyed(name, sent))
            code = (first_write.get("errors") or [{}])[0].get("extensions", {}).get("code")
            assert code == "NOT_FOUND", (name, first_write)
            if answer != first_write:
                problems.append(f"{name} {sent}: {answer}, under a fresh key {first_write}")
    assert not problems, "\n".join(problems)
    # Another principal's token that is not private-bound, reusing alice's keys:
    # a write naming memory it cannot read answers as under a fresh key; a
    # feedback ID is the conflict first (docs/feedback.md), whatever the content.
    bob_shared = await token(writes, w.team_a, "bob", "shared_only")
    for name, data, _ in cases[:2]:
        _, reused = await mutate(client, bob_shared, name, data)
        _, fresh = await mutate(client, bob_shared, name, rekeyed(name, data))
        assert reused == fresh and reused["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    _, reused = await mutate(client, bob_shared, "submitRecallSessionFeedback", feedback)
    assert reused["errors"][0]["extensions"] == {"code": "IDEMPOTENCY_CONFLICT"}, reused
    # A guess naming memory the token reads tells only that the key is used, as
    # the key's use by another principal does.
    _, used = await mutate(
        client, w.alice_shared, "withdrawEvidence", {"id": "pw-1", "evidence": "a-ev"}
    )
    assert used["errors"][0]["extensions"] == {"code": "IDEMPOTENCY_CONFLICT", "field": "id"}


async def test_replays_readable_to_the_token_stay_replays(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """The replay check refuses only what the token cannot read: a shared_only
    token's replays of its own shared writes, also after the space was reset (the
    row is an earlier generation's, the write the same), and a private-bound
    token's replays of its principal's shared_only writes, answer their receipts."""
    w = await world(writes)
    shared_writes = [
        ("withdrawSource", {"id": "r-1", "source": "a-src"}),
        ("revokeSupport", {"id": "r-2", "support": "a-sup2"}),
        ("remember", remember_with()),
    ]
    for name, data in shared_writes:
        _, first = await mutate(client, w.alice_shared, name, data)
        assert all(receipts(first, name)), first
    event = await recall_event(client, w.alice_shared, "dock crane")
    feedback = {"feedbackId": "r-fb", "recallEventId": event, "used": True}
    _, first = await mutate(client, w.alice_shared, "submitRecallSessionFeedback", feedback)
    assert receipts(first, "submitRecallSessionFeedback") == [True]
    shared_writes.append(("submitRecallSessionFeedback", feedback))
    for tok in (w.alice_shared, w.alice):
        for name, data in shared_writes:
            _, again = await mutate(client, tok, name, data)
            assert not any(receipts(again, name)), (name, again)
    _, reset = await mutate(client, w.alice, "resetSpace", {"id": "r-reset", "space": "SHARED"})
    assert receipts(reset, "resetSpace") == [True]
    for name, data in shared_writes:
        _, again = await mutate(client, w.alice_shared, name, data)
        assert not any(receipts(again, name)), (name, again)


# --- recallMemory's ID arguments ----------------------------------------------------------

FULL_RECALL = """
query R($q: String, $known: [ID!], $knownRels: [ID!], $entities: [ID!]) {
  recallMemory(query: $q, knownEvidenceIds: $known, knownRelationshipIds: $knownRels,
               expandFromEntityIds: $entities, limit: 50) {
    recallId recallEventId
    results {
      evidenceId rank context contextTruncated spaceKind observedAt recordedAt
      source { id kind title uri authority status createdAt }
      supportingRelationships {
        id predicate statement objectValue polarity status ownerId semanticGroup spaceKind
        subject { id name kind aliases } object { id name kind aliases }
      }
    }
    relatedRelationships { representativeId equivalentIds semanticGroup representative { id statement } }
    relatedCommunities {
      id summary topEntities topPredicates relationshipCount membersTruncated
      members { representativeId equivalentIds }
    }
    relatedHypotheses { id statement status origin sourceRelationshipIds sourceEvidenceIds }
    conflicts {
      id question
      ... on RelationshipConflict {
        state preferredPositionId
        positions {
          id label disposition relationshipIds supporterCount supportersTruncated
          supporters { evidenceId sourceId authority }
        }
      }
      ... on EvidenceConflict {
        positions { id label citation { evidenceId occurrenceId quote spanStart spanEnd } }
      }
    }
    searchStates {
      evidence { status complete lists { spaceKind list status candidates } }
      relationships { status complete lists { spaceKind list status candidates } }
      communities { status complete lists { spaceKind list status candidates } }
      hypotheses { status complete lists { spaceKind list status candidates } }
    }
    degradations { frontier code message optional }
    suggestedActions { kind description recallEventId hypothesisIds }
  }
}
"""


def without_event(body: dict[str, Any]) -> str:
    """A recall's answer without what differs between any two recalls (its IDs)."""
    answer = body["data"]["recallMemory"]
    answer["recallId"] = answer["recallEventId"] = None
    for action in answer["suggestedActions"]:
        action["recallEventId"] = None
    return json.dumps(body, sort_keys=True)


async def test_recall_id_arguments_of_unreadable_ids_answer_as_missing_ones(
    client: httpx.AsyncClient, writes: WriteService, db: Database
) -> None:
    """knownEvidenceIds, knownRelationshipIds and expandFromEntityIds given IDs
    the caller may not read give the very answer (every field, every frontier,
    search-state counts, degradations, suggested actions) that made-up IDs give:
    no count, order or degradation tells that they exist."""
    from gateway.services.communities import build_communities

    w = await world(writes)
    for team in (w.team_a, w.team_b):
        report = await build_communities(db, team, max_nodes=1000, max_edges=10_000)
        assert report.status == "succeeded", report
    question = "billing latency noon night shift dock crane forklift"
    private = {
        "known": ["ev-private", "ev-private2"],
        "knownRels": ["rel-private", "rel-private2"],
        "entities": ["p-billing"],
    }
    foreign = {
        "known": ["a-ev", "ev-owner", "ev-private"],
        "knownRels": ["a-rel", "a-rel2", "rel-owner"],
        "entities": ["a-ent", "billing", "p-billing"],
    }
    problems = []
    for who, tok, ids_by_argument, forbidden in (
        ("bob", w.bob, private, ALICE_PRIVATE_TEXT),
        ("alice shared_only", w.alice_shared, private, ALICE_PRIVATE_TEXT),
        ("carol", w.carol, foreign, team_a_text(w.team_a) + ALICE_PRIVATE_TEXT),
    ):
        for argument, unreadable in ids_by_argument.items():
            made_up = [f"zz-{argument}-{i}" for i in range(len(unreadable))]
            answers = []
            for ids in (unreadable, made_up):
                r = await client.post(
                    "/graphql",
                    json={"query": FULL_RECALL, "variables": {"q": question, argument: ids}},
                    headers={"Authorization": f"Bearer {tok}"},
                )
                body = r.json()
                assert "errors" not in body, body
                answers.append(without_event(body))
            if answers[0] != answers[1]:
                problems.append(f"{who} {argument}: {answers[0]} != {answers[1]}")
            problems += [f"{who} {argument}: {t!r}" for t in forbidden if t in answers[0]]
    assert not problems, "\n".join(problems)
    # the same arguments do act on what the caller reads (the check is not vacuous)
    r = await client.post(
        "/graphql",
        json={"query": FULL_RECALL, "variables": {"q": question}},
        headers={"Authorization": f"Bearer {w.alice}"},
    )
    mine = r.json()["data"]["recallMemory"]
    assert "ev-private" in {e["evidenceId"] for e in mine["results"]}, mine
    r = await client.post(
        "/graphql",
        json={"query": FULL_RECALL, "variables": {"q": question, **private}},
        headers={"Authorization": f"Bearer {w.alice}"},
    )
    known = r.json()["data"]["recallMemory"]
    assert "ev-private" not in {e["evidenceId"] for e in known["results"]}, known
    r = await client.post(
        "/graphql",
        json={"query": FULL_RECALL, "variables": {"entities": ["p-billing"]}},
        headers={"Authorization": f"Bearer {w.alice}"},
    )
    lists = r.json()["data"]["recallMemory"]["searchStates"]["evidence"]["lists"]
    found = {(x["spaceKind"], x["list"]): x["candidates"] for x in lists}
    assert found[("PRIVATE", "ENTITY")] == 1, lists  # ev-private2 mentions p-billing
