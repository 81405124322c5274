"""The built-in ACL: decisions, substitution, the file format, the hook, and the
subscribe check's search against a brute-force model (mosquitto's semantics: a
subscription is refused only where every topic it can match is denied)."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from router.core.acl import Acl, AclAction, AclRule, Permission, parse_rules
from router.core.acl_search import Pattern, search
from router.core.hooks import ClientInfo, Decision, HookPoint, HookRegistry, Ok, Stop
from router.core.topics import TopicName, filter_matches_levels, validate_filter
from router.errors import AclRuleError, DuplicateHookError, InvalidTopicError, RouterError

ALLOW, DENY = Permission.ALLOW, Permission.DENY
PUB, SUB = AclAction.PUBLISH, AclAction.SUBSCRIBE

ALICE = ClientInfo("dev-1", "alice")
BOB = ClientInfo("dev-2", "bob")
ANON = ClientInfo("anon-7")

ACL_TEXT = """\
# sensors: each user publishes under its own name
allow user alice publish sensors/%u/#
allow all publish devices/%c/out

  # dashboards read everything but secrets
deny all subscribe secrets/#
allow client dash-1 subscribe #
allow all subscribe public/#
allow all subscribe sensors/+/temp
deny all all $SYS/#
allow all all room/with space/+
"""

TABLE = [
    # (client, action, topic or filter, allowed)
    (ALICE, PUB, "sensors/alice", True),  # '#' takes the parent level
    (ALICE, PUB, "sensors/alice/t", True),
    (ALICE, PUB, "sensors/bob/t", False),
    (BOB, PUB, "sensors/bob/t", False),  # the rule is alice's only
    (BOB, PUB, "devices/dev-2/out", True),
    (BOB, PUB, "devices/dev-1/out", False),
    (ANON, PUB, "devices/anon-7/out", True),
    (ALICE, SUB, "public/news", True),
    (ALICE, SUB, "public/#", True),
    (ALICE, SUB, "$share/g/public/+", True),  # checked on its filter part
    (ALICE, SUB, "$share/g/secrets/x", False),
    (ALICE, SUB, "public", True),  # public/# covers the topic "public"
    (ALICE, SUB, "#", True),  # public/x may be received
    (ALICE, SUB, "+/news", True),  # public/news
    (ALICE, SUB, "sensors/+/temp", True),
    (ALICE, SUB, "sensors/alice/temp", True),
    (ALICE, SUB, "sensors/+/+", True),  # sensors/x/temp
    (ALICE, SUB, "sensors/#", True),
    (ALICE, SUB, "sensors/+/hum", False),  # the default denies all of it
    (ALICE, SUB, "secrets/#", False),
    (ALICE, SUB, "secrets/x", False),
    (ClientInfo("dash-1"), SUB, "#", True),  # (secrets/x is denied on delivery)
    (ClientInfo("dash-1"), SUB, "site/+/x", True),
    (ClientInfo("dash-1"), SUB, "$SYS/broker", False),  # '#' does not cover '$' topics
    (ALICE, PUB, "$SYS/x", False),
    (ALICE, SUB, "room/with space/+", True),
    (ALICE, PUB, "room/with space/1", True),
    (ALICE, PUB, "unlisted", False),  # the default
]


@pytest.fixture(scope="module")
def acl() -> Acl:
    return Acl.parse(ACL_TEXT, "acl.conf")


@pytest.mark.parametrize(("client", "action", "topic", "allowed"), TABLE)
def test_decisions(
    acl: Acl, client: ClientInfo, action: AclAction, topic: str, allowed: bool
) -> None:
    decision = acl.check(client, action, topic)
    assert decision.allowed is allowed, decision.reason
    if action is PUB:
        assert acl.check_publish(client, topic) == decision
    else:
        assert acl.check_subscribe(client, topic) == decision


def test_reasons_name_the_rule_and_its_line(acl: Acl) -> None:
    decision = acl.check_publish(ALICE, "sensors/alice/t")
    assert decision == Decision(
        True, "allowed by rule (acl.conf:2): allow user alice publish sensors/%u/#"
    )
    assert acl.check_subscribe(ALICE, "secrets/a").reason.startswith("denied by rule (acl.conf:6)")
    assert acl.check_publish(ALICE, "unlisted").reason == "denied: no rule matched"
    assert acl.first_match(ALICE, PUB, "unlisted") is None
    assert acl.first_match(ALICE, PUB, "devices/dev-1/out") == acl.rules[1]


def test_the_default_is_configurable() -> None:
    rules = [AclRule(DENY, AclAction.ALL, "private/#")]
    open_acl = Acl(rules, default=ALLOW)
    assert open_acl.check_publish(ALICE, "anything").allowed
    assert open_acl.check_subscribe(ALICE, "#").allowed  # (private/x is kept out on delivery)
    assert open_acl.check_subscribe(ALICE, "private/+/x").allowed is False
    assert open_acl.check_subscribe(ALICE, "public/#").allowed
    assert Acl(rules).check_publish(ALICE, "anything").allowed is False
    assert Acl().default is DENY


def test_first_match_wins() -> None:
    rules = parse_rules("deny all publish a/b\nallow all publish a/+\n")
    assert Acl(rules).check_publish(ALICE, "a/b").allowed is False
    assert Acl(rules).check_publish(ALICE, "a/c").allowed is True
    assert Acl(reversed(rules)).check_publish(ALICE, "a/b").allowed is True


def test_actions_of_a_rule() -> None:
    acl = Acl(
        [AclRule(ALLOW, PUB, "p/#"), AclRule(ALLOW, SUB, "s/#"), AclRule(ALLOW, AclAction.ALL, "b")]
    )
    assert acl.check_publish(ALICE, "p/1").allowed
    assert not acl.check_subscribe(ALICE, "p/1").allowed
    assert acl.check_subscribe(ALICE, "s/1").allowed
    assert not acl.check_publish(ALICE, "s/1").allowed
    assert acl.check_publish(ALICE, "b").allowed and acl.check_subscribe(ALICE, "b").allowed
    with pytest.raises(AclRuleError):
        acl.check(ALICE, AclAction.ALL, "b")


# -- substitution -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "topic", "allowed"),
    [
        (ClientInfo("c1", "u1"), "home/u1/c1/x", True),
        (ClientInfo("c1", "u1"), "home/u1/c2/x", False),
        (ClientInfo("c1", "u1"), "home/u2/c1/x", False),
        (ClientInfo("c/1", "u1"), "home/u1/c/1/x", False),  # '/' would redirect the rule
        (ClientInfo("+", "u1"), "home/u1/anything/x", False),  # '+' would widen it
        (ClientInfo("#", "u1"), "home/u1/anything/x", False),
        (ClientInfo("c1", "+"), "home/anyone/c1/x", False),
        (ClientInfo("c1", "a/b"), "home/a/b/c1/x", False),
        (ClientInfo("c1", "$SYS"), "home/$SYS/c1/x", False),  # a '$' value is unsafe too
        (ClientInfo("c1"), "home/None/c1/x", False),  # no username: the rule cannot apply
        (ClientInfo("%u", "u1"), "home/u1/%u/x", True),  # one pass: no second substitution
        (ClientInfo("%u", "u1"), "home/u1/u1/x", False),
    ],
)
def test_substitution(client: ClientInfo, topic: str, allowed: bool) -> None:
    acl = Acl([AclRule(ALLOW, AclAction.ALL, "home/%u/%c/#")])
    assert acl.check_publish(client, topic).allowed is allowed
    assert acl.check_subscribe(client, topic).allowed is allowed


def test_substitution_inside_a_level() -> None:
    acl = Acl([AclRule(ALLOW, PUB, "dev-%c/x")])
    assert acl.check_publish(ClientInfo("7"), "dev-7/x").allowed
    assert not acl.check_publish(ClientInfo("7"), "dev-8/x").allowed


def test_an_unsafe_substitution_in_a_deny_rule_fails_closed() -> None:
    acl = Acl([AclRule(DENY, AclAction.ALL, "private/%c/#"), AclRule(ALLOW, AclAction.ALL, "#")])
    assert acl.check_publish(ClientInfo("a"), "private/b/x").allowed
    assert not acl.check_publish(ClientInfo("a"), "private/a/x").allowed
    # A client named '+' cannot turn the deny into a no-op: it is denied at that rule.
    sneaky = ClientInfo("+")
    assert not acl.check_publish(sneaky, "private/b/x").allowed
    assert not acl.check_publish(sneaky, "elsewhere").allowed
    assert "private/%c/#" in acl.check_subscribe(sneaky, "x").reason


def test_subject_rules() -> None:
    acl = Acl(
        [
            AclRule(ALLOW, PUB, "u/#", username="alice"),
            AclRule(ALLOW, PUB, "c/#", client_id="dev-2"),
        ]
    )
    assert acl.check_publish(ALICE, "u/1").allowed
    assert not acl.check_publish(BOB, "u/1").allowed
    assert not acl.check_publish(ANON, "u/1").allowed
    assert acl.check_publish(BOB, "c/1").allowed
    assert not acl.check_publish(ALICE, "c/1").allowed


def test_invalid_requests_raise(acl: Acl) -> None:
    with pytest.raises(InvalidTopicError):
        acl.check_publish(ALICE, "a/+")
    with pytest.raises(InvalidTopicError):
        acl.check_subscribe(ALICE, "a/#/b")


# -- the file format ----------------------------------------------------------------------


def test_file_round_trip_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "acl.conf"
    path.write_text(ACL_TEXT, encoding="utf-8")
    acl = Acl.from_file(path)
    assert len(acl.rules) == 8
    assert [str(rule) for rule in acl.rules] == [
        line.strip()
        for line in ACL_TEXT.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert acl.rules[0] == AclRule(ALLOW, PUB, "sensors/%u/#", username="alice")
    assert acl.rules[0].source == f"{path}:2"
    assert acl.rules[-1].topic_filter == "room/with space/+"


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("allow", "expected"),
        ("allow all", "expected"),
        ("permit all publish a", "'allow' or 'deny'"),
        ("allow everyone publish a", "subject"),
        ("allow user publish a", "action and a topic filter"),
        ("allow user alice publish", "action and a topic filter"),
        ("allow all read a", "'publish', 'subscribe' or 'all'"),
        ("allow all publish a/#/b", "bad topic filter"),
        ("allow all publish a+", "bad topic filter"),
        ("allow all subscribe $share/g/a", "$share"),
        ("deny client c1", "needs a name"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path: Path, line: str, fragment: str) -> None:
    path = tmp_path / "acl.conf"
    path.write_text(f"# header\n\nallow all publish ok/#\n{line}\n", encoding="utf-8")
    with pytest.raises(AclRuleError) as caught:
        Acl.from_file(path)
    error = caught.value
    assert isinstance(error, RouterError)
    assert isinstance(error, ValueError)
    assert (error.path, error.line) == (str(path), 4)
    assert str(error).startswith(f"{path}:4: ")
    assert fragment in error.reason


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(AclRuleError, match="cannot read"):
        Acl.from_file(tmp_path / "missing.conf")
    bad = tmp_path / "latin1.conf"
    bad.write_bytes(b"allow all publish caf\xe9\n")
    with pytest.raises(AclRuleError, match="cannot read"):
        Acl.from_file(bad)


def test_rules_built_in_code_check_themselves() -> None:
    with pytest.raises(AclRuleError):
        AclRule(ALLOW, PUB, "a", username="u", client_id="c")
    with pytest.raises(AclRuleError):
        AclRule("allow", PUB, "a")  # type: ignore[arg-type]
    with pytest.raises(AclRuleError):
        AclRule(ALLOW, AclAction(0), "a")
    with pytest.raises(AclRuleError):
        AclRule(ALLOW, PUB, "")
    with pytest.raises(AclRuleError):
        AclRule(ALLOW, PUB, "a", username="")
    with pytest.raises(AclRuleError):
        Acl(["allow all publish a"])  # type: ignore[list-item]
    with pytest.raises(AclRuleError):
        Acl([], default="allow")  # type: ignore[arg-type]


# -- the hook ---------------------------------------------------------------------------


def test_the_acl_as_a_check_acl_hook(acl: Acl) -> None:
    registry = HookRegistry()
    acl.register(registry, priority=10)
    with pytest.raises(DuplicateHookError):
        acl.register(registry)
    point = HookPoint.CLIENT_CHECK_ACL
    start = Decision.deny("nobody answered")
    allowed = registry.run_fold(point, (ALICE, PUB, "sensors/alice/1"), start)
    assert allowed.allowed and "acl.conf:2" in allowed.reason
    denied = registry.run_fold(point, (ALICE, SUB, "secrets/#"), start)
    assert not denied.allowed and "acl.conf:6" in denied.reason
    assert registry.run_fold(point, (ALICE, PUB, "unlisted"), start) == Decision.deny(
        "denied: no rule matched"
    )
    assert acl.hook(ALICE, PUB, "unlisted", start) == Ok(Decision.deny("denied: no rule matched"))
    assert isinstance(acl.hook(ALICE, PUB, "sensors/alice", start), Stop)


def test_a_lower_priority_hook_decides_when_no_rule_matches(acl: Acl) -> None:
    registry = HookRegistry()
    acl.register(registry, priority=10)
    registry.register(
        HookPoint.CLIENT_CHECK_ACL,
        lambda client, action, topic, acc: Ok(Decision.allow("plugin")) if topic == "x" else None,
    )
    point = HookPoint.CLIENT_CHECK_ACL
    start = Decision.deny("nobody answered")
    assert registry.run_fold(point, (ALICE, PUB, "x"), start) == Decision.allow("plugin")
    assert not registry.run_fold(point, (ALICE, PUB, "y"), start).allowed
    # A matching rule stops the chain: the plugin is not asked.
    assert not registry.run_fold(point, (ALICE, PUB, "$SYS/x"), start).allowed
    assert acl.unregister(registry) is True
    assert registry.run_fold(point, (ALICE, PUB, "x"), start) == Decision.allow("plugin")


def test_an_invalid_topic_in_the_hook_keeps_the_initial_decision(acl: Acl) -> None:
    registry = HookRegistry()
    acl.register(registry)
    start = Decision.deny("nobody answered")
    assert registry.run_fold(HookPoint.CLIENT_CHECK_ACL, (ALICE, PUB, "a/#"), start) == start


# -- mosquitto's semantics: subscribe when anything may be received, receive per topic -----

SEMANTICS = [
    # (rules, default, filter, granted)
    ("deny all subscribe test/nosubscribe", ALLOW, "#", True),
    ("deny all subscribe test/nosubscribe", ALLOW, "+/+", True),
    ("deny all subscribe test/nosubscribe", ALLOW, "test/#", True),
    ("deny all subscribe test/nosubscribe", ALLOW, "test/+", True),
    ("deny all subscribe test/nosubscribe", ALLOW, "test/nosubscribe", False),
    ("deny all subscribe test/nosubscribe", ALLOW, "$share/g/test/nosubscribe", False),
    ("deny all publish test/nosubscribe", ALLOW, "test/nosubscribe", True),  # not receiving
    ("allow all subscribe a/#", DENY, "#", True),
    ("allow all subscribe a/#", DENY, "+", True),  # the topic "a"
    ("allow all subscribe a/#", DENY, "b/#", False),
    ("allow all subscribe a/#", DENY, "$SYS/#", False),
    ("allow all subscribe $SYS/#", DENY, "#", False),  # '#' takes no '$' topic
    ("deny all all secrets/#", ALLOW, "secrets/#", False),
    ("deny all all secrets/#", ALLOW, "secrets/x", False),
    ("deny all all secrets/#", ALLOW, "secrets", False),  # '#' takes the parent level
    ("deny all all secrets/#", ALLOW, "#", True),
    ("deny all all secrets/#", ALLOW, "+/x", True),
    ("deny all subscribe +/+\ndeny all subscribe +", ALLOW, "#", True),  # a/b/c
    ("deny all subscribe +/+\ndeny all subscribe +", ALLOW, "+/#", True),
    ("deny all subscribe +/+\ndeny all subscribe +", ALLOW, "+/+", False),
    ("deny all subscribe #", ALLOW, "$SYS/x", True),  # '#' takes no '$' topic
    ("deny all subscribe a/b\nallow all subscribe a/+", DENY, "a/b", False),  # first match
    ("deny all subscribe a/b\nallow all subscribe a/+", DENY, "a/#", True),  # a/c
    ("allow all subscribe a/+\ndeny all subscribe a/b", DENY, "a/b", True),
    ("deny all subscribe a/+\nallow all subscribe a/b/#", DENY, "a/#", True),  # a/b/c
    ("deny all subscribe a/#\nallow all subscribe a/b/#", DENY, "a/#", False),
    ("deny client other subscribe #", DENY, "#", False),  # another's rule: the default
    ("deny client c1 subscribe #\nallow all subscribe #", DENY, "x", False),
    ("deny all subscribe private/%c/#", ALLOW, "private/c1/x", False),
    ("deny all subscribe private/%c/#", ALLOW, "private/c2/x", True),
    ("allow all subscribe home/%u/#", DENY, "home/+/x", True),  # home/u1/x
    ("allow all subscribe home/%u/#", DENY, "home/u2/#", False),
]


@pytest.mark.parametrize(("rules", "default", "topic_filter", "granted"), SEMANTICS)
def test_a_subscription_is_refused_only_where_every_topic_is_denied(
    rules: str, default: Permission, topic_filter: str, granted: bool
) -> None:
    acl = Acl.parse(rules, "acl.conf", default)
    decision = acl.check_subscribe(ClientInfo("c1", "u1"), topic_filter)
    assert decision.allowed is granted, decision.reason


RECEIVE = [
    # (rules, default, topic, received)
    ("deny all subscribe test/nosubscribe", ALLOW, "test/nosubscribe", False),
    ("deny all subscribe test/nosubscribe", ALLOW, "test/other", True),
    ("deny all publish test/nosubscribe", ALLOW, "test/nosubscribe", True),
    ("deny all all secrets/#", ALLOW, "secrets", False),
    ("deny all all secrets/#", ALLOW, "secret", True),
    ("allow all subscribe a/#", DENY, "a/b", True),
    ("allow all subscribe a/#", DENY, "b", False),
    ("allow all subscribe #", DENY, "$SYS/x", False),
    ("deny all subscribe a/b\nallow all subscribe a/+", DENY, "a/b", False),
    ("deny all subscribe private/%c/#", ALLOW, "private/c1", False),
    ("deny all subscribe private/%u/#", ALLOW, "private/u1/x", False),
    ("deny user u2 subscribe x", ALLOW, "x", True),
]


@pytest.mark.parametrize(("rules", "default", "topic", "received"), RECEIVE)
def test_receiving_is_judged_on_each_topic_by_the_subscribe_rules(
    rules: str, default: Permission, topic: str, received: bool
) -> None:
    acl = Acl.parse(rules, "acl.conf", default)
    client = ClientInfo("c1", "u1")
    decision = acl.check_receive(client, topic)
    assert decision.allowed is received, decision.reason
    assert acl.may_receive(client, TopicName(topic)) is received


def test_a_refusal_names_the_first_rule_that_denies_the_filters_topics() -> None:
    acl = Acl.parse("deny all subscribe a/x\ndeny all subscribe a/+\n", "acl.conf", ALLOW)
    assert acl.check_subscribe(ALICE, "a/+").reason == (
        "denied by rule (acl.conf:1): deny all subscribe a/x"
    )
    assert acl.first_match(ALICE, SUB, "a/+") == acl.rules[0]
    mixed = Acl.parse("deny all all secret/#", "acl.conf")  # (default deny)
    assert mixed.check_subscribe(ALICE, "#").reason == (
        "denied by rule (acl.conf:1): deny all all secret/#; no rule matched the rest"
    )
    assert acl.first_match(ALICE, SUB, "b/+") is None  # the default grants it
    assert acl.check_receive(ALICE, "a/y").reason.startswith("denied by rule (acl.conf:2)")
    with pytest.raises(InvalidTopicError):
        acl.check_receive(ALICE, "a/+")


def test_a_search_past_its_budget_grants() -> None:
    rules = [(False, Pattern.of(["a", "#"])), (False, Pattern.of(["#"]))]
    assert search(Pattern.of(["#"]), rules, True).allowed is False
    verdict = search(Pattern.of(["#"]), rules, True, budget=2)
    assert (verdict.allowed, verdict.decider, verdict.exact) == (True, None, False)


def test_a_filter_of_thousands_of_levels_is_searched_without_recursion() -> None:
    deep = "/".join(["+"] * 20_000)
    acl = Acl.parse(f"deny all subscribe {deep}", "acl.conf", ALLOW)
    assert not acl.check_subscribe(ALICE, deep).allowed
    assert acl.check_subscribe(ALICE, deep + "/x").allowed


# -- the subscribe check against brute force over a small universe of topics ---------------

FILTER_LEVELS = ["a", "", "$x", "+"]
RULE_LEVELS = [*FILTER_LEVELS, "%c"]
# A topic level is one the filters name, the one a client id "c" names through a '%c'
# rule, or one nothing names ("z" stands for all of those); no filter is longer than 4
# levels before '#': these topics stand for every topic. (With "c" standing for the
# unnamed levels too, the rules deny a / deny %c made '+' look refusable for client c.)
TOPIC_LEVELS = ["a", "", "$x", "c", "z"]
MAX_TOPIC_LEVELS = 5


def all_topics() -> list[list[str]]:
    topics = []
    for length in range(1, MAX_TOPIC_LEVELS + 1):
        for levels in itertools.product(TOPIC_LEVELS, repeat=length):
            if levels != ("",):  # the empty topic name does not exist
                topics.append(list(levels))
    return topics


TOPICS = all_topics()


def valid(text: str) -> bool:
    try:
        validate_filter(text)
    except InvalidTopicError:
        return False
    return True


def small_filters(levels: list[str], max_prefix: int) -> list[str]:
    found = []
    for length in range(max_prefix + 1):
        for prefix in itertools.product(levels, repeat=length):
            for tail in ([], ["#"]):
                text = "/".join([*prefix, *tail])
                if text and valid(text):
                    found.append(text)
    return found


@cache
def topic_mask(topic_filter: str) -> int:
    """Bit i is set if the filter matches TOPICS[i]."""
    levels = topic_filter.split("/")
    mask = 0
    for index, topic in enumerate(TOPICS):
        if filter_matches_levels(levels, topic):
            mask |= 1 << index
    return mask


Rules = list[tuple[Permission, str]]


def receivable_mask(rules: Rules, default: Permission, client_id: str) -> int:
    """Bit i is set if the client may receive TOPICS[i]: the first rule matching it
    decides, else the default; a '%c' rule for the client '+' (unsafe) denies every
    topic as a deny rule and matches none as an allow rule."""
    undecided = (1 << len(TOPICS)) - 1
    allowed = 0
    for permission, text in rules:
        if "%c" in text and client_id == "+":
            mask = (1 << len(TOPICS)) - 1 if permission is DENY else 0
        else:
            mask = topic_mask(text.replace("%c", client_id))
        if permission is ALLOW:
            allowed |= mask & undecided
        undecided &= ~mask
    return allowed | (undecided if default is ALLOW else 0)


def check_against_brute_force(rules: Rules, default: Permission, client_id: str) -> None:
    acl = Acl([AclRule(permission, SUB, text) for permission, text in rules], default)
    client = ClientInfo(client_id)
    receivable = receivable_mask(rules, default, client_id)
    for topic_filter in FILTERS:
        granted = acl.check_subscribe(client, topic_filter).allowed
        # sound (a refused filter has no receivable topic) and exact (a granted one has)
        assert granted is bool(topic_mask(topic_filter) & receivable), (rules, topic_filter)


FILTERS = small_filters(FILTER_LEVELS, 3)


def test_one_rule_against_brute_force_exhaustively() -> None:
    rule_filters = small_filters(RULE_LEVELS, 2)
    assert len(FILTERS) > 150 and len(rule_filters) > 50
    for text in rule_filters:
        for permission in (ALLOW, DENY):
            for default in (ALLOW, DENY):
                check_against_brute_force([(permission, text)], default, "a")


@st.composite
def rule_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(RULE_LEVELS), min_size=0, max_size=4))
    if draw(st.booleans()) or not levels or levels == [""]:
        levels.append("#")
    return "/".join(levels)


@settings(max_examples=300, deadline=None)
@example([(DENY, "a"), (DENY, "%c")], ALLOW, "c")  # (found by the search: see TOPIC_LEVELS)
@given(
    st.lists(st.tuples(st.sampled_from([ALLOW, DENY]), rule_filters()), max_size=6),
    st.sampled_from([ALLOW, DENY]),
    st.sampled_from(["a", "c", "+"]),
)
def test_the_subscribe_check_agrees_with_brute_force(
    rules: Rules, default: Permission, client_id: str
) -> None:
    check_against_brute_force(rules, default, client_id)
    acl = Acl([AclRule(permission, SUB, text) for permission, text in rules], default)
    receivable = receivable_mask(rules, default, client_id)
    for index in range(0, len(TOPICS), 7):  # (and the receive check, on a sample)
        topic = "/".join(TOPICS[index])
        received = acl.may_receive(ClientInfo(client_id), TopicName(topic))
        assert received is bool(receivable >> index & 1), (rules, topic)
