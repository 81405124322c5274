"""The dashboard in a real browser (Debian's chromium through Playwright) against two real
``router node run --mqtt ... --http ...`` processes sharing one redis-server.

An admin made with ``router dashboard users add`` logs in on node n1's dashboard and
works the cluster with it while paho-mqtt clients watch from the MQTT side: both nodes
listed; a client of n2 found by its id, opened and kicked (its connection ends); a
publish from the form reaching a subscriber of n2; the overview's in-rate rising under
a publisher's load; the other pages each shown and used once. Every page is saved in
``test-artifacts/screenshots/`` (:mod:`tests.support.browser`). Waits have deadlines;
nothing sleeps a guessed time.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from uuid import uuid4

import pytest
from playwright.sync_api import Locator, Page, expect

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_5, Connect, SubAck, Subscribe, Subscription
from router.mqtt.properties import Properties
from router.state.keys import Keys
from router.web import assets
from tests.support.browser import PHONE_VIEWPORT, BrowserPage, OpenPage
from tests.support.cli import ROUTER_SCRIPT, TIMEOUT, Process, delete_namespace
from tests.support.mqtt import V5, Paho, connect_properties, mqtt_node, routed_to
from tests.support.waiting import pace

ADMIN = "dash-admin"
VIEWER = "dash-viewer"
PASSWORD = "correct horse battery staple"
LOAD_RATE = 100.0
"""Messages per second of the publisher whose rate the overview must show."""
RATE_WAIT_MS = 30_000
"""Rates come from samples every 2 s, polled every 2 s: a few rounds, on a busy machine."""


@dataclass(frozen=True)
class Cluster:
    """Two nodes: their dashboards' base URLs and their MQTT ports, n1 first."""

    http: tuple[str, str]
    mqtt: tuple[int, int]


def http_url(process: Process) -> str:
    """The base URL a started node logged (``HTTP on http://HOST:PORT``)."""
    for line in process.stderr_lines:
        found = re.search(r"HTTP on (https?://\S+)", line)
        if found is not None:
            return found.group(1) + "/"
    raise AssertionError(f"no 'HTTP on' line; saw {process.stderr_lines}")


def add_account(env: dict[str, str], name: str, role: str) -> None:
    """``router dashboard users add NAME --role ROLE --password-stdin``, as an operator."""
    done = subprocess.run(
        [str(ROUTER_SCRIPT), "dashboard", "users", "add", name, "--role", role, "--password-stdin"],
        input=PASSWORD + "\n",
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def cluster(redis_standalone_url: str) -> Iterator[Cluster]:
    """n1 and n2 on the session's redis-server, in a namespace of the module's own, with
    a dashboard admin and a viewer; stopped and the namespace deleted after the module."""
    absent = assets.missing()
    if absent:
        pytest.fail(f"the dashboard's libraries are missing ({', '.join(absent)}): make web-assets")
    keys = Keys(prefix=f"t{uuid4().hex[:12]}")
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    http = ("--http", "127.0.0.1:0")
    try:
        add_account(env, ADMIN, "admin")
        add_account(env, VIEWER, "viewer")
        with (
            mqtt_node("n1", env, *http) as (one, mqtt_one),
            mqtt_node("n2", env, *http) as (two, mqtt_two),
        ):
            yield Cluster((http_url(one), http_url(two)), (mqtt_one, mqtt_two))
    finally:
        delete_namespace(redis_standalone_url, keys)


def tagged(name: str) -> str:
    """The selector of the elements whose ``data-test`` is ``name``."""
    return f'[data-test="{name}"]'


def log_in(dash: BrowserPage, user: str = ADMIN, role: str = "admin") -> Page:
    """Open the dashboard (the login page: accounts exist), log in and land on the
    overview."""
    page = dash.visit("", ready=tagged("login-user"), name="login")
    page.fill(tagged("login-user"), user)
    page.fill(tagged("login-password"), PASSWORD)
    page.click(tagged("login-submit"))
    expect(page.locator(tagged("rate-in"))).to_be_visible()
    expect(page.locator(tagged("who"))).to_contain_text(f"{user} ({role})")
    return page


def confirm(dash: BrowserPage, name: str) -> None:
    """Answer the confirmation dialog with Confirm (saving it as ``name``)."""
    dialog = dash.page.locator(tagged("confirm-dialog"))
    expect(dialog).to_be_visible()
    dash.shot(name)
    dialog.locator(tagged("confirm")).click()
    expect(dialog).to_be_hidden()


@contextlib.contextmanager
def publishing(port: int, topic: str, rate: float, client_id: str | None = None) -> Iterator[None]:
    """A paho publisher on ``port`` (as ``client_id``, a new one if None) sending QoS 0
    to ``topic`` at ``rate`` per second until the block ends."""
    publisher = Paho(port, client_id or f"load-{uuid4().hex[:6]}", V5)
    assert publisher.connected()[0] == 0
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        start, seq = time.monotonic(), 0
        try:
            while not stop.is_set():
                publisher.publish(topic, b"tick", 0)
                seq += 1
                pace(start, seq, rate)
        except BaseException as error:  # (reported by the test's thread)
            failed.append(error)

    thread = threading.Thread(target=run, name="dashboard-load")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(TIMEOUT)
        publisher.close()
    assert not failed, failed


def shown_after(refresh: Callable[[], object], wanted: Locator) -> None:
    """Refresh the page's list until ``wanted`` shows: what MQTT clients changed reaches
    Redis around their acknowledgement, not necessarily before it."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        refresh()
        try:
            expect(wanted.first).to_be_visible(timeout=500)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def shown_number(page: Page, selector: str) -> float:
    text = page.locator(selector).inner_text().replace(",", "")
    return float(text) if re.fullmatch(r"-?[\d.]+", text) else 0.0


def test_an_admin_works_the_cluster_from_the_dashboard(
    cluster: Cluster, open_page: OpenPage
) -> None:
    dash = open_page(cluster.http[0])
    log_in(dash)
    both_nodes_listed(dash)
    a_client_found_opened_and_kicked(dash, cluster.mqtt[1])
    an_away_session_cleared(dash, cluster.mqtt[1])
    a_publish_from_the_form_reaches_a_subscriber(dash, *cluster.mqtt)
    the_in_rate_shows_a_publishers_load(dash, cluster.mqtt[0])
    a_slow_subscriber_shown_with_its_figures(dash, *cluster.mqtt)
    a_retained_message_listed_and_deleted(dash, cluster.mqtt[0])
    a_ban_added_and_lifted(dash)
    the_events_show_the_ban_and_the_nodes(dash)
    a_traced_client_s_packets_shown(dash, cluster.mqtt[1])
    a_user_and_a_rule_added_and_removed(dash)
    assert dash.errors == []


def both_nodes_listed(dash: BrowserPage) -> None:
    page = dash.visit("#/nodes", ready=tagged("node-row"))
    expect(page.locator(tagged("node-row"))).to_have_count(2)
    for node_id in ("n1", "n2"):
        row = page.locator(f'{tagged("node-row")}[data-node-id="{node_id}"]')
        expect(row).to_contain_text("alive")
        expect(row).not_to_have_class(re.compile(r"\bdead\b"))


def a_client_found_opened_and_kicked(dash: BrowserPage, port: int) -> None:
    """A client of n2 found by its id, opened, kicked after confirming: its connection ends."""
    kicked = Paho(port, "dash-kick-me", V5)
    try:
        assert kicked.connected()[0] == 0
        page = dash.visit("#/clients", ready=tagged("client-search"), name="clients-all")
        page.fill(tagged("client-search"), "dash-kick")
        row = page.locator(f'{tagged("client-row")}[data-client-id="dash-kick-me"]')
        expect(row).to_contain_text("n2")
        expect(page.locator(tagged("client-row"))).to_have_count(1)
        dash.shot("clients")
        row.click()
        expect(page.locator(tagged("client-id"))).to_have_text("dash-kick-me")
        expect(page.locator(tagged("client-session"))).to_contain_text("connected")
        dash.shot("client")
        page.click(tagged("kick"))
        confirm(dash, "client-kick-confirm")
        assert kicked.expect_disconnect() == 0x98  # administrative action
        expect(page.locator(tagged("action-result"))).to_contain_text("Kicked from node n2")
        dash.shot("client-kicked")
    finally:
        kicked.close()


def an_away_session_cleared(dash: BrowserPage, port: int) -> None:
    """A session kept after its client left, cleared after confirming: gone."""
    leaving = Paho(port, "dash-away", V5, properties=connect_properties(SessionExpiryInterval=600))
    try:
        assert leaving.connected()[0] == 0
    finally:
        leaving.close()
    page = dash.visit("#/clients", ready=tagged("client-search"), name="clients-with-away")
    page.fill(tagged("client-search"), "dash-away")
    row = page.locator(f'{tagged("client-row")}[data-client-id="dash-away"]')
    shown_after(lambda: page.press(tagged("client-search"), "Enter"), row.filter(has_text="away"))
    row.click()
    expect(page.locator(tagged("client-session"))).to_contain_text("away")
    page.click(tagged("clear-session"))
    confirm(dash, "client-clear-confirm")
    expect(page.locator(tagged("action-result"))).to_have_text("Session cleared.")
    expect(page.locator(tagged("client-missing"))).to_be_visible()
    dash.shot("client-cleared")


def stuck_subscriber(port: int, client_id: str, topic_filter: str) -> socket.socket:
    """A raw MQTT 5 client that subscribes to ``topic_filter`` at QoS 1 with a Receive
    Maximum of 1 and a Maximum Packet Size of 200, then never reads nor acknowledges."""
    stuck = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    reader = PacketReader()
    reader.level = MQTT_5
    properties = Properties(receive_maximum=1, maximum_packet_size=200)
    stuck.sendall(encode(Connect(client_id, MQTT_5, True, keepalive=600, properties=properties)))
    stuck.sendall(encode(Subscribe(1, (Subscription(topic_filter, 1),)), MQTT_5))
    got: list[object] = []
    while not any(type(packet) is SubAck for packet in got):
        got += reader.feed(stuck.recv(65536))
    return stuck


def a_slow_subscriber_shown_with_its_figures(
    dash: BrowserPage, port_one: int, port_two: int
) -> None:
    """A client of n2 that never reads: the overview (of n1) lists it among the slow
    subscribers and says why copies were dropped; its page tells its queue, drops and
    traffic in words, without raw fields."""
    stuck = stuck_subscriber(port_two, "dash-slow", "dash/slow/#")
    publisher = Paho(port_one, "dash-slow-pub", V5)
    try:
        assert publisher.connected()[0] == 0
        publisher.publish("dash/slow/big", b"x" * 500, 1)  # (over its Maximum Packet Size)
        for _ in range(30):  # (1 in flight, never acknowledged; 29 wait in n2's memory)
            publisher.publish("dash/slow/small", b"tick", 1)
        page = dash.visit("#/overview", ready=tagged("rate-in"), name="overview-before-slow")
        row = page.locator(f'{tagged("slow-row")}[data-client-id="dash-slow"]')
        expect(row).to_contain_text("29 (116 B)", timeout=RATE_WAIT_MS)
        expect(row).to_contain_text("n2")
        oversized = page.locator(f'{tagged("drop-reason")}[data-reason="mqtt_oversized_dropped"]')
        expect(oversized).to_contain_text("Larger than its client's Maximum Packet Size")
        busiest = page.locator(f'{tagged("busiest-row")}[data-filter="dash/slow/#"]')
        expect(busiest).to_be_visible(timeout=RATE_WAIT_MS)
        dash.shot("overview-slow-subscribers")
        row.locator("a").click()
        expect(page.locator(tagged("client-id"))).to_have_text("dash-slow")
        session = page.locator(tagged("client-session"))
        expect(session).to_contain_text("29 messages (29 in memory on n2, 0 in its Redis queue)")
        expect(session).to_contain_text("connected on node n2")
        for raw in ("since_ms", "username", "queued_memory"):
            expect(session).not_to_contain_text(raw)
        figures = page.locator(tagged("client-figures"))
        expect(figures).to_contain_text("Queued in memory")
        expect(figures).to_contain_text("29 (116 B)")
        expect(figures).to_contain_text("In flight (not acknowledged)")
        expect(figures).to_contain_text("dropped: larger than its Maximum Packet Size")
        expect(figures).to_contain_text("Messages out (delivered to it)")
        dash.shot("client-figures")
    finally:
        publisher.close()
        stuck.close()


def a_publish_from_the_form_reaches_a_subscriber(
    dash: BrowserPage, port_one: int, port_two: int
) -> None:
    """The form on n1 reaches a subscriber of n2; the route and the match tool show it."""
    subscriber = Paho(port_two, "dash-sub", V5)
    prober = Paho(port_one, "dash-probe", V5)
    try:
        assert subscriber.connected()[0] == 0 and prober.connected()[0] == 0
        assert subscriber.subscribe("dash/#", 1) == [1]
        routed_to(prober, "dash/probe", subscriber)  # n1 knows the route to n2
        page = dash.visit("#/publish", ready=tagged("publish-topic"), name="publish-form")
        page.fill(tagged("publish-topic"), "dash/news")
        page.fill(tagged("publish-payload"), "hello from the dashboard")
        page.select_option(tagged("publish-qos"), "1")
        page.click(tagged("publish-submit"))
        expect(page.locator(tagged("publish-result"))).to_contain_text("n2")
        dash.shot("publish")
        [message] = subscriber.take(1)
        assert (message.topic, message.payload, message.qos) == (
            "dash/news",
            b"hello from the dashboard",
            1,
        )
        page.fill(tagged("publish-topic"), "dash/+/news")  # the API's refusal is shown
        page.click(tagged("publish-submit"))
        refused = page.locator(tagged("publish-error"))  # in words, the type in its title
        expect(refused).to_contain_text("Invalid topic 'dash/+/news'")
        expect(refused).not_to_contain_text("InvalidTopicError")
        expect(refused).to_have_attribute("title", "InvalidTopicError")
        expect(page.locator(tagged("publish-result"))).to_be_hidden()
        dash.shot("publish-refused")
        who_would_receive(dash, port_one, port_two)
    finally:
        prober.close()
        subscriber.close()


def who_would_receive(dash: BrowserPage, port_one: int, port_two: int) -> None:
    """n1's page names n2's subscriber (not only n1's clients) and a share group with
    members on both nodes as a group: one of its 2 members gets each message."""
    names = ("dash-member-1", "dash-member-2")
    members = [Paho(port, name, V5) for port, name in zip((port_one, port_two), names, strict=True)]
    try:
        for member in members:
            assert member.connected()[0] == 0
            assert member.subscribe("$share/dashg/dash/#", 0) == [0]
        page = dash.visit("#/subscriptions", ready=tagged("route-row"), name="subscriptions-routes")
        expect(page.locator(tagged("routes-table"))).to_contain_text("dash/#")
        page.fill(tagged("match-topic"), "dash/news")
        group = page.locator(f'{tagged("match-group")}[data-group="dashg"]')
        shown_after(
            lambda: page.click(tagged("match-submit")),
            group.filter(has_text="one of its 2 members"),
        )
        expect(page.locator(tagged("match-nodes"))).to_have_text("n1, n2")
        n2 = page.locator(f'{tagged("match-node")}[data-node-id="n2"]')
        expect(n2).to_contain_text("dash/#")
        expect(n2.locator(tagged("match-receivers"))).to_have_text("dash-sub (QoS 1)")
        for name, node in zip(names, ("n1", "n2"), strict=True):
            on_node = group.locator(f'{tagged("match-group-node")}[data-node-id="{node}"]')
            expect(on_node).to_contain_text(f"1 member: {name}")
        expect(page.locator(tagged("match-result"))).not_to_contain_text("{")  # no raw JSON
        dash.shot("subscriptions")
    finally:
        for member in members:
            member.close()


def the_in_rate_shows_a_publishers_load(dash: BrowserPage, port: int) -> None:
    """The overview's in-rate reaches a third of a steady publisher's rate (start-up
    ``$SYS`` messages alone stay far below it)."""
    with publishing(port, "load/tick", LOAD_RATE):
        page = dash.visit("#/overview", ready=tagged("rate-in"), name="overview-start")
        page.wait_for_function(
            """(least) => {
                const shown = document.querySelector('[data-test="rate-in"]');
                return shown !== null && parseFloat(shown.textContent.replace(/,/g, "")) >= least;
            }""",
            arg=LOAD_RATE / 3,
            timeout=RATE_WAIT_MS,
        )
        assert shown_number(page, tagged("rate-in")) >= LOAD_RATE / 3
        dash.shot("overview")


def a_retained_message_listed_and_deleted(dash: BrowserPage, port: int) -> None:
    keeper = Paho(port, "dash-keeper", V5)
    try:
        assert keeper.connected()[0] == 0
        keeper.publish("dash/kept", b"kept for later", 1, retain=True)
    finally:
        keeper.close()
    page = dash.visit("#/retained", ready=tagged("retained-filter"), name="retained-form")
    page.fill(tagged("retained-filter"), "dash/#")
    kept = page.locator(tagged("retained-row"), has_text="dash/kept")
    shown_after(lambda: page.click(tagged("retained-search")), kept)
    expect(kept).to_contain_text("kept for later")
    dash.shot("retained")
    kept.locator(tagged("retained-delete")).click()
    confirm(dash, "retained-delete-confirm")
    expect(kept).to_have_count(0)


def a_traced_client_s_packets_shown(dash: BrowserPage, port: int) -> None:
    """A trace started from the page follows a client on its node: its PUBLISH comes in
    and its node's routing of it shows, as it comes."""
    page = dash.visit("#/traces", ready=tagged("trace-value"), name="traces-form")
    page.fill(tagged("trace-value"), "dash-traced")
    page.click(tagged("trace-start"))
    expect(page.locator(tagged("trace-row"))).to_have_count(1)
    with publishing(port, "dash/traced", 10, client_id="dash-traced"):
        routed = page.locator(f'{tagged("trace-record")}[data-what="routed"]').first
        expect(routed).to_contain_text("qos 0", timeout=TIMEOUT * 1000)
        came = page.locator(f'{tagged("trace-record")}[data-what="in"]').first
        expect(came).to_contain_text("PUBLISH")
        dash.shot("traces")
    page.locator(tagged("trace-stop")).click()
    confirm(dash, "trace-stop-confirm")
    expect(page.locator(tagged("trace-row"))).to_have_count(0)


def a_ban_added_and_lifted(dash: BrowserPage) -> None:
    page = dash.visit("#/bans", ready=tagged("ban-value"), name="bans-form")
    page.select_option(tagged("ban-kind"), "client")
    page.fill(tagged("ban-value"), "dash-banned")
    page.fill(tagged("ban-seconds"), "600")
    page.fill(tagged("ban-reason"), "from the browser test")
    page.click(tagged("ban-add"))
    ban = page.locator(tagged("ban-row"), has_text="dash-banned")
    expect(ban).to_contain_text("from the browser test")
    dash.shot("bans")
    ban.locator(tagged("ban-remove")).click()
    confirm(dash, "bans-remove-confirm")
    expect(ban).to_have_count(0)


def the_events_show_the_ban_and_the_nodes(dash: BrowserPage) -> None:
    """The overview's events: the ban just added and lifted (by the logged-in admin), and
    each node's start."""
    page = dash.visit("#/overview", ready=tagged("event-row"), name="overview-events")
    added = page.locator(f'{tagged("event-row")}[data-kind="ban_added"]').first
    expect(added).to_contain_text("dash-banned")
    expect(added).to_contain_text("from the browser test")
    expect(page.locator(f'{tagged("event-row")}[data-kind="ban_removed"]')).to_have_count(1)
    expect(page.locator(f'{tagged("event-row")}[data-kind="node_up"]')).to_have_count(2)


def a_user_and_a_rule_added_and_removed(dash: BrowserPage) -> None:
    """An MQTT user added, its password changed, removed; an ACL rule added, removed.
    Neither node runs with ``--auth-redis``: the page says so, and names them."""
    page = dash.visit("#/users", ready=tagged("user-name"), name="users-form")
    warning = page.locator(tagged("enforcement-warning"))
    expect(warning).to_contain_text("No node enforces these users and rules")
    expect(warning.locator(tagged("not-enforced-by"))).to_have_text(
        "n1 (no users or rules), n2 (no users or rules)"
    )
    page.fill(tagged("user-name"), "dash-mqtt-user")
    page.fill(tagged("user-password"), "first password")
    page.click(tagged("user-add"))
    user = page.locator(f'{tagged("user-row")}[data-user="dash-mqtt-user"]')
    expect(user).to_be_visible()
    user.locator(tagged("user-passwd")).click()
    user.locator(tagged("user-new-password")).fill("second password")
    user.locator(tagged("user-password-save")).click()
    expect(page.locator(tagged("info"))).to_contain_text("dash-mqtt-user")
    page.fill(tagged("acl-rule"), "allow user dash-mqtt-user publish dash/#")
    page.click(tagged("acl-add"))
    rule = page.locator(tagged("acl-row"), has_text="user dash-mqtt-user publish dash/#")
    expect(rule).to_be_visible()
    dash.shot("users")
    rule.locator(tagged("acl-remove")).click()
    confirm(dash, "users-rule-remove-confirm")
    expect(rule).to_have_count(0)
    user.locator(tagged("user-remove")).click()
    confirm(dash, "users-remove-confirm")
    expect(user).to_have_count(0)


def test_a_login_holds_on_every_node_and_a_phone_folds_the_menu(
    cluster: Cluster, open_page: OpenPage
) -> None:
    dash = open_page(cluster.http[0], viewport=PHONE_VIEWPORT, label="phone")
    page = log_in(dash)
    dash.base_url = cluster.http[1]  # the same cookie on n2: the login is kept in Redis
    dash.visit("#/overview", ready=tagged("rate-in"), name="overview")
    expect(page.locator(tagged("who"))).to_contain_text(ADMIN)
    nav = page.locator(tagged("nav"))
    expect(nav).to_be_hidden()
    page.click(tagged("nav-toggle"))
    expect(nav).to_be_visible()
    dash.shot("menu")
    page.click(tagged("nav-nodes"))
    expect(page.locator(tagged("node-row"))).to_have_count(2)
    expect(nav).to_be_hidden()
    dash.shot("nodes")
    every_page_fits_a_phone(dash, cluster.mqtt[1])

    page.click(tagged("logout"))
    expect(page.locator(tagged("login-user"))).to_be_visible()
    page.goto(cluster.http[0] + "#/clients")  # logged out on every node
    expect(page.locator(tagged("login-user"))).to_be_visible()
    dash.shot("logged-out")
    page.fill(tagged("login-user"), ADMIN)
    page.fill(tagged("login-password"), "not the password")
    page.click(tagged("login-submit"))
    expect(page.locator(tagged("login-error"))).to_be_visible()
    page.fill(tagged("login-password"), PASSWORD)
    page.click(tagged("login-submit"))
    expect(page.locator(tagged("client-search"))).to_be_visible()  # back where it was going
    assert dash.errors == []


PHONE_PAGES = (  # route, what shows once the page is drawn with its content
    ("#/overview", tagged("event-row")),
    ("#/nodes", tagged("node-row")),
    ("#/clients", tagged("client-row")),
    ("#/clients/dash-phone", tagged("client-id")),
    ("#/subscriptions", tagged("route-row")),
    ("#/retained", tagged("retained-row")),
    ("#/bans", tagged("bans-table")),
    ("#/users", tagged("users-table")),
    ("#/publish", tagged("publish-form")),
)
"""Every page but the login (saved by :func:`log_in`): the admin's test saves each at
the desktop size, the phone test at the phone's."""


def every_page_fits_a_phone(dash: BrowserPage, port: int) -> None:
    """Each page, with a client, a route and a retained message to show, saved at the
    phone's size (``phone-page-*``), and no table cut off on it: each fits, or scrolls
    sideways inside the window. The match table too, once filled."""
    phone = Paho(port, "dash-phone", V5)
    try:
        assert phone.connected()[0] == 0
        assert phone.subscribe("phone/with/a/rather/long/filter/#", 1) == [1]
        phone.publish("phone/kept", b"kept for the phone", 1, retain=True)
        for route, ready in PHONE_PAGES:
            name = "page-" + (route.lstrip("#/").replace("/", "-"))
            page = dash.visit(route, ready=ready, name=name)
            assert dash.cut_off_tables() == [], route
        page = dash.visit("#/subscriptions", ready=tagged("route-row"), name="page-match")
        page.fill(tagged("match-topic"), "phone/with/a/rather/long/filter/x")
        page.click(tagged("match-submit"))
        expect(page.locator(tagged("match-receivers"))).to_contain_text("dash-phone")
        dash.shot("page-match")
        assert dash.cut_off_tables() == []
    finally:
        phone.publish("phone/kept", b"", 1, retain=True)
        phone.close()


def test_a_viewer_reads_and_is_offered_no_change(cluster: Cluster, open_page: OpenPage) -> None:
    dash = open_page(cluster.http[1], label="viewer")
    page = log_in(dash, VIEWER, "viewer")
    dash.visit("#/nodes", ready=tagged("node-row"))
    page = dash.visit("#/bans", ready=tagged("bans-table"))
    expect(page.locator(tagged("ban-form"))).to_be_hidden()
    page = dash.visit("#/users", ready=tagged("users-table"))
    expect(page.locator(tagged("user-form"))).to_be_hidden()
    expect(page.locator(tagged("acl-form"))).to_be_hidden()
    page = dash.visit("#/publish", ready=tagged("publish-viewer"))
    expect(page.locator(tagged("publish-form"))).to_be_hidden()
    assert dash.errors == []
