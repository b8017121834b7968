"""Query cost: reject an operation whose worst case is too big.

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
  and a cached validation must not depend on them); a literal out of the
  argument's range is refused as ``BAD_USER_INPUT`` naming the argument, as the
  resolver refuses the same value in a variable; lists with a bound of their
  own count it (``FIXED_SIZES``); other lists count ``DEFAULT_LIST_SIZE`` items;
- fields that do a search of their own add ``FIELD_COST``.

Other operations register their lists and bounds in the tables below
(``traceMemory``'s lists are bounded by its ``maxEdges`` and ``maxEvents``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLInterfaceType,
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    IntValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    VariableNode,
    get_named_type,
    get_nullable_type,
    is_leaf_type,
    is_list_type,
)

from gateway.errors import InvalidInput
from gateway.http.shape import fragments_of
from gateway.services import recall_input, trace
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

_OWNERS = frozenset(sized.field for sized in LIST_SIZES.values())
"""Fields whose arguments size lists below them."""


ARGUMENT_CHECKS: dict[str, Callable[[str, int | None], int]] = {
    _RECALL: recall_input._bounded,
    _TRACE: trace._bounded,
}
"""The services' own checks of bounded arguments, run on literal values here so
that ``limit: 100000`` is the same ``BAD_USER_INPUT`` written inline as passed
in a variable (the resolver runs the same check on variables)."""


def _argument_errors(node: FieldNode, coordinate: str) -> list[GraphQLError]:
    check = ARGUMENT_CHECKS.get(coordinate)
    if check is None:
        return []
    errors: list[GraphQLError] = []
    for arg in node.arguments or ():
        if not isinstance(arg.value, IntValueNode):
            continue
        name = arg.name.value
        try:
            check(name, int(arg.value.value))
        except KeyError:
            continue  # not a bounded argument
        except InvalidInput as exc:
            errors.append(
                GraphQLError(
                    exc.message, arg, extensions={"code": exc.code, "field": exc.field or name}
                )
            )
    return errors


def _size(owner: FieldNode | None, sized: SizedBy) -> int:
    """A list's size from the argument bounding it: a literal (at most the
    argument's maximum: a larger one is refused on its own), a variable at its
    maximum, an absent argument at its default."""
    if owner is None:
        return sized.bound.default
    for arg in owner.arguments or ():
        if arg.name.value != sized.argument:
            continue
        if isinstance(arg.value, IntValueNode):
            return min(max(0, int(arg.value.value)), sized.bound.maximum)
        if isinstance(arg.value, VariableNode):
            return sized.bound.maximum
        return sized.bound.default  # null or a wrong type: another rule reports it
    return sized.bound.default


@dataclass(frozen=True, slots=True)
class _Frame:
    selections: SelectionSetNode
    parent: GraphQLNamedType
    owners: Mapping[str, FieldNode]
    multiplier: int
    visiting: frozenset[str]


@dataclass
class Estimate:
    cost: int = 0
    argument_errors: list[GraphQLError] = field(default_factory=list)


def estimate(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentDefinitionNode],
) -> Estimate:
    """The worst-case number of objects ``operation`` may resolve, and the bound
    arguments written out of range.

    Walks the operation with its fragments written out, iteratively: the
    caller has checked that the expansion is small (``gateway.http.shape``),
    which keeps this linear. Each object field costs its multiplier (the
    product of the list sizes above it) times its own size, plus its search
    cost.
    """
    result = Estimate()
    root = schema.get_root_type(operation.operation)
    if root is None:
        return result
    checked: set[int] = set()
    pending = [_Frame(operation.selection_set, root, {}, 1, frozenset())]
    while pending:
        frame = pending.pop()
        for selection in frame.selections.selections:
            if isinstance(selection, InlineFragmentNode):
                on = frame.parent
                if selection.type_condition is not None:
                    on = schema.get_type(selection.type_condition.name.value) or frame.parent
                pending.append(
                    _Frame(
                        selection.selection_set, on, frame.owners, frame.multiplier, frame.visiting
                    )
                )
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = fragments.get(name)
                if fragment is None or name in frame.visiting:
                    continue  # unknown or cyclic fragments are other rules' errors
                on = schema.get_type(fragment.type_condition.name.value) or frame.parent
                pending.append(
                    _Frame(
                        fragment.selection_set,
                        on,
                        frame.owners,
                        frame.multiplier,
                        frame.visiting | {name},
                    )
                )
            else:
                assert isinstance(selection, FieldNode)
                _field(schema, selection, frame, result, pending, checked)
    return result


def _field(
    schema: GraphQLSchema,
    node: FieldNode,
    frame: _Frame,
    result: Estimate,
    pending: list[_Frame],
    checked: set[int],
) -> None:
    parent = frame.parent
    if not isinstance(parent, GraphQLObjectType | GraphQLInterfaceType):
        return
    definition = parent.fields.get(node.name.value)
    if definition is None:
        return  # unknown fields are FieldsOnCorrectTypeRule's error
    coordinate = f"{parent.name}.{node.name.value}"
    if id(node) not in checked:  # a node spread twice is reported once
        checked.add(id(node))
        result.argument_errors.extend(_argument_errors(node, coordinate))
    field_type = get_nullable_type(definition.type)
    named = get_named_type(field_type)
    if is_leaf_type(named):
        return
    size = 1
    if is_list_type(field_type):
        sized = LIST_SIZES.get(coordinate)
        if sized is None:
            size = FIXED_SIZES.get(coordinate, DEFAULT_LIST_SIZE)
        else:
            size = _size(frame.owners.get(sized.field), sized)
    result.cost += frame.multiplier * (FIELD_COST.get(coordinate, 0) + size)
    if node.selection_set is not None:
        owners = {**frame.owners, coordinate: node} if coordinate in _OWNERS else frame.owners
        pending.append(
            _Frame(node.selection_set, named, owners, frame.multiplier * size, frame.visiting)
        )


def check(schema: GraphQLSchema, document: DocumentNode, max_cost: int) -> list[GraphQLError]:
    """Bound arguments out of range (``BAD_USER_INPUT`` naming the argument), then
    operations costing more than ``max_cost`` (``QUERY_TOO_COSTLY``)."""
    fragments = fragments_of(document)
    errors: list[GraphQLError] = []
    for definition in document.definitions:
        if not isinstance(definition, OperationDefinitionNode):
            continue
        found = estimate(schema, definition, fragments)
        errors.extend(found.argument_errors)
        if found.cost > max_cost:
            errors.append(
                GraphQLError(
                    f"The operation may cost {found.cost}, more than the maximum {max_cost}: "
                    "ask for smaller limits or fewer fields.",
                    definition,
                    extensions={
                        "code": "QUERY_TOO_COSTLY",
                        "cost": found.cost,
                        "maxCost": max_cost,
                    },
                )
            )
    return errors
