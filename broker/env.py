"""Reading settings from the environment with errors that name the variable and say what was wrong."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from marketplace.api.rates import rate_parse

T = TypeVar("T")


def _parse(name: str, default: T, parser: Callable[[str], T], expected: str) -> T:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parser(raw)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not valid: expected {expected} ({exc})") from None


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, "") or default


def env_rate(name: str, default: str) -> str:
    """A request rate such as ``600/min`` (per s, min, hour or day)."""

    def parse(raw: str) -> str:
        rate_parse(raw)
        return raw

    return _parse(name, default, parse, "e.g. 600/min")


def env_bool(name: str, default: bool) -> bool:
    def parse(raw: str) -> bool:
        value = raw.strip().lower()
        if value in {"1", "true", "yes", "on"}:
            return True
        if value in {"0", "false", "no", "off"}:
            return False
        raise ValueError("not a boolean")

    return _parse(name, default, parse, "one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return _parse(name, default, parse, "an integer")


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    def parse(raw: str) -> float:
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}")
        return value

    return _parse(name, default, parse, "a number")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_database(name: str, default: dict[str, Any]) -> dict[str, Any]:
    """Parse a database URL; only PostgreSQL and SQLite are supported."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    scheme = raw.split(":", 1)[0]
    if scheme not in {"postgres", "postgresql", "pgsql", "sqlite"}:
        raise ImproperlyConfigured(
            f"{name}={raw.split('@')[-1]!r} is not valid: scheme {scheme!r} is not supported "
            "(use postgres://user@host:port/db or sqlite:///path)"
        )
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(raw, conn_max_age=60))
    except Exception as exc:
        raise ImproperlyConfigured(f"{name} is not a valid database URL: {exc}") from None
    if not config.get("NAME"):
        raise ImproperlyConfigured(f"{name} is not valid: it names no database")
    return config


def env_broker_url(name: str, default: str) -> str:
    raw = os.environ.get(name, "") or default
    scheme = raw.split("://", 1)[0] if "://" in raw else ""
    if scheme not in {"amqp", "amqps", "pyamqp", "redis", "rediss", "filesystem", "memory"}:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not valid: expected a URL with scheme amqp://, redis:// or filesystem://"
        )
    return raw
