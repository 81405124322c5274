"""What every endpoint of the API shares: JSON replies, errors as JSON, paging, bodies.

An error reply is ``{"error": TYPE, "message": TEXT}`` where TYPE is the router's error
class (:func:`error_reply`) and TEXT says what went wrong in words; the status comes from
the error's kind (:func:`status_of`): bad input 400, refused 401/403/429, absent 404,
in conflict with the state 409, Redis not answering 503.
A list is paged by an opaque cursor (:func:`encode_cursor`): ``?limit=N&cursor=C``
answered by ``{"items": [...], "next": C | null}``. A body is one JSON object of at most
:data:`MAX_BODY` bytes, nested at most :data:`MAX_DEPTH` deep (:func:`body_of`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiohttp import web

from router.errors import (
    AccessDeniedError,
    BodyTooLargeError,
    ClientNotFoundError,
    LoginRequiredError,
    LoginThrottledError,
    NotAuthorizedError,
    PublishTimeoutError,
    RequestError,
    RetainedStoreFullError,
    RouteWriteError,
    ScriptError,
    SessionInUseError,
    StateError,
    StateFailureError,
    StateUnavailableError,
)

log = logging.getLogger(__name__)

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1_000
MAX_BODY: Final = 1 << 20
"""Bytes of a request body at most (a publish's payload included)."""
MAX_DEPTH: Final = 32
"""Arrays and objects nested in a request body at most (every endpoint reads flat ones)."""


def reply(data: Any, status: int = 200) -> web.Response:
    """``data`` as a JSON reply."""
    return web.json_response(data, status=status, dumps=_dumps)


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def status_of(error: BaseException) -> int:
    """The HTTP status of an error an endpoint raised: 503 only when Redis did not
    answer or failed (:class:`StateFailureError`, a timeout); a script's refusal of its
    arguments is bad input (400), any other state error a conflict with what Redis holds
    (409); an error that is none of the router's kinds is the node's fault (500)."""
    if isinstance(error, LoginRequiredError):
        return 401
    if isinstance(error, LoginThrottledError):
        return 429
    if isinstance(error, AccessDeniedError | NotAuthorizedError):
        return 403
    if isinstance(error, ClientNotFoundError | LookupError):
        return 404
    if isinstance(error, BodyTooLargeError):
        return 413
    if isinstance(error, RetainedStoreFullError | SessionInUseError):
        return 409
    if isinstance(error, ValueError | ScriptError):
        return 400
    if isinstance(
        error, StateFailureError | PublishTimeoutError | RouteWriteError | OSError | TimeoutError
    ):
        return 503
    if isinstance(error, StateError):
        return 409
    return 500


def _words(error: BaseException) -> str:
    """The error's message; for one raised without any, the first line of its class's
    description (never its class name alone)."""
    text = str(error)
    if text:
        return text
    doc = (type(error).__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split()) or "the request failed"


def error_reply(error: BaseException) -> web.Response:
    """The JSON reply of an error: its type and message; an unexpected one is logged
    and told only by its type (never a traceback). A throttled login says when to try
    again in ``Retry-After``."""
    status = status_of(error)
    if isinstance(error, TimeoutError):  # (a wait for Redis ran out: asyncio.timeout)
        kind = StateUnavailableError.__name__
        message = f"Redis did not answer: {error}" if str(error) else "Redis did not answer"
    elif status == 500:
        log.exception("HTTP API request failed", exc_info=error)
        kind, message = "InternalError", "the request failed inside the node (logged)"
    else:
        kind, message = type(error).__name__, _words(error)
    answer = reply({"error": kind, "message": message}, status)
    if isinstance(error, LoginThrottledError):
        answer.headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return answer


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


# Opening brackets as "(", closing ones as ")", anything else left out (nests_deeper).
_PARENTHESES: Final = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS: Final = bytes(sorted(set(range(256)) - set(b"[]{}")))


def nests_deeper(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects nest more than ``limit`` deep in the JSON text ``data``
    (brackets inside strings do not count), told without parsing it: the parser
    recurses, so it must not meet a body it would recurse into too deep. Text whose
    brackets do not pair is deeper when more than ``limit`` are left open in a row.

    The brackets outside strings (escapes dropped, then every other piece between two
    quotes) become parentheses; each round deletes every innermost pair ``()``, so after
    ``limit`` rounds a pair is left only where the nesting is deeper, and a run of
    ``limit + 1`` openers at any round is deeper at once. Every step is a scan in C: at
    most ``limit`` scans of the body's brackets (a body of 1 MiB: at most ~0.1 s, most
    bodies a count of brackets and nothing more)."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    plain = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(plain.split(b'"')[::2]).translate(_PARENTHESES, _NOT_BRACKETS)
    run = b"(" * (limit + 1)
    for _ in range(limit):
        if run in brackets:
            return True
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):  # (no pair left: unpaired, the parser refuses it)
            return False
        brackets = shorter
    return b"()" in brackets or run in brackets


async def body_of(request: web.Request, limit: int = MAX_BODY) -> Mapping[str, Any]:
    """The request's body: a JSON object of at most ``limit`` bytes (at most
    :data:`MAX_BODY`) nested at most :data:`MAX_DEPTH` deep. Raises
    :class:`BodyTooLargeError` for a larger body (a declared length is refused unread)
    and :class:`RequestError` for any other."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLargeError(limit)
    try:
        data = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLargeError(min(limit, MAX_BODY)) from None
    if len(data) > limit:
        raise BodyTooLargeError(limit)
    if nests_deeper(data):
        raise RequestError(
            f"the body nests arrays and objects deeper than {MAX_DEPTH} levels, the most "
            "the API reads"
        )
    try:
        found = json.loads(data)
    except (ValueError, UnicodeError, RecursionError):
        raise RequestError("the body is not JSON") from None
    if not isinstance(found, dict):
        raise RequestError("the body is not a JSON object")
    return found


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
