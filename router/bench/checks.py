"""Checks of ``router bench`` options, made before a bench starts any process: each
raises :class:`BenchSetupError` with one line naming the option."""

from __future__ import annotations

import math
import os
from pathlib import Path

import redis

from router.errors import BenchSetupError


def check_redis(url: str) -> None:
    """Raise :class:`BenchSetupError` unless ``url`` is a Redis URL that answers PING
    (checked before a bench starts any process)."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    except ValueError as exc:
        raise BenchSetupError(f"bad Redis URL {url!r}: {exc}") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        raise BenchSetupError(f"cannot reach Redis at {url}: {exc}") from None
    finally:
        client.close()


def check_directory(path: Path, option: str, empty: bool = False) -> None:
    """Raise :class:`BenchSetupError` (naming ``option``) unless ``path`` is, or can be
    made, a writable directory (with ``empty``: one that holds nothing yet)."""
    if empty and path.is_dir() and any(path.iterdir()):
        raise BenchSetupError(f"{option}: {path} is not empty (the logs of another run?)")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise BenchSetupError(f"{option}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BenchSetupError(f"{option}: {existing} is not writable")


def check_positive(**values: float) -> None:
    """Raise :class:`BenchSetupError` unless every value is a finite number > 0 (the
    message names the option: ``drain_seconds`` is ``--drain-seconds``)."""
    for name, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise BenchSetupError(f"--{name.replace('_', '-')} must be a number > 0, not {value}")
