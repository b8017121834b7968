"""A query cost validation rule: reject an operation whose worst case is too big.

Strawberry has depth, alias and token limiters but nothing that sees that
``{ a: recallMemory(limit: 50) { ... } b: recallMemory(limit: 50) { ... } }``
asks for far more work than its depth suggests. The rule estimates, before
anything executes, how many objects an operation may resolve:

- every field that returns an object costs 1 per object it may return;
  scalar and enum leaves cost nothing (they come with their object);
- a list multiplies the cost of what is under it by its size: the value of the
  argument that bounds it (``RecallResult.results`` by ``recallMemory(limit:)``,
  and so on, see ``LIST_SIZES``), the argument's default when it is absent, its
  maximum when it is a variable (validation runs before variables are known,
  and a cached validation must not depend on them); lists with a bound of their
  own count it (``FIXED_SIZES``); other lists count ``DEFAULT_LIST_SIZE`` items;
- fields that do a search of their own add ``FIELD_COST``.

Other operations register their lists and bounds in the tables below
(``traceMemory``'s lists are bounded by its ``maxEdges`` and ``maxEvents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from graphql import (
    FieldNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLInterfaceType,
    GraphQLNamedType,
    GraphQLObjectType,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    VariableNode,
    get_named_type,
    get_nullable_type,
    is_leaf_type,
    is_list_type,
)

from gateway.services.conflicts import MAX_SUPPORTERS
from gateway.services.recall_input import LIMITS, Bound
from gateway.services.trace import TRACE_BOUNDS

DEFAULT_LIST_SIZE = 10
"""Items assumed for a list that no argument bounds."""


@dataclass(frozen=True, slots=True)
class SizedBy:
    """A list's size is the argument ``argument`` of the field ``field`` above it."""

    field: str
    argument: str
    bound: Bound


_RECALL = "Query.recallMemory"

LIST_SIZES: dict[str, SizedBy] = {
    "RecallResult.results": SizedBy(_RECALL, "limit", LIMITS["limit"]),
    "RecallResult.relatedRelationships": SizedBy(
        _RECALL, "relationshipLimit", LIMITS["relationshipLimit"]
    ),
    "RecallResult.relatedCommunities": SizedBy(_RECALL, "communityLimit", LIMITS["communityLimit"]),
    "Community.members": SizedBy(
        _RECALL, "communityRelationshipLimit", LIMITS["communityRelationshipLimit"]
    ),
    "RecallResult.relatedHypotheses": SizedBy(
        _RECALL, "hypothesisLimit", LIMITS["hypothesisLimit"]
    ),
}

_TRACE = "Query.traceMemory"
LIST_SIZES.update(
    {
        "MemoryTrace.evidence": SizedBy(_TRACE, "maxEdges", TRACE_BOUNDS["maxEdges"]),
        "MemoryTrace.events": SizedBy(_TRACE, "maxEvents", TRACE_BOUNDS["maxEvents"]),
        "MemoryTrace.equivalents": SizedBy(_TRACE, "maxEdges", TRACE_BOUNDS["maxEdges"]),
        "MemoryTrace.conflicts": SizedBy(_TRACE, "maxEdges", TRACE_BOUNDS["maxEdges"]),
        "MemoryTrace.lineage": SizedBy(_TRACE, "maxEdges", TRACE_BOUNDS["maxEdges"]),
    }
)

FIXED_SIZES: dict[str, int] = {"ConflictPosition.supporters": MAX_SUPPORTERS}
"""Lists whose size has a fixed bound of its own."""

FIELD_COST: dict[str, int] = {_RECALL: 10, _TRACE: 10}
"""Extra cost of a field that runs searches of its own (per call)."""


def _argument(node: FieldNode, sized: SizedBy) -> int:
    for arg in node.arguments or ():
        if arg.name.value != sized.argument:
            continue
        if isinstance(arg.value, IntValueNode):
            return max(0, int(arg.value.value))
        if isinstance(arg.value, VariableNode):
            return sized.bound.maximum
        return sized.bound.default  # null or a wrong type: another rule reports it
    return sized.bound.default


class _Estimator:
    def __init__(self, context: ValidationContext) -> None:
        self.context = context
        self.schema = context.schema

    def selection_set(
        self,
        selections: SelectionSetNode | None,
        parent: GraphQLNamedType,
        ancestors: Mapping[str, FieldNode],
        fragments_seen: frozenset[str],
    ) -> int:
        if selections is None:
            return 0
        total = 0
        for selection in selections.selections:
            if isinstance(selection, FieldNode):
                total += self.field(selection, parent, ancestors, fragments_seen)
            elif isinstance(selection, InlineFragmentNode):
                on = parent
                if selection.type_condition is not None:
                    on = self.schema.get_type(selection.type_condition.name.value) or parent
                total += self.selection_set(selection.selection_set, on, ancestors, fragments_seen)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = self.context.get_fragment(name)
                if fragment is None or name in fragments_seen:
                    continue  # unknown or cyclic fragments are other rules' errors
                on = self.schema.get_type(fragment.type_condition.name.value) or parent
                total += self.selection_set(
                    fragment.selection_set, on, ancestors, fragments_seen | {name}
                )
        return total

    def field(
        self,
        node: FieldNode,
        parent: GraphQLNamedType,
        ancestors: Mapping[str, FieldNode],
        fragments_seen: frozenset[str],
    ) -> int:
        if not isinstance(parent, GraphQLObjectType | GraphQLInterfaceType):
            return 0
        definition = parent.fields.get(node.name.value)
        if definition is None:
            return 0  # unknown fields are FieldsOnCorrectTypeRule's error
        coordinate = f"{parent.name}.{node.name.value}"
        field_type = get_nullable_type(definition.type)
        named = get_named_type(field_type)
        if is_leaf_type(named):
            return 0
        size = 1
        if is_list_type(field_type):
            sized = LIST_SIZES.get(coordinate)
            if sized is None:
                size = FIXED_SIZES.get(coordinate, DEFAULT_LIST_SIZE)
            else:
                owner = ancestors.get(sized.field)
                size = sized.bound.default if owner is None else _argument(owner, sized)
        below = {**ancestors, coordinate: node}
        inner = self.selection_set(node.selection_set, named, below, fragments_seen)
        return FIELD_COST.get(coordinate, 0) + size * (1 + inner)


def estimate(context: ValidationContext, operation: OperationDefinitionNode) -> int:
    """The worst-case number of objects ``operation`` may resolve."""
    root = context.schema.get_root_type(operation.operation)
    if root is None:
        return 0
    return _Estimator(context).selection_set(operation.selection_set, root, {}, frozenset())


def cost_rule(max_cost: int) -> type[ValidationRule]:
    """A graphql-core validation rule that refuses operations costing more than ``max_cost``."""

    class QueryCostRule(ValidationRule):
        def enter_operation_definition(self, node: OperationDefinitionNode, *_args: Any) -> None:
            cost = estimate(self.context, node)
            if cost > max_cost:
                self.report_error(
                    GraphQLError(
                        f"The operation may cost {cost}, more than the maximum {max_cost}: "
                        "ask for smaller limits or fewer fields.",
                        node,
                        extensions={"code": "QUERY_TOO_COSTLY", "cost": cost, "maxCost": max_cost},
                    )
                )

    return QueryCostRule
