"""The shape of a document, bounded in time linear in its text.

Fragments let a short document stand for a huge one: 22 fragments that each
spread the previous one twice (878 bytes) expand to four million selections,
and a rule that follows every spread path (strawberry's depth and alias
limiters did) runs for minutes. graphql-core's ``OverlappingFieldsCanBeMerged``
compares every pair of fields that answer under one response name, so 490
repetitions of ``viewer { principalId }`` (10 KB) cost it seconds.

This module measures a document before any of those rules see it:

- depth, aliases and the *expanded* number of selections (fields, fragment
  spreads and inline fragments, as if every spread were written out) are
  computed once per fragment, fragments in dependency order, so the work is
  linear in the text however many times a fragment is spread;
- only a document whose expansion is within ``max_selections`` is expanded,
  to count how many fields answer under one response path
  (``max_repeats``), which bounds the overlap rule's pairwise work.

Each refusal has its code. Cyclic or unknown fragments count as empty here:
graphql-core's own rules report them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from graphql import (
    DirectiveNode,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    Node,
    OperationDefinitionNode,
    SelectionSetNode,
    visit,
)
from graphql.language import Visitor

_SATURATED = 1 << 62
"""Counts stop growing here: any limit is far below, and numbers stay small."""


@dataclass(frozen=True, slots=True)
class ShapeLimits:
    max_depth: int
    max_aliases: int
    max_selections: int
    max_repeats: int
    max_directives: int


@dataclass(frozen=True, slots=True)
class Summary:
    """What a selection set weighs once every fragment spread in it is written out."""

    selections: int
    depth: int
    aliases: int
    empty: bool
    """A selection set somewhere in it is empty (graphql-core 3.3 parses ``{ }``)."""


_NOTHING = Summary(0, 0, 0, False)


def _add(a: int, b: int) -> int:
    return min(a + b, _SATURATED)


def fragments_of(document: DocumentNode) -> dict[str, FragmentDefinitionNode]:
    """The fragments by name; a repeated name keeps the first (another rule reports it)."""
    found: dict[str, FragmentDefinitionNode] = {}
    for definition in document.definitions:
        if isinstance(definition, FragmentDefinitionNode):
            found.setdefault(definition.name.value, definition)
    return found


def _spreads(selections: SelectionSetNode) -> Iterator[str]:
    """Names of the fragments spread anywhere inside ``selections`` (iteratively)."""
    pending = [selections]
    while pending:
        current = pending.pop()
        for selection in current.selections:
            if isinstance(selection, FragmentSpreadNode):
                yield selection.name.value
            elif isinstance(selection, FieldNode | InlineFragmentNode):
                if selection.selection_set is not None:
                    pending.append(selection.selection_set)


def dependency_order(fragments: dict[str, FragmentDefinitionNode]) -> list[str]:
    """Fragments ordered so that each comes after every fragment it spreads.

    An iterative depth-first search (a spread chain can be hundreds long, deeper
    than Python's recursion allows); the edge that closes a cycle is ignored.
    """
    order: list[str] = []
    seen: set[str] = set()
    for start in fragments:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(list(_spreads(fragments[start].selection_set))))]
        while stack:
            name, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                order.append(name)
            elif child in fragments and child not in seen:
                seen.add(child)
                stack.append((child, iter(list(_spreads(fragments[child].selection_set)))))
    return order


def _is_introspection(node: FieldNode) -> bool:
    return node.name.value.startswith("__")


class _Summariser:
    """Summaries of fragments (each computed once) and of operations."""

    def __init__(self, document: DocumentNode) -> None:
        self.fragments = fragments_of(document)
        self.done: dict[str, Summary] = {}
        for name in dependency_order(self.fragments):
            self.done[name] = self.selection_set(self.fragments[name].selection_set)

    def selection_set(self, node: SelectionSetNode) -> Summary:
        """One definition's selection set; spreads read the finished fragments.

        Recursion here follows the text's own nesting only, which graphql-core's
        parser bounds (200 levels); fragment spreads are looked up, not entered.
        """
        selections = depth = aliases = 0
        empty = not node.selections
        for selection in node.selections:
            if isinstance(selection, FragmentSpreadNode):
                inner = self.done.get(selection.name.value, _NOTHING)
                selections = _add(selections, _add(1, inner.selections))
                depth = max(depth, inner.depth)
            elif isinstance(selection, InlineFragmentNode):
                inner = self.selection_set(selection.selection_set)
                selections = _add(selections, _add(1, inner.selections))
                depth = max(depth, inner.depth)
            else:
                assert isinstance(selection, FieldNode)
                inner = (
                    _NOTHING
                    if selection.selection_set is None
                    else self.selection_set(selection.selection_set)
                )
                selections = _add(selections, _add(1, inner.selections))
                if selection.selection_set is not None and not _is_introspection(selection):
                    # strawberry's measure: a leaf is 0, a field with a selection 1 more
                    depth = max(depth, 1 + inner.depth)
                if selection.alias is not None:
                    aliases = _add(aliases, 1)
            aliases = _add(aliases, inner.aliases)
            empty = empty or inner.empty
        return Summary(selections, depth, aliases, empty)


def _error(message: str, node: Node | None, code: str, **extra: object) -> GraphQLError:
    return GraphQLError(message, node, extensions={"code": code, **extra})


def _operation_name(operation: OperationDefinitionNode) -> str:
    return operation.name.value if operation.name is not None else "anonymous"


def _flatten(
    groups: list[SelectionSetNode], fragments: dict[str, FragmentDefinitionNode]
) -> dict[str, list[FieldNode]]:
    """The fields that answer under each response name of one response object,
    fragments written out (each spread as often as it appears)."""
    fields: dict[str, list[FieldNode]] = {}
    pending: list[tuple[SelectionSetNode, frozenset[str]]] = [(g, frozenset()) for g in groups]
    while pending:
        current, visiting = pending.pop()
        for selection in current.selections:
            if isinstance(selection, FieldNode):
                key = (selection.alias or selection.name).value
                fields.setdefault(key, []).append(selection)
            elif isinstance(selection, InlineFragmentNode):
                pending.append((selection.selection_set, visiting))
            else:
                assert isinstance(selection, FragmentSpreadNode)
                name = selection.name.value
                fragment = fragments.get(name)
                if fragment is not None and name not in visiting:
                    pending.append((fragment.selection_set, visiting | {name}))
    return fields


def _repeats(
    operation: OperationDefinitionNode,
    fragments: dict[str, FragmentDefinitionNode],
    limit: int,
) -> GraphQLError | None:
    """Refuse more than ``limit`` selections that repeat a response name already
    selected in the same response object.

    graphql-core compares every pair of fields under one response path, so its
    work grows with the square of these repeats (at most about ``limit`` squared
    over two comparisons once they are bounded). Walks the expansion: call it
    only once the expansion is known to be small.
    """
    repeats = 0
    worst, worst_count, worst_node = "", 1, None
    pending: list[tuple[str, list[SelectionSetNode]]] = [("", [operation.selection_set])]
    while pending:
        path, groups = pending.pop()
        for key, fields in _flatten(groups, fragments).items():
            where = f"{path}.{key}" if path else key
            repeats += len(fields) - 1
            if len(fields) > worst_count:
                worst, worst_count, worst_node = where, len(fields), fields[1]
            below = [f.selection_set for f in fields if f.selection_set is not None]
            if below:
                pending.append((where, below))
    if repeats <= limit:
        return None
    return _error(
        f"'{_operation_name(operation)}' selects {repeats} fields under a response name "
        f"already selected in the same object ('{worst}' {worst_count} times), more than "
        f"the maximum {limit}: select each field once.",
        worst_node,
        "TOO_MANY_REPEATS",
        maxRepeats=limit,
    )


class _Directives(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[DirectiveNode] = []

    def enter_directive(self, node: DirectiveNode, *_args: object) -> None:
        self.nodes.append(node)


@dataclass(frozen=True, slots=True)
class Report:
    errors: list[GraphQLError]
    selections: int
    """The largest expansion of an operation of the document."""


def check(document: DocumentNode, limits: ShapeLimits) -> Report:
    """The shape errors of ``document`` (none when it is within every bound)."""
    summariser = _Summariser(document)
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    errors: list[GraphQLError] = []
    aliases = largest = 0
    empty = any(summary.empty for summary in summariser.done.values())
    for operation in operations:
        summary = summariser.selection_set(operation.selection_set)
        aliases = _add(aliases, summary.aliases)
        largest = max(largest, summary.selections)
        empty = empty or summary.empty
        name = _operation_name(operation)
        if summary.depth > limits.max_depth:
            errors.append(
                _error(
                    f"'{name}' exceeds maximum operation depth of {limits.max_depth}",
                    operation,
                    "QUERY_TOO_DEEP",
                    maxDepth=limits.max_depth,
                )
            )
        if summary.selections > limits.max_selections:
            size = "over a billion" if summary.selections >= _SATURATED else summary.selections
            errors.append(
                _error(
                    f"'{name}' has {size} selections once its fragments are written out, "
                    f"more than the maximum {limits.max_selections}.",
                    operation,
                    "TOO_MANY_SELECTIONS",
                    maxSelections=limits.max_selections,
                )
            )
    if empty:
        errors.append(_error("A selection set is empty.", None, "GRAPHQL_VALIDATION_FAILED"))
    if aliases > limits.max_aliases:
        errors.append(
            _error(
                f"{aliases} aliases found. Allowed: {limits.max_aliases}",
                None,
                "TOO_MANY_ALIASES",
                maxAliases=limits.max_aliases,
            )
        )
    directives = _Directives()
    visit(document, directives)
    if len(directives.nodes) > limits.max_directives:
        errors.append(
            _error(
                f"The document has more than {limits.max_directives} directives.",
                directives.nodes[limits.max_directives],
                "TOO_MANY_DIRECTIVES",
                maxDirectives=limits.max_directives,
            )
        )
    if not errors:
        # only now is the expansion known to be small enough to walk
        for operation in operations:
            repeated = _repeats(operation, summariser.fragments, limits.max_repeats)
            if repeated is not None:
                errors.append(repeated)
    return Report(errors, largest)
