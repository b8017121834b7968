-- A tenancy (recall_app) makes no teams, principals, tokens or spaces: only
-- operator batches do, as the owner role (the record kinds team, principal and
-- token are operator-only; a principal's private space and a team's shared one
-- are made with them). db/0001 granted recall_app INSERT on these tables behind
-- the team wall only, so a tenancy that could run SQL could make a principal, or
-- mint a private-bound token of another principal of its team (the token lookup
-- compares the presented secret's sha256 with the row's and would accept it),
-- and so read that principal's private space: the space wall one table over.
-- recall_app keeps SELECT on them (spaces: the recall view and a write's space;
-- principals: a write's principal check). UPDATE, DELETE and TRUNCATE were never
-- granted (revoking a token runs as the owner); revoked too, as db/0130 did, so
-- a hand grant on a deployment goes with them (TRUNCATE ignores row-level
-- security).
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON teams, principals, api_tokens, memory_spaces
    FROM recall_app;
