"""Documents generated from the schema, for the limit and fuzz tests."""

from __future__ import annotations

from graphql import (
    GraphQLInterfaceType,
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLSchema,
    get_named_type,
    is_leaf_type,
    is_non_null_type,
)


def selection(schema: GraphQLSchema, type_: GraphQLNamedType, depth: int) -> str:
    """Every field of ``type_`` (and of its implementations), ``depth`` levels down;
    fields with required arguments are left out."""
    if not isinstance(type_, GraphQLObjectType | GraphQLInterfaceType) or depth == 0:
        return ""
    parts: list[str] = []
    for name, field in type_.fields.items():
        if any(is_non_null_type(a.type) for a in field.args.values()):
            continue
        named = get_named_type(field.type)
        if is_leaf_type(named):
            parts.append(name)
        else:
            inner = selection(schema, named, depth - 1)
            if inner:
                parts.append(f"{name} {{ {inner} }}")
    if isinstance(type_, GraphQLInterfaceType):
        for impl in schema.get_implementations(type_).objects:
            inner = selection(schema, impl, depth)
            if inner:
                parts.append(f"... on {impl.name} {{ {inner} }}")
    return " ".join(parts)


def maximal_recall(schema: GraphQLSchema, *, arguments: str = "", depth: int = 6) -> str:
    result = schema.get_type("RecallResult")
    assert result is not None
    args = f'(query: "billing"{", " + arguments if arguments else ""})'
    return f"{{ recallMemory{args} {{ {selection(schema, result, depth)} }} }}"
