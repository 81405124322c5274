"""Who may use the API: logins, API keys, roles, CSRF, and the listener's default.

Every ``/api/v1`` request but the login and the OpenAPI description passes
:func:`access_middleware`, which finds its :class:`~router.state.console_store.Principal`:

1. ``Authorization: Bearer rk_...``: an API key (a bad one is 401, never a fallback);
2. the ``router_session`` cookie of a login (:mod:`router.state.console_store`);
3. no account at all in Redis: a listener on a loopback address lets the request in as
   an admin if its ``Host`` names a loopback address (a page of another site that a
   browser here opens cannot rebind its name to us); a listener on any other address
   refuses everything (403) until an account exists;
4. otherwise: 401.

A request that changes something (any method but GET and HEAD) needs the admin role (but
a logout), and when it is made with a cookie (or the open access of 3), the header
``X-CSRF-Token`` holding its login's token, a logout's too: a page of another origin can
make a browser send the cookie, never read the token. Logins fail slowly on purpose (the
password hash) and are throttled in Redis, for the whole cluster, per user and per source
address, before the hash is checked (:mod:`router.state.login_attempts`).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from router.core.passwords import PasswordHash
from router.errors import AccessDeniedError, LoginRequiredError, RequestError
from router.state.console_store import ITERATIONS, LOGIN_SECONDS, ConsoleStore, Principal
from router.state.login_attempts import LoginAttempts
from router.web.replies import body_of, field as body_field, reply

COOKIE: Final = "router_session"
CSRF_HEADER: Final = "X-CSRF-Token"
LOGOUT: Final = "/api/v1/logout"
OPEN_PATHS: Final = frozenset({"/api/v1/login", "/api/v1/openapi.json"})
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN_FAILURES: Final = 10
"""Failed logins a user, and a source address, may make per :data:`LOGIN_WINDOW` seconds
(on the whole cluster)."""
LOGIN_WINDOW: Final = 60.0
LOGIN_BODY: Final = 128 * 1024
"""Bytes of a login's body at most: it is read before anyone logged in, so less than any
other (a login takes a few hundred bytes; this bounds the depth scan to ~10 ms)."""
IPV6_GROUP: Final = 64
"""The prefix length an IPv6 source is counted under (one host often holds a /64)."""
PRINCIPAL: Final = web.RequestKey("principal", Principal)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@functools.cache
def decoy() -> PasswordHash:
    """A hash checked when the user does not exist, so both answers take as long (made
    at the first login, not when the module is imported: a hash costs ~0.1 s)."""
    return PasswordHash.create(secrets.token_urlsafe(16), iterations=ITERATIONS)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name) is this machine only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def source_of(remote: str | None) -> str:
    """The source a login is counted under: its IPv4 address (an IPv4-mapped IPv6 one
    too), the /64 network of an IPv6 address, or ``?`` when unknown (a Unix socket)."""
    if not remote:
        return "?"
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_GROUP), strict=False))
    return str(address)


class Access:
    """The access rules of one listener (see the module docstring)."""

    def __init__(self, console: ConsoleStore, *, loopback: bool) -> None:
        self.console = console
        self.loopback = loopback
        self.throttle = LoginAttempts(
            console.redis, console.keys, limit=LOGIN_FAILURES, window=LOGIN_WINDOW
        )
        self._open_csrf = secrets.token_urlsafe(24)  # (the open access's token)

    async def principal(self, request: web.Request) -> Principal:
        """Who makes ``request`` (raises :class:`LoginRequiredError` or
        :class:`AccessDeniedError` when nobody may)."""
        authorization = request.headers.get("Authorization", "")
        if authorization:
            scheme, _, presented = authorization.partition(" ")
            found = None
            if scheme.lower() == "bearer":
                found = await self.console.api_key(presented.strip())
            if found is None:
                raise LoginRequiredError("the API key is not valid")
            return found
        token = request.cookies.get(COOKIE)
        if token:
            found = await self.console.login(token)
            if found is not None:
                return found
        if await self.console.has_accounts():
            raise LoginRequiredError("log in first (POST /api/v1/login) or send an API key")
        if not self.loopback:
            raise AccessDeniedError(
                "this listener is not on a loopback address and no dashboard account "
                "exists: add one with `router dashboard users add NAME --role admin`"
            )
        if not is_loopback(request.url.host or ""):
            raise AccessDeniedError("open access is for loopback host names only")
        return Principal(None, "admin", self._open_csrf)

    def check_change(self, request: web.Request, principal: Principal) -> None:
        """Whether ``principal`` may make the state-changing ``request`` (any role may log
        out; the CSRF token is needed all the same, so no other site logs a user out)."""
        if not principal.may_change and request.path != LOGOUT:
            raise AccessDeniedError(f"the {principal.role} role may only read")
        if principal.csrf is not None:
            presented = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(presented.encode(), principal.csrf.encode()):
                raise AccessDeniedError(f"the {CSRF_HEADER} header is missing or wrong")

    # -- endpoints -------------------------------------------------------------------

    async def login(self, request: web.Request) -> web.Response:
        """``POST /api/v1/login {"user", "password"}``: a slot of the throttle is taken
        first (429 while the user's or the address's is full), kept by a wrong password,
        given back by the right one."""
        body = await body_of(request, LOGIN_BODY)
        user, password = body_field(body, "user", str), body_field(body, "password", str)
        attempt = await self.throttle.take(user, source_of(request.remote))
        found = await self.console.user_hash(user)
        hashed = decoy() if found is None else found[1]
        matched = await asyncio.to_thread(hashed.verify, password)
        if found is None or not matched:
            raise LoginRequiredError("wrong user name or password")
        await self.throttle.release(attempt)
        role = found[0]
        token, csrf = await self.console.open_login(user, role)
        answer = reply({"user": user, "role": role, "csrf": csrf})
        answer.set_cookie(
            COOKIE,
            token,
            max_age=LOGIN_SECONDS,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        return answer

    async def logout(self, request: web.Request) -> web.Response:
        """``POST /api/v1/logout`` (with the login's CSRF token): the login ends (on every
        node)."""
        token = request.cookies.get(COOKIE)
        if token:
            await self.console.close_login(token)
        answer = reply({"logged_out": True})
        answer.del_cookie(COOKIE, path="/")
        return answer

    async def me(self, request: web.Request) -> web.Response:
        """``GET /api/v1/me``: who this is, and the CSRF token to send."""
        principal = request[PRINCIPAL]
        return reply({"user": principal.user, "role": principal.role, "csrf": principal.csrf})


def access_middleware(
    access: Access,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The middleware that sets ``request[PRINCIPAL]`` on every API request, or refuses it."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/api/") or request.path in OPEN_PATHS:
            return await handler(request)
        principal = await access.principal(request)
        if request.method not in SAFE_METHODS:
            access.check_change(request, principal)
        request[PRINCIPAL] = principal
        return await handler(request)

    return middleware


def principal_of(request: web.Request) -> Principal:
    """The principal the middleware found (:class:`RequestError` outside the API)."""
    try:
        return request[PRINCIPAL]
    except KeyError:
        raise RequestError("not an API request") from None
