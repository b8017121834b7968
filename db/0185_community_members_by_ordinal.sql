-- A recall's community snapshot (gateway/store/communities.py, _SNAPSHOT) reads
-- the members of each community that touches its anchor groups: one subquery
-- per community, by (team, run, ordinal), ordered by group key and relationship
-- ID in code-point order. The only index with the run was (team, run, group),
-- so each community's subquery read every member of the run and kept those of
-- its ordinal (about 1,000 members read per community at 10,000 evidence per
-- space, 8 communities), then sorted them. This index finds a community's
-- members directly, already in the order the statement asks for (no sort), and
-- holds every column that subquery reads (an index-only scan where the
-- visibility map allows). Server CPU of the snapshot statement at 10,000
-- evidence per space: 1.57 -> 1.04 ms (docs/benchmarks.md, "Hypotheses,
-- conflicts and communities per recall"). No answer changes: an index.
--
-- Not CONCURRENTLY (a migration runs in a transaction); community_members is
-- written only by the community builder, a few thousand rows per run.

CREATE INDEX community_members_ordinal
    ON community_members (
        team_id, run_id, ordinal, semantic_group_key COLLATE "C", relationship_id COLLATE "C"
    );
