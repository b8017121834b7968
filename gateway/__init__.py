"""Recall Gateway: a GraphQL memory-recall API over PostgreSQL and pgvector."""

__version__ = "0.1.0"

__all__ = ["__version__"]
