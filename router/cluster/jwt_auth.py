"""JWT authentication of MQTT clients: the token is the CONNECT password (as in EMQX and
HiveMQ), checked with a shared secret (HS256/384/512) or a PEM public key (RS, PS, ES,
EdDSA). ``router node run --jwt-secret S`` or ``--jwt-public-key FILE`` installs it.

The contract:

* **Which passwords are tokens.** A password that parses as a JWT (three base64url parts,
  the first a JSON header) is checked as a token and nothing else: a token that fails is
  refused (CONNACK 0x86, 3.1.1: return code 4), never tried against a password file. Any
  other password goes to the password file when the node has one (``passwords``), or to
  the next ``client.authenticate`` callback when another is registered, else is refused.
  A client with neither user name nor password is anonymous (``allow_anonymous``).
* **What is checked** (:meth:`JwtVerifier.verify`): the signature, with an algorithm of
  the allow-list (never ``none``; HMAC only with a secret, the others only with a key of
  their family); ``exp`` is required; ``nbf`` and ``iat``, when present, are not in the
  future; ``aud`` and ``iss`` when the node names an audience or an issuer (a token with
  an ``aud`` claim needs the node to name one of its values, RFC 7519 4.1.3). Times get
  ``leeway`` seconds of slack for clocks that disagree (5 s by default).
* **The user name.** When the CONNECT carries a user name, the token's user name claim
  (``sub`` by default, ``--jwt-username-claim``) must be present and equal to it, so a
  token cannot be used to pose as another user of the ACL. A CONNECT without a user name
  (MQTT 5 allows a password alone) is accepted on the token and is nameless to the ACL.
* **Expiry.** The accepting decision carries ``expires_at`` = ``exp`` + leeway, the end of
  the token's validity as it was checked: the MQTT connection is closed then with
  DISCONNECT 0xA0 (Maximum connect time; 3.1.1: closed), its will published.
* **The ``acl`` claim** (EMQX's format): ``{"pub": [filters], "sub": [filters], "all":
  [filters]}``, allow-lists: a publish must match a ``pub`` or ``all`` filter, a topic
  received a ``sub`` or ``all`` filter (a subscribe is granted when some topic of its
  filter may be received: :mod:`router.core.acl`), anything else is denied. ``%u`` /
  ``${username}`` and ``%c`` / ``${clientid}`` stand for the user name and the client id.
  At most :data:`MAX_CLAIM_FILTERS` filters; a claim that is not of this form refuses the
  token. The claim only **narrows**: an action is allowed when the claim allows it *and*
  the node's ACL (if any) does; it is judged first, at ``client.check_acl`` (publish,
  subscribe, will) and on every copy on its way to the client
  (:mod:`router.cluster.delivery_acl`). A client without the claim is governed by the
  node's ACL alone, as before. EMQX 5.5's list form is read too: ``[{"permission":
  "allow"|"deny", "action": "publish"|"subscribe"|"all", "topic": filter}, ...]``, the
  first rule that matches decides and what none matches is left to the node's ACL; a
  rule with ``qos``, ``retain``, an ``eq`` topic or another matcher refuses the token
  (not enforced here, so never silently ignored).
* **Whose rules.** A claim applies to the client id and user name that presented it, from
  the moment its token is accepted until a later accepted CONNECT of that client id and
  user name (with its own claim, or none), or :data:`CLAIM_GRACE` seconds after the
  token's expiry (its connection is closed at the expiry). A refused CONNECT changes
  nothing. A CONNECT accepted by another ``client.authenticate`` callback (not the
  password file, which this module asks itself) leaves the claim in force until then:
  it can only narrow.

Nothing here runs until a client connects; the ACL hook and the receive check are
installed when the first token with an ``acl`` claim is accepted, so a node whose tokens
carry none keeps the fast path of its own ACL.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from cryptography.x509 import load_pem_x509_certificate

from router.core.acl import ACTION_WORDS, Acl, AclAction, AclRule, Permission
from router.core.hooks import ClientInfo, Decision, HookPoint, HookRegistry, HookResult, Stop
from router.core.passwords import PasswordFile
from router.errors import AclRuleError, JwtSettingError, TokenRefusedError

if TYPE_CHECKING:
    from router.cluster.node import RouterNode

PublicKey = (
    rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey
)

#: HMAC algorithms and the shortest secret each takes, in bytes (RFC 7518 3.2).
HMAC_ALGORITHMS: Final = {"HS256": 32, "HS384": 48, "HS512": 64}
RSA_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
#: EC algorithms and the curve of their keys.
EC_ALGORITHMS: Final = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}
DEFAULT_SECRET_ALGORITHMS: Final = ("HS256",)
DEFAULT_LEEWAY: Final = 5.0
DEFAULT_USERNAME_CLAIM: Final = "sub"
ACL_CLAIM: Final = "acl"
MAX_CLAIM_FILTERS: Final = 128
#: Seconds a claim is kept past its token's expiry, while its connection closes.
CLAIM_GRACE: Final = 60.0
#: ``client.authenticate`` / ``client.check_acl`` priority: before the password file
#: and the node's ACL (priority 0).
PRIORITY: Final = 100
_EMQX_PLACEHOLDERS: Final = (("${username}", "%u"), ("${clientid}", "%c"))
_T = TypeVar("_T")
_ACTIONS: Final = (("pub", AclAction.PUBLISH), ("sub", AclAction.SUBSCRIBE), ("all", AclAction.ALL))


@dataclass(frozen=True, slots=True)
class Token:
    """An accepted token: its claims, when it stops being valid (``exp`` + leeway, epoch
    seconds) and the rules of its ``acl`` claim (None without one)."""

    claims: dict[str, Any] = field(repr=False)
    expires_at: float
    acl: Acl | None = None


class JwtVerifier:
    """Checks tokens with one key (see the module docstring); build it with
    :meth:`from_secret` or :meth:`from_public_key` (or :func:`jwt_verifier`)."""

    def __init__(
        self,
        key: str | bytes | PublicKey,
        algorithms: Sequence[str],
        *,
        audience: str | None = None,
        issuer: str | None = None,
        username_claim: str = DEFAULT_USERNAME_CLAIM,
        leeway: float = DEFAULT_LEEWAY,
    ) -> None:
        """Raises :class:`JwtSettingError` for algorithms that do not fit ``key`` and for
        an empty audience, issuer or claim name or a leeway that is not a finite number
        of seconds >= 0."""
        _check_algorithms(key, algorithms)
        for name, value in (("audience", audience), ("issuer", issuer)):
            if value is not None and (not isinstance(value, str) or not value):
                raise JwtSettingError(f"the JWT {name} must be a non-empty string")
        if not isinstance(username_claim, str) or not username_claim:
            raise JwtSettingError("the JWT user name claim must be a non-empty string")
        if isinstance(leeway, bool) or not isinstance(leeway, int | float):
            raise JwtSettingError(f"the JWT leeway must be a number of seconds, not {leeway!r}")
        if not math.isfinite(leeway) or leeway < 0:
            raise JwtSettingError(f"the JWT leeway must be finite and >= 0, not {leeway!r}")
        self._key = key
        self.algorithms = tuple(algorithms)
        self.audience = audience
        self.issuer = issuer
        self.username_claim = username_claim
        self.leeway = float(leeway)

    @classmethod
    def from_secret(
        cls, secret: str | bytes, algorithms: Sequence[str] | None = None, **options: Any
    ) -> JwtVerifier:
        """A verifier of HMAC tokens (``algorithms``: HS256 by default); the secret must be
        at least as long as the hash of each algorithm (32 bytes for HS256)."""
        return cls(secret, algorithms or DEFAULT_SECRET_ALGORITHMS, **options)

    @classmethod
    def from_public_key(
        cls, path: str | Path, algorithms: Sequence[str] | None = None, **options: Any
    ) -> JwtVerifier:
        """A verifier with the PEM public key (or certificate) in the file ``path``;
        ``algorithms`` by default the one its type calls for: RS256 for an RSA key,
        ES256/ES384/ES512 for a P-256/P-384/P-521 key, EdDSA for Ed25519 and Ed448."""
        key = load_public_key(path)
        return cls(key, algorithms or (_default_algorithm(key),), **options)

    def describe(self) -> str:
        """One line for the log (never the secret)."""
        source = "secret" if isinstance(self._key, str | bytes) else "public key"
        checks = [f"{source}, {','.join(self.algorithms)}", f"user name in {self.username_claim!r}"]
        if self.audience is not None:
            checks.append(f"audience {self.audience!r}")
        if self.issuer is not None:
            checks.append(f"issuer {self.issuer!r}")
        return "; ".join([*checks, f"leeway {self.leeway:g} s"])

    def verify(self, token: str | bytes, username: str | None = None) -> Token:
        """The token, checked (see the module docstring) for a CONNECT with ``username``.
        Raises :class:`TokenRefusedError` naming the check that failed."""
        text = _text(token)
        if text is None:
            raise TokenRefusedError("not a JWT")
        try:
            claims = jwt.decode(
                text,
                self._key,
                algorithms=list(self.algorithms),
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp"], "verify_signature": True},
            )
        except jwt.PyJWTError as error:
            raise TokenRefusedError(_why(error)) from None
        if username is not None and claims.get(self.username_claim) != username:
            raise TokenRefusedError(f"its {self.username_claim!r} claim is not the user name")
        acl = claim_acl(claims[ACL_CLAIM]) if ACL_CLAIM in claims else None
        return Token(claims, float(claims["exp"]) + self.leeway, acl)


def jwt_verifier(
    secret: str | None = None,
    public_key: str | Path | None = None,
    algorithms: str | Sequence[str] | None = None,
    **options: Any,
) -> JwtVerifier:
    """The verifier ``router node run`` builds from its options: one of ``secret`` and
    ``public_key`` (a file), ``algorithms`` a comma list or a sequence (defaults:
    :meth:`JwtVerifier.from_secret`, :meth:`JwtVerifier.from_public_key`). Raises
    :class:`JwtSettingError`."""
    if (secret is None) == (public_key is None):
        raise JwtSettingError("JWT authentication needs one of a secret and a public key file")
    if isinstance(algorithms, str):
        algorithms = [name.strip() for name in algorithms.split(",") if name.strip()]
        if not algorithms:
            raise JwtSettingError("no JWT algorithm given")
    if secret is not None:
        return JwtVerifier.from_secret(secret, algorithms, **options)
    assert public_key is not None
    return JwtVerifier.from_public_key(public_key, algorithms, **options)


def load_public_key(path: str | Path) -> PublicKey:
    """The public key in a PEM file (a public key or a certificate); raises
    :class:`JwtSettingError` naming the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        reason = error.strerror or str(error)
        raise JwtSettingError(f"cannot read the JWT public key {str(path)!r}: {reason}") from None
    key: object
    try:
        key = load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            key = load_pem_x509_certificate(data).public_key()
        except ValueError:
            raise JwtSettingError(
                f"the JWT public key {str(path)!r} is not a PEM public key or certificate"
            ) from None
    if not isinstance(key, PublicKey):
        kind = type(key).__name__
        raise JwtSettingError(f"the JWT public key {str(path)!r} cannot check signatures ({kind})")
    return key


def claim_acl(claim: object) -> Acl:
    """The rules of an ``acl`` claim in one of EMQX's two formats (see the module
    docstring): the map of allow-lists (anything else denied), or the list of rules of
    EMQX 5.5 (:func:`_rule_list`). Raises :class:`TokenRefusedError` for a claim of
    another form, a bad filter or more than :data:`MAX_CLAIM_FILTERS` filters."""
    if isinstance(claim, list):
        return _rule_list(claim)
    if not isinstance(claim, dict):
        raise TokenRefusedError(
            'its acl claim must be {"pub": [...], "sub": [...], "all": [...]} or a list of rules'
        )
    unknown = sorted(str(key) for key in claim if key not in ("pub", "sub", "all"))
    if unknown:
        raise TokenRefusedError(f"its acl claim has unknown keys {unknown} (pub, sub, all)")
    rules = []
    for key, action in _ACTIONS:
        filters = claim.get(key, [])
        if not isinstance(filters, list) or not all(isinstance(f, str) for f in filters):
            raise TokenRefusedError(f"its acl claim's {key!r} must be a list of topic filters")
        for given in filters:
            topic_filter = given
            for emqx, ours in _EMQX_PLACEHOLDERS:
                topic_filter = topic_filter.replace(emqx, ours)
            try:
                rules.append(AclRule(Permission.ALLOW, action, topic_filter, source="acl claim"))
            except AclRuleError as error:
                raise TokenRefusedError(f"its acl claim's {key!r}: {error.reason}") from None
    if len(rules) > MAX_CLAIM_FILTERS:
        raise TokenRefusedError(f"its acl claim has over {MAX_CLAIM_FILTERS} filters")
    return Acl(rules, Permission.DENY)


def _rule_list(claim: list[Any]) -> Acl:
    """EMQX 5.5's list form: ``{"permission": "allow"|"deny", "action":
    "publish"|"subscribe"|"all", "topic": filter}`` rules, the first that matches
    decides, and an action none matches is left to the node's ACL (the claim still only
    narrows). A rule with a field this node cannot enforce (``qos``, ``retain``, an
    ``eq`` topic, EMQX 5.9's client matchers) refuses the token: read as broader than
    written, an allow rule would shadow the deny rules after it."""
    if len(claim) > MAX_CLAIM_FILTERS:
        raise TokenRefusedError(f"its acl claim has over {MAX_CLAIM_FILTERS} rules")
    rules = []
    for number, rule in enumerate(claim, 1):
        where = f"its acl claim's rule {number}"
        if not isinstance(rule, dict):
            raise TokenRefusedError(f"{where} must be an object")
        unknown = sorted(str(key) for key in rule if key not in ("permission", "action", "topic"))
        if unknown:
            raise TokenRefusedError(f"{where} has fields this node does not enforce: {unknown}")
        permission = _word(rule.get("permission"), {p.value: p for p in Permission})
        action = _word(rule.get("action"), ACTION_WORDS)
        topic = rule.get("topic")
        if permission is None or action is None or not isinstance(topic, str):
            raise TokenRefusedError(
                f"{where} needs permission allow|deny, action publish|subscribe|all and a topic"
            )
        if topic.startswith("eq "):
            raise TokenRefusedError(f"{where}: an 'eq' topic is not enforced by this node")
        for emqx, ours in _EMQX_PLACEHOLDERS:
            topic = topic.replace(emqx, ours)
        try:
            rules.append(AclRule(permission, action, topic, source="acl claim"))
        except AclRuleError as error:
            raise TokenRefusedError(f"{where}: {error.reason}") from None
    return Acl(rules, Permission.ALLOW)


def _word(given: object, meanings: Mapping[str, _T]) -> _T | None:
    """What ``given`` means among ``meanings`` (None: not one of their words)."""
    return meanings.get(given) if isinstance(given, str) else None


def looks_like_token(password: str | bytes | None) -> bool:
    """True if ``password`` parses as a JWT (three base64url parts, a JSON header)."""
    text = _text(password)
    if text is None or text.count(".") != 2:
        return False
    try:
        jwt.get_unverified_header(text)
    except jwt.PyJWTError:
        return False
    return True


class JwtAuthenticator:
    """The ``client.authenticate`` callback of a node and the ``acl`` claims it accepted
    (see the module docstring); :func:`install_jwt` wires one into a node."""

    def __init__(
        self,
        verifier: JwtVerifier,
        *,
        passwords: PasswordFile | None = None,
        allow_anonymous: bool = True,
        hooks: HookRegistry | None = None,
        on_claims: Callable[[], None] | None = None,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``hooks``: the registry this is registered in (to tell whether another
        callback follows it); ``on_claims`` is called once, when the first ``acl``
        claim is accepted, and ``on_change`` with the client id whenever the rules of a
        client change (its cached receive decisions must go)."""
        self.verifier = verifier
        self.passwords = passwords
        self.allow_anonymous = allow_anonymous
        self.hooks = hooks
        self.on_claims = on_claims
        self.on_change = on_change
        self._clock = clock
        self._claims: dict[ClientInfo, tuple[Acl, float]] = {}
        self._ends: list[tuple[float, str, str | None]] = []  # (expiry, client id, user)
        self.accepted = 0
        self.refused = 0

    def authenticate(
        self, client: ClientInfo, password: str | bytes | None, acc: Decision
    ) -> HookResult:
        """The ``client.authenticate`` callback."""
        if looks_like_token(password):
            assert password is not None
            try:
                token = self.verifier.verify(password, client.username)
            except TokenRefusedError as error:
                self.refused += 1
                return Stop(Decision.deny(f"token refused: {error.reason}"))
            self.accepted += 1
            self._keep(client, token.acl, token.expires_at)
            return Stop(Decision.allow("JWT", token.expires_at))
        if client.username is None and password is None:
            if self.allow_anonymous:
                return Stop(Decision.allow("anonymous"))
            return Stop(Decision.deny("a user name is required"))
        if self.passwords is not None:
            user = client.username
            if user is not None and password is not None and self.passwords.check(user, password):
                self._keep(client, None, 0.0)
                return Stop(Decision.allow("password file"))
            return Stop(Decision.deny("bad user name or password"))
        if self.hooks is not None and len(self.hooks.callbacks(HookPoint.CLIENT_AUTHENTICATE)) > 1:
            return None  # (another authenticator judges what is not a token)
        return Stop(Decision.deny("bad user name or password"))

    # -- the acl claims -------------------------------------------------------------

    def rules(self, client: ClientInfo) -> Acl | None:
        """The rules of the ``acl`` claim ``client`` connected with; None when it has
        none. They hold past the token's expiry (its connection is being closed) until
        the next accepted CONNECT of the client, or :data:`CLAIM_GRACE` seconds."""
        kept = self._claims.get(client)
        return None if kept is None else kept[0]

    def check_acl(
        self, client: ClientInfo, action: AclAction, topic: str, acc: Decision
    ) -> HookResult:
        """The ``client.check_acl`` callback: a claim that denies ends the chain; else the
        callbacks after it decide (allowed when there are none)."""
        acl = self.rules(client)
        if acl is not None:
            decision = acl.check(client, action, topic)
            if not decision.allowed:
                return Stop(Decision.deny(f"the token's acl claim: {decision.reason}"))
        if self.hooks is not None and len(self.hooks.callbacks(HookPoint.CLIENT_CHECK_ACL)) > 1:
            return None
        return Stop(Decision.allow("the token's acl claim" if acl is not None else "no ACL"))

    def receiver(self, client: ClientInfo) -> Callable[[str], bool] | None:
        """What ``client``'s claim lets it receive (the node's receive check asks)."""
        acl = self.rules(client)
        return None if acl is None else acl.receiver(client)

    def _keep(self, client: ClientInfo, acl: Acl | None, expires_at: float) -> None:
        """Remember (or forget) the claim of an accepted CONNECT; drop those whose token
        expired over :data:`CLAIM_GRACE` seconds ago (their connections have ended)."""
        now = self._clock() - CLAIM_GRACE
        while self._ends and self._ends[0][0] <= now:
            ends, client_id, username = heapq.heappop(self._ends)
            key = ClientInfo(client_id, username)
            kept = self._claims.get(key)
            if kept is not None and kept[1] == ends:
                del self._claims[key]
        if acl is None:
            if self._claims.pop(client, None) is None:
                return
        else:
            self._claims[client] = (acl, expires_at)
            heapq.heappush(self._ends, (expires_at, client.client_id, client.username))
            enforce = self.on_claims
            if enforce is not None:  # (the first claim: enforce them from now on)
                self.on_claims = None
                enforce()
        if self.on_change is not None:
            self.on_change(client.client_id)


def install_jwt(
    node: RouterNode,
    verifier: JwtVerifier,
    *,
    passwords: PasswordFile | None = None,
    allow_anonymous: bool = True,
) -> JwtAuthenticator:
    """Authenticate ``node``'s clients with ``verifier`` (and ``passwords`` for what is
    not a token); the ``acl`` claims are enforced from the first one accepted on."""

    def changed(client_id: str) -> None:
        session = node.sessions.find(client_id)
        if session is not None:
            session.rejudge()

    authenticator = JwtAuthenticator(
        verifier,
        passwords=passwords,
        allow_anonymous=allow_anonymous,
        hooks=node.hooks,
        on_change=changed,
    )

    def enforce_claims() -> None:
        node.hooks.register(HookPoint.CLIENT_CHECK_ACL, authenticator.check_acl, PRIORITY)
        node.narrow_receiving(authenticator.receiver)

    authenticator.on_claims = enforce_claims
    node.hooks.register(HookPoint.CLIENT_AUTHENTICATE, authenticator.authenticate, PRIORITY)
    return authenticator


# -- helpers ---------------------------------------------------------------------------------


def _text(token: str | bytes | None) -> str | None:
    if isinstance(token, bytes):
        try:
            return token.decode("ascii")
        except UnicodeDecodeError:
            return None
    return token


def _why(error: jwt.PyJWTError) -> str:
    """What a PyJWT error says, in the words of the checks (never the token)."""
    if isinstance(error, jwt.ExpiredSignatureError):
        return "expired"
    if isinstance(error, jwt.ImmatureSignatureError):
        return "not valid yet (nbf or iat in the future)"
    if isinstance(error, jwt.InvalidAlgorithmError):
        return "its algorithm is not allowed"
    if isinstance(error, jwt.InvalidSignatureError):
        return "bad signature"
    if isinstance(error, jwt.InvalidAudienceError):
        return "wrong audience"
    if isinstance(error, jwt.InvalidIssuerError):
        return "wrong issuer"
    if isinstance(error, jwt.MissingRequiredClaimError):
        return f"no {error.claim!r} claim"
    return f"invalid ({type(error).__name__}: {error})"


def _default_algorithm(key: PublicKey) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey):
        for name, curve in EC_ALGORITHMS.items():
            if key.curve.name == curve:
                return name
        raise JwtSettingError(f"no JWT algorithm for an EC key on {key.curve.name}")
    return "EdDSA"


def _check_algorithms(key: str | bytes | PublicKey, algorithms: Sequence[str]) -> None:
    """Raise :class:`JwtSettingError` unless every algorithm can check tokens with ``key``."""
    if isinstance(algorithms, str) or not algorithms:
        raise JwtSettingError("JWT algorithms are a non-empty list of names")
    for name in algorithms:
        if not isinstance(name, str) or name.lower() == "none":
            raise JwtSettingError(f"the JWT algorithm {name!r} is never allowed")
        if isinstance(key, str | bytes):
            shortest = HMAC_ALGORITHMS.get(name)
            if shortest is None:
                raise JwtSettingError(
                    f"a JWT secret checks HMAC tokens ({', '.join(HMAC_ALGORITHMS)}), not {name}"
                )
            size = len(key.encode() if isinstance(key, str) else key)
            if size < shortest:
                raise JwtSettingError(
                    f"a JWT secret for {name} needs at least {shortest} bytes, not {size}"
                )
        elif not _fits(key, name):
            raise JwtSettingError(f"the JWT public key ({_kind(key)}) cannot check {name} tokens")


def _fits(key: PublicKey, name: str) -> bool:
    if isinstance(key, rsa.RSAPublicKey):
        return name in RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey):
        return EC_ALGORITHMS.get(name) == key.curve.name
    return name == "EdDSA"


def _kind(key: PublicKey) -> str:
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    if isinstance(key, rsa.RSAPublicKey):
        return "RSA"
    return "Ed25519" if isinstance(key, ed25519.Ed25519PublicKey) else "Ed448"
