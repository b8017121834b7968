"""The connection type the store functions take: a plain or a pooled connection."""

from __future__ import annotations

from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
