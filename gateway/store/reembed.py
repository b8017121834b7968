"""SQL of ``recall-gateway reembed``: runs, pending texts, staged vectors, the switch.

The run works as the owner role (operator work, like the loader): it must see
every team's vectors. The staging tables and the run table are not granted to
the gateway's role. See db/0035_reembed.sql for the shape of the mechanism.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

import numpy as np

from gateway.errors import VectorIndexPending
from gateway.store import vector_partitions
from gateway.store.connection import Conn

# pg_advisory_lock key of a run: one re-embed at a time per database.
_RUN_LOCK = 0x7265656D  # "reem"


@dataclass(frozen=True, slots=True)
class Run:
    id: int
    from_model: str
    to_model: str
    resumed: bool
    abandoned: str | None
    """The target model of a running run this one replaced, if any."""


@dataclass(frozen=True, slots=True)
class Pending:
    """One live vector still without its new twin, and the text it was made from."""

    team_id: str
    space_id: UUID
    item_id: str
    generation: int  # the projection generation of a relationship vector; 0 for evidence
    text: str


async def unbounded(conn: Conn) -> None:
    """Lift the pool's statement timeout for this transaction: a whole-store count or
    the switch of a large store may take longer than a request's bound."""
    await conn.execute("SET LOCAL statement_timeout = 0")


async def try_lock(conn: Conn) -> bool:
    """Take the session-level run lock; False when another run holds it."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", _RUN_LOCK))


async def unlock(conn: Conn) -> None:
    await conn.execute("SELECT pg_advisory_unlock($1)", _RUN_LOCK)


async def start_run(conn: Conn, from_model: str, to_model: str) -> Run:
    """The running run for ``to_model`` (resumed), or a new one.

    A running run for another model is abandoned first: its staged vectors
    belong to a model nobody asked for any more.
    """
    row = await conn.fetchrow(
        "SELECT id, from_model, to_model FROM reembed_runs WHERE status = 'running' FOR UPDATE"
    )
    abandoned = None
    if row is not None:
        if row["to_model"] == to_model and row["from_model"] == from_model:
            return Run(row["id"], from_model, to_model, resumed=True, abandoned=None)
        await conn.execute(
            "UPDATE reembed_runs SET status = 'abandoned', finished_at = now() WHERE id = $1",
            row["id"],
        )
        await conn.execute("DELETE FROM reembed_evidence WHERE run_id = $1", row["id"])
        await conn.execute("DELETE FROM reembed_relationships WHERE run_id = $1", row["id"])
        abandoned = str(row["to_model"])
    run_id = await conn.fetchval(
        "INSERT INTO reembed_runs (from_model, to_model, status) VALUES ($1, $2, 'running') "
        "RETURNING id",
        from_model,
        to_model,
    )
    return Run(int(run_id), from_model, to_model, resumed=False, abandoned=abandoned)


async def live_vectors(conn: Conn) -> int:
    """Evidence and relationship vectors in the store, every team."""
    total = await conn.fetchval(
        "SELECT (SELECT count(*) FROM evidence_embeddings) "
        "+ (SELECT count(*) FROM relationship_embeddings)"
    )
    return int(total)


async def counts(conn: Conn, run_id: int) -> tuple[int, int]:
    """(live vectors, of which already staged) over evidence and relationships."""
    row = await conn.fetchrow(
        """
        SELECT (SELECT count(*) FROM evidence_embeddings ee
                 WHERE EXISTS (SELECT 1 FROM reembed_evidence n
                                WHERE n.run_id = $1 AND n.team_id = ee.team_id
                                  AND n.space_id = ee.space_id
                                  AND n.evidence_id = ee.evidence_id))
             + (SELECT count(*) FROM relationship_embeddings re
                 WHERE EXISTS (SELECT 1 FROM reembed_relationships n
                                WHERE n.run_id = $1 AND n.team_id = re.team_id
                                  AND n.space_id = re.space_id
                                  AND n.relationship_id = re.relationship_id
                                  AND n.projection_generation = re.projection_generation))
               AS done
        """,
        run_id,
    )
    assert row is not None
    return await live_vectors(conn), int(row["done"])


async def pending_evidence(conn: Conn, run_id: int, limit: int) -> list[Pending]:
    """Up to ``limit`` live evidence vectors not yet staged, in key order."""
    rows = await conn.fetch(
        """
        SELECT ee.team_id, ee.space_id, ee.evidence_id, e.content
        FROM evidence_embeddings ee
        JOIN evidence e ON e.team_id = ee.team_id AND e.space_id = ee.space_id
                       AND e.id = ee.evidence_id
        WHERE NOT EXISTS (SELECT 1 FROM reembed_evidence n
                           WHERE n.run_id = $1 AND n.team_id = ee.team_id
                             AND n.space_id = ee.space_id AND n.evidence_id = ee.evidence_id)
        ORDER BY ee.team_id, ee.space_id, ee.evidence_id
        LIMIT $2
        """,
        run_id,
        limit,
    )
    return [Pending(r[0], r[1], r[2], 0, r[3]) for r in rows]


async def pending_relationships(conn: Conn, run_id: int, limit: int) -> list[Pending]:
    """Up to ``limit`` live relationship vectors (any projection generation) not yet staged."""
    rows = await conn.fetch(
        """
        SELECT re.team_id, re.space_id, re.relationship_id, re.projection_generation, r.statement
        FROM relationship_embeddings re
        JOIN relationships r ON r.team_id = re.team_id AND r.space_id = re.space_id
                            AND r.id = re.relationship_id
        WHERE NOT EXISTS (SELECT 1 FROM reembed_relationships n
                           WHERE n.run_id = $1 AND n.team_id = re.team_id
                             AND n.space_id = re.space_id
                             AND n.relationship_id = re.relationship_id
                             AND n.projection_generation = re.projection_generation)
        ORDER BY re.team_id, re.space_id, re.relationship_id, re.projection_generation
        LIMIT $2
        """,
        run_id,
        limit,
    )
    return [Pending(r[0], r[1], r[2], r[3], r[4]) for r in rows]


async def stage(
    conn: Conn, run_id: int, items: Sequence[Pending], vectors: np.ndarray, *, relationships: bool
) -> None:
    """Keep the new vectors of one batch (a replayed batch changes nothing)."""
    if relationships:
        await conn.executemany(
            "INSERT INTO reembed_relationships (run_id, team_id, space_id, relationship_id, "
            "projection_generation, embedding) VALUES ($1, $2, $3, $4, $5, $6) "
            "ON CONFLICT DO NOTHING",
            [
                (run_id, p.team_id, p.space_id, p.item_id, p.generation, vectors[i])
                for i, p in enumerate(items)
            ],
        )
    else:
        await conn.executemany(
            "INSERT INTO reembed_evidence (run_id, team_id, space_id, evidence_id, embedding) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            [(run_id, p.team_id, p.space_id, p.item_id, vectors[i]) for i, p in enumerate(items)],
        )


async def switch(conn: Conn, run: Run) -> int:
    """Swap the staged vectors in, in the caller's transaction; returns the missing count.

    Writers are held off (SHARE ROW EXCLUSIVE on the vector tables; readers go
    on with the old vectors until commit). A vector written since the last
    batch has no twin yet: then nothing is changed and the count of such
    vectors is returned, for the caller to embed them and try again.
    """
    await conn.execute(
        "LOCK TABLE embedding_models, evidence_embeddings, relationship_embeddings, "
        "relationship_projections IN SHARE ROW EXCLUSIVE MODE"
    )
    # A load --index-after detaches under ACCESS EXCLUSIVE on the same tables, so
    # this sees every detach: the rename below would relabel detached vectors too.
    deferred = await vector_partitions.deferred_spaces(conn)
    if deferred:
        raise VectorIndexPending(
            f"not switching models: {vector_partitions.pending_message(deferred)}, then run "
            "reembed again (it resumes)"
        )
    missing = await conn.fetchval(
        """
        SELECT (SELECT count(*) FROM evidence_embeddings ee
                 WHERE NOT EXISTS (SELECT 1 FROM reembed_evidence n
                                    WHERE n.run_id = $1 AND n.team_id = ee.team_id
                                      AND n.space_id = ee.space_id
                                      AND n.evidence_id = ee.evidence_id))
             + (SELECT count(*) FROM relationship_embeddings re
                 WHERE NOT EXISTS (SELECT 1 FROM reembed_relationships n
                                    WHERE n.run_id = $1 AND n.team_id = re.team_id
                                      AND n.space_id = re.space_id
                                      AND n.relationship_id = re.relationship_id
                                      AND n.projection_generation = re.projection_generation))
        """,
        run.id,
    )
    if missing:
        return int(missing)
    # The model's new name reaches every vector row and projection (ON UPDATE CASCADE).
    renamed = await conn.execute(
        "UPDATE embedding_models SET name = $2, recorded_at = now() WHERE name = $1",
        run.from_model,
        run.to_model,
    )
    if renamed != "UPDATE 1":
        raise RuntimeError(f"the store no longer holds model {run.from_model!r}")
    await conn.execute(
        """
        UPDATE evidence_embeddings ee SET embedding = n.embedding
        FROM reembed_evidence n
        WHERE n.run_id = $1 AND n.team_id = ee.team_id AND n.space_id = ee.space_id
          AND n.evidence_id = ee.evidence_id
        """,
        run.id,
    )
    await conn.execute(
        """
        UPDATE relationship_embeddings re SET embedding = n.embedding
        FROM reembed_relationships n
        WHERE n.run_id = $1 AND n.team_id = re.team_id AND n.space_id = re.space_id
          AND n.relationship_id = re.relationship_id
          AND n.projection_generation = re.projection_generation
        """,
        run.id,
    )
    await conn.execute(
        "UPDATE reembed_runs SET status = 'completed', finished_at = now() WHERE id = $1", run.id
    )
    await conn.execute("DELETE FROM reembed_evidence WHERE run_id = $1", run.id)
    await conn.execute("DELETE FROM reembed_relationships WHERE run_id = $1", run.id)
    return 0
