"""What every endpoint of the API shares: JSON replies, errors as JSON, paging, bodies.

An error reply is ``{"error": TYPE, "message": TEXT}`` where TYPE is the router's error
class (:func:`error_reply`); the status comes from the error's kind (:func:`status_of`).
A list is paged by an opaque cursor (:func:`encode_cursor`): ``?limit=N&cursor=C``
answered by ``{"items": [...], "next": C | null}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiohttp import web

from router.errors import (
    AccessDeniedError,
    ClientNotFoundError,
    LoginRequiredError,
    NotAuthorizedError,
    PublishTimeoutError,
    RequestError,
    RetainedStoreFullError,
    SessionInUseError,
    StateError,
    StateUnavailableError,
)

log = logging.getLogger(__name__)

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1_000
MAX_BODY: Final = 1 << 20
"""Bytes of a request body at most (a publish's payload included)."""


def reply(data: Any, status: int = 200) -> web.Response:
    """``data`` as a JSON reply."""
    return web.json_response(data, status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def status_of(error: BaseException) -> int:
    """The HTTP status of an error an endpoint raised."""
    if isinstance(error, LoginRequiredError):
        return 401
    if isinstance(error, AccessDeniedError | NotAuthorizedError):
        return 403
    if isinstance(error, ClientNotFoundError | LookupError):
        return 404
    if isinstance(error, RetainedStoreFullError | SessionInUseError):
        return 409
    if isinstance(error, ValueError):
        return 400
    if isinstance(error, PublishTimeoutError | StateError | OSError | TimeoutError):
        return 503
    return 500


def error_reply(error: BaseException) -> web.Response:
    """The JSON reply of an error: its type and message; an unexpected one is logged
    and told only by its type (never a traceback)."""
    status = status_of(error)
    if isinstance(error, TimeoutError):  # (a wait for Redis ran out: asyncio.timeout)
        kind, message = StateUnavailableError.__name__, f"Redis did not answer: {error}"
    elif status == 500:
        log.exception("HTTP API request failed", exc_info=error)
        kind, message = "InternalError", "the request failed inside the node (logged)"
    else:
        kind, message = type(error).__name__, str(error)
    return reply({"error": kind, "message": message}, status)


# -- paging ------------------------------------------------------------------------------


def limit_of(request: web.Request) -> int:
    """``?limit=N`` (default 100, 1 to 1,000)."""
    text = request.query.get("limit")
    if text is None:
        return DEFAULT_LIMIT
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise RequestError(f"limit is a whole number from 1 to {MAX_LIMIT}, not {text!r}")
    return int(text)


def encode_cursor(position: Any) -> str:
    """An opaque cursor for ``position`` (JSON data)."""
    return base64.urlsafe_b64encode(_dumps(position).encode("utf-8")).decode("ascii")


def cursor_of(request: web.Request) -> Any:
    """The position ``?cursor=`` names (None: the first page)."""
    text = request.query.get("cursor")
    if not text:
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(text.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        raise RequestError("cursor is not one a page of this API gave") from None


def page(items: Sequence[Any], next_position: Any) -> web.Response:
    """A page's reply; ``next_position`` None on the last page."""
    following = None if next_position is None else encode_cursor(next_position)
    return reply({"items": list(items), "next": following})


def query(request: web.Request, name: str, *, required: bool = False) -> str | None:
    """A query parameter; :class:`RequestError` if ``required`` and absent or empty."""
    value = request.query.get(name)
    if required and not value:
        raise RequestError(f"the query parameter {name!r} is required")
    return value or None


# -- bodies ------------------------------------------------------------------------------


async def body_of(request: web.Request) -> Mapping[str, Any]:
    """The request's body: a JSON object (:class:`RequestError` otherwise)."""
    try:
        data = await request.json()
    except (ValueError, UnicodeError):
        raise RequestError("the body is not JSON") from None
    if not isinstance(data, dict):
        raise RequestError("the body is not a JSON object")
    return data


def field(
    body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    """``body[name]`` of type ``kind`` (a bool is never a number); ``default`` when absent
    (no default: required)."""
    if name not in body or body[name] is None:
        if default is ...:
            raise RequestError(f"the field {name!r} is required")
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    numeric = any(k in (int, float) for k in kinds)
    if not isinstance(value, kinds) or (numeric and isinstance(value, bool) and bool not in kinds):
        wanted = " or ".join(k.__name__ for k in kinds)
        raise RequestError(f"the field {name!r} is a {wanted}, not {value!r}")
    return value
