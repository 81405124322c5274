"""Redis Sentinel URLs: where the sentinels are and which master they watch.

A URL names the sentinels (any of them will do: redis-py asks each in turn) and the
master's name as the sentinels know it (``sentinel monitor NAME ...``)::

    redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/NAME[/DB][?OPTIONS]
    rediss+sentinel://...                       TLS to the sentinels and to the master

    redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster/0
    redis+sentinel://router:s3cret@[::1]:26379/mymaster?sentinel_password=watch
    rediss+sentinel://s1:26380,s2:26380/mymaster?ssl_ca_certs=/etc/redis/ca.crt

``USER:PASSWORD`` (percent-encoded) log in to the master and its replicas; a port left
out is 26379, Sentinel's own. ``OPTIONS`` are ``sentinel_username`` and
``sentinel_password`` (for sentinels with ``requirepass``/ACL users of their own) and,
with ``rediss+sentinel://``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile`` and
``ssl_cert_reqs`` (``none``, ``optional``, ``required``). Anything else in the URL is a
:class:`~router.errors.BadRedisURLError` (a missing master name, a bad port, a database
that is not a number, an unknown option), raised before anything connects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

from router.errors import BadRedisURLError

#: The URL schemes of a Redis behind Sentinel, and whether each speaks TLS.
SCHEMES: Final = {"redis+sentinel": False, "rediss+sentinel": True}
#: The port of a sentinel whose URL gives none.
DEFAULT_PORT: Final = 26379
#: The options a Sentinel URL's query may set, and what each takes.
SENTINEL_OPTIONS: Final = frozenset({"sentinel_username", "sentinel_password"})
TLS_OPTIONS: Final = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"})
CERT_REQS: Final = frozenset({"none", "optional", "required"})
SHAPE: Final = "redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]"


def is_sentinel_url(url: str) -> bool:
    """True if ``url``'s scheme is one of :data:`SCHEMES`."""
    return url.partition("://")[0].lower() in SCHEMES


@dataclass(frozen=True)
class SentinelURL:
    """A parsed Sentinel URL (see the module docstring): build one with :meth:`parse`."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    options: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """The parts of ``url``; :class:`BadRedisURLError` if it is not a Sentinel URL
        of the shape above (the message says what is wrong, never the password)."""
        scheme, separator, rest = url.partition("://")
        if not separator or scheme.lower() not in SCHEMES:
            raise BadRedisURLError(f"a Sentinel URL starts with {' or '.join(SCHEMES)}://")
        tls = SCHEMES[scheme.lower()]
        if "#" in rest:
            raise BadRedisURLError("a Sentinel URL has no #fragment")
        rest, _, query = rest.partition("?")
        netloc, slash, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        username, password = _credentials(userinfo) if at else (None, None)
        master, db = _path(slash + path)
        return cls(
            tuple(_address(item) for item in _split_hosts(hosts)),
            master,
            db,
            username,
            password,
            tls,
            _options(query, tls),
        )

    def shown(self) -> str:
        """The URL without its passwords, for messages and logs."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        user = f"{self.username or ''}:***@" if self.password is not None else ""
        return f"{scheme}://{user}{hosts}/{self.master}/{self.db}"

    def master_options(self) -> dict[str, Any]:
        """Connection settings for the master (and its replicas): the database,
        credentials and TLS files of the URL."""
        options: dict[str, Any] = {"db": self.db}
        if self.username is not None:
            options["username"] = self.username
        if self.password is not None:
            options["password"] = self.password
        if self.tls:
            options["ssl"] = True
            options.update(self._tls_files())
        return options

    def sentinel_options(self) -> dict[str, Any]:
        """Connection settings for the sentinels: their own credentials (none unless the
        query gives them) and the TLS files of the URL."""
        options: dict[str, Any] = {}
        if "sentinel_username" in self.options:
            options["username"] = self.options["sentinel_username"]
        if "sentinel_password" in self.options:
            options["password"] = self.options["sentinel_password"]
        if self.tls:
            options["ssl"] = True
            options.update(self._tls_files())
        return options

    def _tls_files(self) -> dict[str, str]:
        return {name: value for name, value in self.options.items() if name in TLS_OPTIONS}


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    if not colon:  # (redis-py's reading of redis://SECRET@host: a password alone)
        return None, unquote(user)
    return unquote(user) or None, unquote(password)


def _split_hosts(hosts: str) -> list[str]:
    if not hosts:
        raise BadRedisURLError(f"a Sentinel URL names at least one sentinel: {SHAPE}")
    items = hosts.split(",")
    if any(not item for item in items):
        raise BadRedisURLError("an empty sentinel address in a Sentinel URL (a stray comma?)")
    return items


def _address(item: str) -> tuple[str, int]:
    """(host, port) of ``HOST[:PORT]`` or ``[IPV6][:PORT]``."""
    if item.startswith("["):
        host, bracket, tail = item[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise BadRedisURLError(f"bad sentinel address {item!r}: [IPV6]:PORT")
        port_text = tail[1:] if tail else None
    else:
        host, colon, port = item.partition(":")
        port_text = port if colon else None
        if ":" in port:
            raise BadRedisURLError(f"bad sentinel address {item!r}: an IPv6 address goes in [ ]")
    if not host:
        raise BadRedisURLError(f"bad sentinel address {item!r}: no host")
    if port_text is None:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadRedisURLError(f"bad sentinel address {item!r}: a port is 1..65535")
    return host, int(port_text)


def _path(path: str) -> tuple[str, int]:
    """(master name, database) of ``/NAME[/DB]``."""
    segments = path.split("/")[1:] if path.startswith("/") else []
    if segments and segments[-1] == "":
        segments.pop()  # (a trailing slash)
    if not segments or not segments[0]:
        raise BadRedisURLError(f"a Sentinel URL names the master after the sentinels: {SHAPE}")
    if len(segments) > 2:
        raise BadRedisURLError(f"too many parts after the sentinels: {SHAPE}")
    db_text = segments[1] if len(segments) == 2 else "0"
    if not db_text.isdigit():
        raise BadRedisURLError(f"the database of a Sentinel URL is a number, not {db_text!r}")
    return unquote(segments[0]), int(db_text)


def _options(query: str, tls: bool) -> dict[str, str]:
    options: dict[str, str] = {}
    allowed = SENTINEL_OPTIONS | (TLS_OPTIONS if tls else frozenset())
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in allowed:
            known = ", ".join(sorted(allowed))
            hint = " (TLS options need rediss+sentinel://)" if name in TLS_OPTIONS else ""
            raise BadRedisURLError(
                f"unknown option {name!r} in a Sentinel URL{hint}; it takes {known}"
            )
        if name == "ssl_cert_reqs" and value not in CERT_REQS:
            raise BadRedisURLError(
                f"ssl_cert_reqs is one of {', '.join(sorted(CERT_REQS))}, not {value!r}"
            )
        options[name] = value
    return options
