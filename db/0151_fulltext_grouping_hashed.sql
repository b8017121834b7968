-- The evidence full-text function groups its postings by hashing, not sorting.
--
-- Profile (perf on a backend running the evidence full-text list of the recall
-- benchmark's 100,000-evidence dataset, spaces of 10,000 evidence, about 9,000
-- postings per question): the step `grp` of evidence_fulltext_top_k (db/0150)
-- sums the essential lexemes' postings per document, about 6,300 documents,
-- and was about two fifths of the function. Its generic plan (the one the
-- function keeps; row-level security's filters make every estimate small)
-- sorted the postings by document ID and grouped them in order: the sort of
-- 9,000 text keys was most of that step. With sorting disabled for the
-- function's query the same grouping is a hash aggregate; the sorts the query
-- needs for its ORDER BYs (the top-k, the lexemes' order) stay, as there is no
-- other way to do them. Interleaved, 30 questions, the list's server CPU went
-- from 9.20 to 8.46 ms (median; docs/benchmarks.md, "The full-text list's
-- survivors"). The rows are the same: a grouping's result does not depend on
-- how it is done, and every order the function returns is spelled in an ORDER
-- BY. The relationship function (about 1,000 postings per question) gained
-- nothing measurable and is left as it is.

ALTER FUNCTION evidence_fulltext_top_k(
    text, uuid, integer, timestamptz, text[], integer, bigint,
    text[], double precision[], double precision[], integer[], double precision
) SET enable_sort = off;
