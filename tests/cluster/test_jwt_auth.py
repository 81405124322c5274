"""JWT authentication (router.cluster.jwt_auth): the verifier's checks, its settings, the
``acl`` claim, and the claim narrowing what a node's clients may do (a node in process)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from router import NotAuthorizedError
from router.cluster.jwt_auth import (
    CLAIM_GRACE,
    MAX_CLAIM_FILTERS,
    JwtAuthenticator,
    JwtVerifier,
    claim_acl,
    install_jwt,
    jwt_verifier,
    looks_like_token,
)
from router.cluster.policy import Policy
from router.core.acl import Acl, AclAction
from router.core.hooks import ClientInfo, Decision, HookPoint, HookRegistry, Stop
from router.core.passwords import HashType, PasswordFile, PasswordHash
from router.errors import JwtSettingError, TokenRefusedError
from tests.support.nodes import StartNode, take

SECRET = "a shared secret of 32 bytes or more"
ALICE = ClientInfo("alice-1", "alice")
PUBLISH, SUBSCRIBE = AclAction.PUBLISH, AclAction.SUBSCRIBE


def token(key: Any = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    """A token with ``claims`` (``exp`` one minute ahead unless given; None drops one)."""
    claims.setdefault("exp", time.time() + 60)
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, key, algorithm)


def refused(verifier: JwtVerifier, text: str, username: str | None = "alice") -> str:
    with pytest.raises(TokenRefusedError) as caught:
        verifier.verify(text, username)
    return caught.value.reason


def pem(key: Any) -> bytes:
    public: bytes = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return public


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def rsa_file(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> Path:
    path = tmp_path / "rsa.pem"
    path.write_bytes(pem(rsa_key))
    return path


# -- the verifier ------------------------------------------------------------------------


def test_a_good_token_is_accepted_until_exp_and_the_leeway() -> None:
    verifier = JwtVerifier.from_secret(SECRET, leeway=5)
    exp = int(time.time()) + 60
    accepted = verifier.verify(token(sub="alice", exp=exp), "alice")
    assert accepted.expires_at == exp + 5
    assert accepted.claims["sub"] == "alice" and accepted.acl is None
    assert verifier.verify(token(sub="alice", exp=exp).encode(), "alice").expires_at == exp + 5


def test_an_expired_token_is_refused_past_the_leeway() -> None:
    assert refused(JwtVerifier.from_secret(SECRET), token(sub="alice", exp=time.time() - 10)) == (
        "expired"
    )
    lenient = JwtVerifier.from_secret(SECRET, leeway=30)
    assert (
        lenient.verify(token(sub="alice", exp=time.time() - 10), "alice").expires_at > time.time()
    )
    assert refused(lenient, token(sub="alice", exp=None)) == "no 'exp' claim"
    assert "invalid" in refused(lenient, token(sub="alice", exp="soon"))


def test_signature_and_algorithm() -> None:
    verifier = JwtVerifier.from_secret(SECRET)
    assert refused(verifier, token("another secret of 32 bytes or more", sub="alice")) == (
        "bad signature"
    )
    assert refused(verifier, token(None, "none", sub="alice")) == "its algorithm is not allowed"
    long_secret = SECRET * 2
    both = JwtVerifier.from_secret(long_secret, ["HS256"])
    assert refused(both, token(long_secret, "HS512", sub="alice")) == "its algorithm is not allowed"
    assert JwtVerifier.from_secret(long_secret, ["HS256", "HS512"]).verify(
        token(long_secret, "HS512", sub="alice"), "alice"
    )
    tampered = token(sub="alice").split(".")
    tampered[1] = token(sub="mallory").split(".")[1]
    assert refused(verifier, ".".join(tampered), "mallory") == "bad signature"


def test_audience_issuer_nbf_and_iat() -> None:
    verifier = JwtVerifier.from_secret(SECRET, audience="mqtt", issuer="https://idp", leeway=0)
    good = {"sub": "alice", "aud": ["mqtt", "web"], "iss": "https://idp"}
    assert verifier.verify(token(**good), "alice")
    assert refused(verifier, token(**{**good, "aud": "web"})) == "wrong audience"
    assert refused(verifier, token(**{**good, "iss": "https://other"})) == "wrong issuer"
    assert refused(verifier, token(**{**good, "iss": None})) == "no 'iss' claim"
    future = time.time() + 30
    assert "not valid yet" in refused(verifier, token(**good, nbf=future))
    assert "not valid yet" in refused(verifier, token(**good, iat=future))
    assert verifier.verify(token(**good, nbf=time.time() - 1, iat=time.time() - 1), "alice")
    plain = JwtVerifier.from_secret(SECRET)  # (no audience named: a token with one is refused)
    assert refused(plain, token(sub="alice", aud="mqtt")) == "wrong audience"


def test_the_user_name_claim_must_be_the_connect_user_name() -> None:
    verifier = JwtVerifier.from_secret(SECRET)
    assert refused(verifier, token(sub="bob"), "alice") == "its 'sub' claim is not the user name"
    assert refused(verifier, token(), "alice") == "its 'sub' claim is not the user name"
    assert verifier.verify(token(sub="bob"), None)  # (no user name: the token alone)
    custom = JwtVerifier.from_secret(SECRET, username_claim="username")
    assert custom.verify(token(sub="x", username="alice"), "alice")
    assert "'username' claim" in refused(custom, token(sub="alice"), "alice")


def test_public_keys(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, rsa_file: Path) -> None:
    verifier = JwtVerifier.from_public_key(rsa_file)
    assert verifier.algorithms == ("RS256",)
    assert verifier.verify(token(rsa_key, "RS256", sub="alice"), "alice")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refused(verifier, token(other, "RS256", sub="alice")) == "bad signature"
    # The public key's text used as an HMAC secret (algorithm confusion) is refused.
    confused = jwt.api_jws.PyJWS()
    forged = confused.encode(b'{"sub":"alice","exp":9999999999}', b"x" * 32, "HS256")
    assert refused(verifier, forged) == "its algorithm is not allowed"
    for curve, algorithm in ((ec.SECP256R1(), "ES256"), (ec.SECP384R1(), "ES384")):
        key = ec.generate_private_key(curve)
        path = tmp_path / f"{algorithm}.pem"
        path.write_bytes(pem(key))
        verifier = JwtVerifier.from_public_key(path)
        assert verifier.algorithms == (algorithm,)
        assert verifier.verify(token(key, algorithm, sub="alice"), "alice")
        assert "public key" in verifier.describe() and SECRET not in verifier.describe()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "one of a secret and a public key"),
        ({"secret": SECRET, "public_key": "k.pem"}, "one of a secret and a public key"),
        ({"secret": "short"}, "at least 32 bytes, not 5"),
        ({"secret": SECRET, "algorithms": "HS512"}, "at least 64 bytes"),
        ({"secret": SECRET, "algorithms": "none"}, "'none' is never allowed"),
        ({"secret": SECRET, "algorithms": "HS256,NONE"}, "never allowed"),
        ({"secret": SECRET, "algorithms": "RS256"}, "checks HMAC tokens"),
        ({"secret": SECRET, "algorithms": " , "}, "no JWT algorithm"),
        ({"secret": SECRET, "leeway": -1}, "leeway"),
        ({"secret": SECRET, "audience": ""}, "audience"),
        ({"secret": SECRET, "username_claim": ""}, "claim"),
    ],
)
def test_bad_settings_are_typed_errors(options: dict[str, Any], expected: str) -> None:
    with pytest.raises(JwtSettingError, match=expected):
        jwt_verifier(**options)


def test_bad_key_files_are_typed_errors(tmp_path: Path, rsa_file: Path) -> None:
    with pytest.raises(JwtSettingError, match="cannot read the JWT public key"):
        jwt_verifier(public_key=tmp_path / "missing.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    with pytest.raises(JwtSettingError, match="not a PEM public key or certificate"):
        jwt_verifier(public_key=junk)
    with pytest.raises(JwtSettingError, match=r"\(RSA\) cannot check ES256"):
        jwt_verifier(public_key=rsa_file, algorithms="RS256,ES256")
    with pytest.raises(JwtSettingError, match="cannot check HS256"):
        jwt_verifier(public_key=rsa_file, algorithms="HS256")


def test_which_passwords_are_tokens() -> None:
    assert looks_like_token(token()) and looks_like_token(token().encode())
    for password in (None, "", "wonder land", "a.b.c", b"\xff.\xfe.\xfd", "x." + token()):
        assert not looks_like_token(password)


# -- the acl claim -----------------------------------------------------------------------


def test_the_acl_claim_is_an_allow_list() -> None:
    acl = claim_acl({"pub": ["a/#", "%c/out"], "sub": ["${username}/in/#"], "all": ["both/+"]})
    allowed = {
        (action, topic)
        for action in (PUBLISH, SUBSCRIBE)
        for topic in ("a/x", "alice-1/out", "alice/in/1", "both/x", "b/x")
        if acl.check(ALICE, action, topic).allowed
    }
    assert allowed == {
        (PUBLISH, "a/x"),
        (PUBLISH, "alice-1/out"),
        (PUBLISH, "both/x"),
        (SUBSCRIBE, "alice/in/1"),
        (SUBSCRIBE, "both/x"),
    }
    assert acl.check_receive(ALICE, "alice/in/1").allowed
    assert not acl.check_receive(ALICE, "a/x").allowed  # (pub does not govern receiving)
    assert claim_acl({}).check(ALICE, PUBLISH, "a").allowed is False  # (empty: nothing)
    nameless = ClientInfo("c", None)  # (%u without a user name never allows)
    assert not claim_acl({"all": ["%u/#"]}).check(nameless, PUBLISH, "x/y").allowed


def test_the_list_form_decides_by_its_first_matching_rule_and_leaves_the_rest() -> None:
    acl = claim_acl(
        [
            {"permission": "allow", "action": "publish", "topic": "t/${clientid}"},
            {"permission": "deny", "action": "publish", "topic": "t/#"},
            {"permission": "deny", "action": "all", "topic": "secret/#"},
            {"permission": "allow", "action": "subscribe", "topic": "${username}/#"},
            {"permission": "deny", "action": "subscribe", "topic": "#"},
        ]
    )
    judged = {
        (action, topic): acl.check(ALICE, action, topic).allowed
        for action in (PUBLISH, SUBSCRIBE)
        for topic in ("t/alice-1", "t/other", "secret/x", "alice/in", "public/x")
    }
    assert judged == {
        (PUBLISH, "t/alice-1"): True,  # (the first rule, before the deny of t/#)
        (PUBLISH, "t/other"): False,
        (PUBLISH, "secret/x"): False,
        (PUBLISH, "alice/in"): True,  # (no rule: the node's ACL decides)
        (PUBLISH, "public/x"): True,
        (SUBSCRIBE, "t/alice-1"): False,
        (SUBSCRIBE, "t/other"): False,
        (SUBSCRIBE, "secret/x"): False,
        (SUBSCRIBE, "alice/in"): True,
        (SUBSCRIBE, "public/x"): False,
    }
    assert not acl.check_receive(ALICE, "secret/x").allowed
    assert claim_acl([]).check(ALICE, PUBLISH, "a").allowed  # (no rule: left to the node)


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        ("allow", "must be"),
        ([{"permission": "allow"}], "rule 1 needs permission"),
        ([{"permission": "allow", "action": ["publish"], "topic": "a"}], "rule 1 needs"),
        ([{"permission": ["allow"], "action": "publish", "topic": "a"}], "rule 1 needs"),
        (["deny all"], "rule 1 must be an object"),
        ([{"permission": "allow", "action": "subscribe", "topic": "t/#", "qos": [1]}], "qos"),
        ([{"permission": "deny", "action": "publish", "topic": "t", "retain": True}], "retain"),
        ([{"permission": "allow", "action": "all", "topic": "eq t/#"}], "'eq' topic"),
        ([{"permission": "deny", "action": "all", "topic": "a/#/b"}], "rule 1: bad topic"),
        ([{"permission": "deny", "action": "all", "topic": "t"}] * 129, "over 128 rules"),
        ({"publish": ["a"]}, "unknown keys"),
        ({"pub": "a/#"}, "must be a list"),
        ({"pub": [1]}, "must be a list"),
        ({"sub": ["a/#/b"]}, "'sub': bad topic filter"),
        ({"sub": ["$share/g/a"]}, "'sub'"),
        ({"all": [f"t/{n}" for n in range(MAX_CLAIM_FILTERS + 1)]}, "over 128 filters"),
    ],
)
def test_a_bad_acl_claim_refuses_the_token(claim: Any, expected: str) -> None:
    with pytest.raises(TokenRefusedError, match=expected):
        claim_acl(claim)
    assert expected in refused(JwtVerifier.from_secret(SECRET), token(sub="alice", acl=claim))


# -- the authenticator and the ACL hooks -------------------------------------------------


async def authenticate(policy: Policy, client: ClientInfo, password: str | None) -> Decision:
    try:
        return (await policy.credentials(client.client_id, client.username, password))[1]
    except NotAuthorizedError as error:
        return Decision.deny(error.reason)


async def test_tokens_passwords_and_anonymous_clients() -> None:
    passwords = PasswordFile({"bob": PasswordHash.create("b0b", HashType.SHA512)})
    hooks = HookRegistry()
    policy = Policy(hooks)
    auth = JwtAuthenticator(JwtVerifier.from_secret(SECRET), passwords=passwords, hooks=hooks)
    hooks.register(HookPoint.CLIENT_AUTHENTICATE, auth.authenticate)
    accepted = await authenticate(policy, ALICE, token(sub="alice", exp=1e10))
    assert accepted == Decision.allow("JWT", 1e10 + 5)
    bad = await authenticate(policy, ALICE, token(sub="alice", exp=1))
    assert bad == Decision.deny("token refused: expired")
    assert (auth.accepted, auth.refused) == (1, 1)
    assert not (await authenticate(policy, ClientInfo("b", "bob"), "wrong")).allowed
    assert await authenticate(policy, ClientInfo("b", "bob"), "b0b") == Decision.allow(
        "password file"
    )
    assert (await authenticate(policy, ClientInfo("anon"), None)).allowed
    auth.allow_anonymous = False
    assert not (await authenticate(policy, ClientInfo("anon"), None)).allowed


async def test_another_authenticator_judges_what_is_not_a_token() -> None:
    hooks = HookRegistry()
    policy = Policy(hooks)
    auth = JwtAuthenticator(JwtVerifier.from_secret(SECRET), hooks=hooks)
    hooks.register(HookPoint.CLIENT_AUTHENTICATE, auth.authenticate, 100)
    assert not (await authenticate(policy, ALICE, "plain")).allowed  # (alone: refused)
    hooks.register(HookPoint.CLIENT_AUTHENTICATE, lambda c, p, acc: Stop(Decision.allow("other")))
    assert await authenticate(policy, ALICE, "plain") == Decision.allow("other")
    forged = token("another secret of 32 bytes or more", sub="alice")
    assert not (await authenticate(policy, ALICE, forged)).allowed  # (a token: never passed on)


async def test_a_claim_only_narrows_the_configured_acl() -> None:
    """The node's ACL allows a/# and b/#; the claim allows a/# and c/#: only a/# is left."""
    hooks = HookRegistry()
    configured = Acl.parse("allow all all a/#\nallow all all b/#\n")
    policy = Policy(hooks, configured)
    auth = JwtAuthenticator(JwtVerifier.from_secret(SECRET), hooks=hooks)
    hooks.register(HookPoint.CLIENT_AUTHENTICATE, auth.authenticate, 100)
    hooks.register(HookPoint.CLIENT_CHECK_ACL, auth.check_acl, 100)
    bob = ClientInfo("bob-1", "bob")
    assert (
        await authenticate(policy, ALICE, token(sub="alice", acl={"all": ["a/#", "c/#"]}))
    ).allowed
    assert (await authenticate(policy, bob, token(sub="bob"))).allowed
    for client, expected in ((ALICE, {"a/x"}), (bob, {"a/x", "b/x"})):
        for action in (PUBLISH, SUBSCRIBE):
            allowed = {
                t for t in ("a/x", "b/x", "c/x") if (await policy.check(client, action, t)).allowed
            }
            assert allowed == expected, (client, action)
    denial = await policy.check(ALICE, PUBLISH, "b/x")
    assert denial.reason.startswith("the token's acl claim: denied")
    # A refused CONNECT changes nothing; an accepted one without the claim lifts it.
    assert not (await authenticate(policy, ALICE, token("x" * 32, sub="alice"))).allowed
    assert not (await policy.check(ALICE, PUBLISH, "b/x")).allowed
    assert (await authenticate(policy, ALICE, token(sub="alice"))).allowed
    assert (await policy.check(ALICE, PUBLISH, "b/x")).allowed


async def test_without_a_configured_acl_the_claim_alone_judges() -> None:
    hooks = HookRegistry()
    policy = Policy(hooks)
    clock = [1000.0]
    auth = JwtAuthenticator(JwtVerifier.from_secret(SECRET), hooks=hooks, clock=lambda: clock[0])
    hooks.register(HookPoint.CLIENT_CHECK_ACL, auth.check_acl, 100)
    assert (await policy.check(ALICE, PUBLISH, "b/x")).allowed  # (no claim, no ACL: allowed)
    auth._keep(ALICE, claim_acl({"pub": ["a/#"]}), 1010.0)
    assert (await policy.check(ALICE, PUBLISH, "a/x")).allowed
    assert not (await policy.check(ALICE, PUBLISH, "b/x")).allowed
    assert auth.receiver(ALICE) is not None and auth.receiver(ClientInfo("other")) is None
    clock[0] = 1011.0  # (expired: the claim holds while its connection closes)
    assert auth.rules(ALICE) is not None
    clock[0] = 1010.0 + CLAIM_GRACE  # (then it is forgotten at the next accepted claim)
    auth._keep(ClientInfo("c2", "carol"), claim_acl({}), 2000.0)
    assert set(auth._claims) == {ClientInfo("c2", "carol")}


# -- a node in process (fakeredis) ---------------------------------------------------------


@pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)
async def test_a_node_enforces_the_claim_on_publish_subscribe_and_receive(
    start_node: StartNode,
) -> None:
    node = await start_node("n1")
    auth = install_jwt(node, JwtVerifier.from_secret(SECRET))
    await node.connect("plain", "bob", token(sub="bob"), expiry=0)
    assert not node.hooks.active(HookPoint.CLIENT_CHECK_ACL)  # (no claim yet: no hook)
    claim = {"pub": ["a/#"], "sub": ["a/#", "%u/#"]}
    await node.connect("narrow", "alice", token(sub="alice", acl=claim))
    assert auth.rules(ClientInfo("narrow", "alice")) is not None
    assert node.hooks.active(HookPoint.CLIENT_CHECK_ACL)
    with pytest.raises(NotAuthorizedError):
        await node.publish("b/x", b"no", publisher="narrow")
    with pytest.raises(NotAuthorizedError):
        await node.subscribe("narrow", "b/#")
    await node.subscribe("narrow", "#")  # (granted: some of its topics may be received)
    await node.subscribe("plain", "#")
    for topic in ("b/x", "alice/x", "a/x"):
        await node.publish(topic, topic.encode(), publisher="plain")
    assert [d.topic for d in await take(node, "narrow", 2)] == ["alice/x", "a/x"]
    assert [d.topic for d in await take(node, "plain", 3)] == ["b/x", "alice/x", "a/x"]
    assert node.stats()["acl_denied_deliveries"] == 1
    with pytest.raises(NotAuthorizedError):
        await node.connect("narrow", "alice", token("x" * 32, sub="alice"))
    await node.connect("narrow", "alice", token(sub="alice"))  # (the claim is lifted)
    await node.publish("b/y", b"now", publisher="plain")
    assert [d.topic for d in await take(node, "narrow", 1)] == ["b/y"]
