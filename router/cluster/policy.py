"""How a node runs its hooks: authentication, the ACL, and the client and message points.

The node owns one :class:`~router.core.hooks.HookRegistry` (``node.hooks``) and one
:class:`Policy` over it. The node calls the policy at each point; this module says what
each fold means to the node:

=======================  ==================================================================
point                    what the node does with it
=======================  ==================================================================
client.authenticate      ``connect(client_id, username, password)``: with no callback every
                         client is accepted; with callbacks the fold starts from *deny*, so
                         a callback must return ``Ok``/``Stop(Decision.allow(...))``. A deny
                         raises :class:`NotAuthorizedError` and changes nothing. An allow
                         may carry ``expires_at`` (:meth:`Policy.credentials`): the MQTT
                         connection ends then with DISCONNECT 0xA0.
client.check_acl         subscribe (on the filter after ``client.subscribe``) and publish
                         (on the topic, only for a publish with a ``publisher``; the
                         embedding program's own publishes are trusted). With no callback
                         everything is allowed; with callbacks the fold starts from *deny*
                         (a crashing ACL fails closed). A deny raises
                         :class:`NotAuthorizedError` with the decision's reason before
                         anything is written, in Redis or locally (in a batch of
                         ``publish_each``: that item's result, the others go); a denied
                         publish is also reported, once, to ``message.dropped`` with
                         reason ``denied``. The built-in ACL grants a subscribe when at
                         least one topic it can match may be received
                         (:mod:`router.core.acl`).
(delivery)               not a hook point: with an ACL configured (``NodeConfig.acl``,
                         ``--acl``), every copy for a local client is judged, before it is
                         queued, by that ACL's receive check (:meth:`Acl.check_receive
                         <router.core.acl.Acl.check_receive>`: its subscribe rules on the
                         topic name) for the user name the session's connection gave; the
                         ``client.check_acl`` callbacks are not asked (they judge publish and
                         subscribe only). A denied copy is not queued, is counted
                         (``acl_denied_deliveries``) and goes to ``message.dropped`` with
                         reason ``denied`` (:mod:`router.cluster.delivery_acl`).
client.connected         after a client is attached (not again for one already attached).
client.disconnected      after ``disconnect`` (reason ``"normal"``) or the node's stop
                         (reason ``"node_stopped"``).
client.subscribe         folds ``(filter, options)``: a callback may *rewrite* both (a valid
                         filter and a :class:`SubscriptionOptions`); None refuses the
                         subscribe (:class:`NotAuthorizedError`). The ACL checks the result.
client.unsubscribe       folds the filter: a callback may rewrite it (so a rewriting module
                         can undo its own subscribe rewrite); None keeps the subscription
                         (``unsubscribe`` returns False).
message.publish          folds the :class:`Message`: a callback may rewrite topic, payload,
                         QoS and retain (never the id); None drops it (``message.dropped``
                         with ``stopped``; the publish returns a result with no nodes).
                         Runs after the ACL check, so the ACL judges what the client sent.
message.delivered        each copy queued for a local client (the node's "delivered": the
                         copy is in the client's queue; what the embedding program does next
                         is its own). Args ``(client, delivery)``.
message.dropped          ``no_subscribers`` (no node in the cluster is interested, seen by
                         the publishing node), ``queue_full`` (a client's bounded queue
                         dropped a copy: the dropped one), ``denied`` (a publish the ACL
                         refused, with the publisher; a copy the ACL kept from a client,
                         with that client), ``stopped``.
message.acked            not run by the node: its clients have no acknowledgements (the MQTT
                         front end will run it for QoS 1/2).
=======================  ==================================================================

A rewrite a fold cannot use (a bad filter or topic, a changed id) is logged and skips that
callback (the registry's ``check``), like a callback that raised.

With the built-in ACL as the only ``client.check_acl`` callback, a publish is judged
without the fold: the ACL's answer per publisher and topic is cached
(:data:`PUBLISH_DECISIONS` at most, forgotten together when full); a denial is judged
again through the ACL for its reason.

Cost when nothing is registered: the node reads one flag per publish (``guards_publish``),
one per subscribe, and passes ``delivery_observer`` (None) to the local delivery; the
flags are recomputed only when callbacks are registered or removed. The receive check
costs a None test per local client without an ACL, and with one a lookup of the
session's cached decision for the topic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from router.cluster.delivery_acl import DeliveryAcl
from router.cluster.sessions.local_sessions import DeliveryObserver, LocalSessions
from router.core.acl import Acl, AclAction, Permission
from router.core.hooks import (
    Check,
    ClientInfo,
    Decision,
    DropReason,
    HookPoint,
    HookRegistry,
    Stop,
)
from router.core.messages import Delivery, Message
from router.core.options import SubscriptionOptions
from router.core.passwords import PasswordFile
from router.core.topics import (
    SYSTEM_PREFIX,
    TopicFilter,
    TopicName,
    validate_filter,
    validate_topic,
)
from router.errors import AclRuleError, HookError, NotAuthorizedError

NO_AUTHENTICATOR_ALLOWED = Decision.deny("no authentication hook accepted the client")
NO_AUTHENTICATOR = Decision.allow("no authentication hook")
NO_ACL_ALLOWED = Decision.deny("no ACL hook allowed it")

Subscription = tuple[TopicFilter, SubscriptionOptions]
PUBLISH_DECISIONS: Final = 100_000
"""The built-in ACL's publish decisions a node keeps (and as many prepared publishers)."""


class Policy:
    """The hook points of one node, with flags that say which ones have callbacks."""

    def __init__(
        self, hooks: HookRegistry, acl: Acl | None = None, sessions: LocalSessions | None = None
    ) -> None:
        """``acl`` is registered at ``client.check_acl``; the receive check of
        ``sessions`` (its own ACL, see the module docstring) reports its denials here."""
        self.hooks = hooks
        self._acl = acl
        self._sole_acl: Acl | None = None  # the ACL, when it is the only check_acl callback
        self._publishers: dict[ClientInfo, Callable[[str], bool]] = {}
        self._may_publish: dict[tuple[ClientInfo, str], bool] = {}
        self._delivery_acl = sessions.acl if sessions is not None else None
        self._clients: dict[str, ClientInfo] = {}
        self.guards_publish = False
        self.publishes_denied = 0  # publishes the ACL refused (each once)
        self.guards_subscribe = False
        self.reports_drops = False
        self.delivery_observer: DeliveryObserver | None = None
        hooks.add_listener(self._refresh)
        self._refresh()
        if acl is not None:
            acl.register(hooks)

    def _refresh(self) -> None:
        active = self.hooks.active
        acl = active(HookPoint.CLIENT_CHECK_ACL)
        self.guards_publish = acl or active(HookPoint.MESSAGE_PUBLISH)
        self.guards_subscribe = acl or active(HookPoint.CLIENT_SUBSCRIBE)
        self.reports_drops = active(HookPoint.MESSAGE_DROPPED)
        only = self._acl is not None and self.hooks.callbacks(HookPoint.CLIENT_CHECK_ACL) == (
            self._acl.hook,
        )
        self._sole_acl = self._acl if only else None
        self._publishers.clear()
        self._may_publish.clear()
        observed = self.reports_drops or active(HookPoint.MESSAGE_DELIVERED)
        self.delivery_observer = self._observe if observed else None
        if self._delivery_acl is not None:
            self._delivery_acl.on_denied = self._denied if self.reports_drops else None

    def screen_deliveries(self, delivery_acl: DeliveryAcl) -> None:
        """Report the denials of ``delivery_acl`` too (a receive check made after the
        policy: :meth:`LocalSessions.narrow`)."""
        self._delivery_acl = delivery_acl
        self._refresh()

    def replace_acl(self, acl: Acl) -> None:
        """Judge with ``acl`` from now on, in place of the ACL the node started with
        (its ``client.check_acl`` callback is registered again, at priority 0, after the
        others of that priority). Raises :class:`AclRuleError` when it started without one."""
        if self._acl is None:
            raise AclRuleError("the node started without an ACL: there is none to replace")
        if acl is self._acl:
            return
        self._acl.unregister(self.hooks)
        self._acl = acl
        acl.register(self.hooks)  # (the registry's listener refreshes the flags and caches)

    # -- clients ---------------------------------------------------------------------

    def client(self, client_id: str) -> ClientInfo:
        """What the hooks know of ``client_id``: its username once it connected."""
        return self._clients.get(client_id) or ClientInfo(client_id)

    async def authenticate(
        self,
        client_id: str,
        username: str | None,
        password: str | bytes | None,
        check: bool = True,
    ) -> ClientInfo:
        """Run ``client.authenticate``; returns the client's info if it is accepted.

        Without ``check`` no hook runs: the node resumes a stored session itself, under
        the user name it was stored with (adoption), and no client is connecting.
        Raises :class:`InvalidIdError` for a username that is not a str and
        :class:`NotAuthorizedError` if the client is refused.
        """
        return (await self.credentials(client_id, username, password, check))[0]

    async def credentials(
        self,
        client_id: str,
        username: str | None,
        password: str | bytes | None,
        check: bool = True,
    ) -> tuple[ClientInfo, Decision]:
        """:meth:`authenticate`, with the accepting decision (its ``expires_at``: when
        the credentials stop being valid); raises as it does."""
        client = ClientInfo(client_id, username)
        if not check or not self.hooks.active(HookPoint.CLIENT_AUTHENTICATE):
            return client, NO_AUTHENTICATOR
        decision = await self.hooks.arun_fold(
            HookPoint.CLIENT_AUTHENTICATE, (client, password), NO_AUTHENTICATOR_ALLOWED, _decision
        )
        if not decision.allowed:
            raise NotAuthorizedError(client_id, "connect", None, decision.reason)
        return client, decision

    async def admit_sender(self, client: ClientInfo, topic: str) -> None:
        """Whether ``client`` may send a message to ``topic`` that does not come as a
        PUBLISH packet (a will, asked at CONNECT; an HTTP publish): the gate every publish
        passes (not under ``$SYS/``, the ACL allows it); raises
        :class:`NotAuthorizedError` if not."""
        if topic.startswith(SYSTEM_PREFIX):
            raise NotAuthorizedError(client.client_id, "publish", topic, "the broker's topic")
        decision = await self.check(client, AclAction.PUBLISH, topic)
        if not decision.allowed:
            raise NotAuthorizedError(client.client_id, "publish", topic, decision.reason)

    async def attached(self, client: ClientInfo, new: bool) -> None:
        """Remember the client (its username for the ACL); run ``client.connected`` if
        it is ``new`` on this node (not for a client that connected again)."""
        self._clients[client.client_id] = client
        if new and self.hooks.active(HookPoint.CLIENT_CONNECTED):
            await self.hooks.arun(HookPoint.CLIENT_CONNECTED, (client,))

    async def detached(self, client_id: str, reason: str) -> None:
        """Forget the client; run ``client.disconnected`` if it was attached."""
        client = self._clients.pop(client_id, None)
        if client is not None and self.hooks.active(HookPoint.CLIENT_DISCONNECTED):
            await self.hooks.arun(HookPoint.CLIENT_DISCONNECTED, (client, reason))

    # -- subscribing -----------------------------------------------------------------

    async def admit_subscribe(
        self, client_id: str, topic_filter: TopicFilter, options: SubscriptionOptions
    ) -> Subscription:
        """``client.subscribe`` then the ACL; returns the (possibly rewritten) subscription.

        Raises :class:`NotAuthorizedError` if a hook removed it or the ACL denies it.
        """
        client = self.client(client_id)
        wanted: Subscription | None = (topic_filter, options)
        if self.hooks.active(HookPoint.CLIENT_SUBSCRIBE):
            wanted = await self.hooks.arun_fold(
                HookPoint.CLIENT_SUBSCRIBE, (client,), wanted, _subscription
            )
        if wanted is None:
            reason = "refused by a client.subscribe hook"
            raise NotAuthorizedError(client_id, "subscribe", topic_filter, reason)
        decision = await self.check(client, AclAction.SUBSCRIBE, wanted[0])
        if not decision.allowed:
            raise NotAuthorizedError(client_id, "subscribe", wanted[0], decision.reason)
        return wanted

    async def admit_unsubscribe(
        self, client_id: str, topic_filter: TopicFilter
    ) -> TopicFilter | None:
        """``client.unsubscribe``: the filter to remove, or None to keep the subscription."""
        if not self.hooks.active(HookPoint.CLIENT_UNSUBSCRIBE):
            return topic_filter
        found: TopicFilter | None = await self.hooks.arun_fold(
            HookPoint.CLIENT_UNSUBSCRIBE, (self.client(client_id),), topic_filter, _filter
        )
        return found

    async def check(self, client: ClientInfo, action: AclAction, topic: str) -> Decision:
        """The ``client.check_acl`` decision (allow when no callback is registered)."""
        if not self.hooks.active(HookPoint.CLIENT_CHECK_ACL):
            return Decision.allow("no ACL")
        return await self.hooks.arun_fold(
            HookPoint.CLIENT_CHECK_ACL, (client, action, topic), NO_ACL_ALLOWED, _decision
        )

    # -- messages --------------------------------------------------------------------

    async def admit_publish(self, messages: list[Message]) -> list[Message | None]:
        """The ACL for every message with a publisher, then ``message.publish`` for each.

        Returns, per message, the message to route (possibly rewritten) or None if a hook
        stopped it. Raises :class:`NotAuthorizedError` for the first message the ACL
        denies (the messages after it are not asked about); no ``message.publish``
        callback has run then.
        """
        for message in messages:
            publisher = self._to_ask(message)
            if publisher is not None:
                refusal = await self._refusal(message, publisher)
                if refusal is not None:
                    raise refusal
        return await self._fold_each(messages)

    async def admit_each(
        self, messages: list[Message]
    ) -> tuple[Sequence[Message | NotAuthorizedError | None], bool]:
        """:meth:`admit_publish` with each message judged alone, as if published alone.

        Returns, per message, the message to route (possibly rewritten), None if a
        ``message.publish`` hook stopped it, or the :class:`NotAuthorizedError` of a
        message the ACL denies (reported to ``message.dropped``, reason ``denied``; no
        ``message.publish`` callback runs for it), and whether any was denied (False:
        the first holds no error). The ACL is asked once per message.
        """
        judged: list[Message | NotAuthorizedError] = []
        denied = False
        for message in messages:
            publisher = self._to_ask(message)
            refusal = None if publisher is None else await self._refusal(message, publisher)
            if refusal is None:
                judged.append(message)
            else:
                judged.append(refusal)
                denied = True
        if not denied:  # (the common case: every one allowed)
            return await self._fold_each(messages), False
        folded = iter(await self._fold_each([m for m in judged if isinstance(m, Message)]))
        return [next(folded) if isinstance(m, Message) else m for m in judged], True

    def _to_ask(self, message: Message) -> ClientInfo | None:
        """The publisher the ACL must be asked about ``message``; None when it passes
        without asking (no publisher, or the built-in ACL alone allows it: cached)."""
        publisher = self.publisher(message)
        if publisher is None or self._may_publish_fast(publisher, message.topic):
            return None
        return publisher

    async def _refusal(self, message: Message, publisher: ClientInfo) -> NotAuthorizedError | None:
        """The ACL's refusal of ``publisher`` publishing ``message``, reported to
        ``message.dropped`` (reason ``denied``); None if it is allowed."""
        decision = await self.check(publisher, AclAction.PUBLISH, message.topic)
        if decision.allowed:
            return None
        self.publishes_denied += 1
        self.dropped(message, DropReason.DENIED, publisher)
        return NotAuthorizedError(publisher.client_id, "publish", message.topic, decision.reason)

    async def _fold_each(self, messages: list[Message]) -> list[Message | None]:
        """``message.publish`` for each message (the messages as they are without a
        callback)."""
        if not self.hooks.active(HookPoint.MESSAGE_PUBLISH):
            return list(messages)
        return [await self._fold_publish(message) for message in messages]

    def _may_publish_fast(self, publisher: ClientInfo, topic: str) -> bool:
        """True when the built-in ACL, the only ``client.check_acl`` callback, allows it
        (cached); False when it denies, or when other callbacks must be asked."""
        acl = self._sole_acl
        if acl is None:
            return False
        key = (publisher, topic)
        allowed = self._may_publish.get(key)
        if allowed is None:
            decide = self._publishers.get(publisher)
            if decide is None:
                if len(self._publishers) >= PUBLISH_DECISIONS:
                    self._publishers.clear()
                decide = self._publishers[publisher] = acl.publisher(publisher)
            if len(self._may_publish) >= PUBLISH_DECISIONS:
                self._may_publish.clear()
            allowed = self._may_publish[key] = decide(topic)
        return allowed

    async def _fold_publish(self, message: Message) -> Message | None:
        publisher = self.publisher(message)
        start: Message | None = message
        checked = await self.hooks.arun_fold(
            HookPoint.MESSAGE_PUBLISH, (publisher,), start, _same_id(message.id)
        )
        if checked is None:
            self.dropped(message, DropReason.STOPPED, publisher)
        return checked

    def unrouted(self, message: Message) -> None:
        """Report a message that no node in the cluster wants (``no_subscribers``)."""
        self.dropped(message, DropReason.NO_SUBSCRIBERS, self.publisher(message))

    def dropped(self, message: Message, reason: DropReason, client: ClientInfo | None) -> None:
        """Run ``message.dropped`` (callers check :attr:`reports_drops` on hot paths)."""
        if self.reports_drops:
            self.hooks.run(HookPoint.MESSAGE_DROPPED, (message, reason, client))

    def publisher(self, message: Message) -> ClientInfo | None:
        """The publisher's info, None for a message without one."""
        return None if message.publisher is None else self.client(message.publisher)

    def _observe(self, client_id: str, delivery: Delivery, lost: Delivery | None) -> None:
        client = self.client(client_id)
        if lost is not delivery and self.hooks.active(HookPoint.MESSAGE_DELIVERED):
            self.hooks.run(HookPoint.MESSAGE_DELIVERED, (client, delivery))
        if lost is not None:
            self.dropped(_as_message(lost), DropReason.QUEUE_FULL, client)

    def _denied(self, client_id: str, what: Message | Delivery) -> None:
        message = what if isinstance(what, Message) else _as_message(what)
        self.dropped(message, DropReason.DENIED, self.client(client_id))


def _as_message(delivery: Delivery) -> Message:
    """A dropped client copy as a message (with the QoS and retain flag of that copy)."""
    return Message(
        delivery.message_id,
        TopicName(delivery.topic),  # a copy of a routed message: its topic was validated
        delivery.payload,
        delivery.qos,
        delivery.retain,
        delivery.publisher,
        delivery.sent_at,
    )


def load_acl(acl: Acl | str | Path | None, default: str | Permission | None = None) -> Acl | None:
    """The ACL that ``connect(acl=..., acl_default=...)`` and ``router node run`` ask for.

    ``acl`` is an :class:`Acl` or the path of an ACL file; ``default`` (``"allow"`` or
    ``"deny"``, default deny) decides what no rule matches and replaces the default of
    a given :class:`Acl`. Raises :class:`AclRuleError` naming the file and line for a bad
    file, for a bad ``default``, and for a ``default`` without an ``acl``.
    """
    if acl is None:
        if default is not None:
            raise AclRuleError("an ACL default needs an ACL (give an ACL file)")
        return None
    try:
        permission = Permission.DENY if default is None else Permission(default)
    except ValueError:
        raise AclRuleError(f"the ACL default must be 'allow' or 'deny', not {default!r}") from None
    if isinstance(acl, Acl):
        return acl if default is None else Acl(acl.rules, permission)
    return Acl.from_file(acl, permission)


def password_authenticator(
    passwords: PasswordFile | Callable[[], PasswordFile],
    *,
    allow_anonymous: bool = True,
    source: str = "password file",
) -> Callable[[ClientInfo, str | bytes | None, Decision], Stop[Decision]]:
    """A ``client.authenticate`` callback that checks clients against a password file
    (``mosquitto_passwd`` format; or a function giving the current one, asked at each
    CONNECT): a known user with the right password is allowed, any other user is
    refused; a client without a user name is allowed only with ``allow_anonymous``.
    ``source`` names it in the allowing decision. Register it with ``node.hooks.register(
    HookPoint.CLIENT_AUTHENTICATE, ...)`` (``router node run --password-file`` does)."""
    current = passwords if callable(passwords) else lambda: passwords

    def check(client: ClientInfo, password: str | bytes | None, _: Decision) -> Stop[Decision]:
        if client.username is None:
            if allow_anonymous:
                return Stop(Decision.allow("anonymous"))
            return Stop(Decision.deny("a user name is required"))
        if password is not None and current().check(client.username, password):
            return Stop(Decision.allow(source))
        return Stop(Decision.deny("bad user name or password"))

    return check


# -- what a fold may return -------------------------------------------------------------


def _decision(value: Any) -> Decision:
    if not isinstance(value, Decision):
        raise HookError(f"expected a Decision, not {type(value).__name__}")
    expires_at = value.expires_at
    if expires_at is not None and (
        type(expires_at) not in (int, float) or not math.isfinite(expires_at)
    ):
        raise HookError(f"expires_at must be None or a finite number, not {expires_at!r}")
    return value


def _filter(value: Any) -> TopicFilter | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise HookError(f"expected a topic filter or None, not {type(value).__name__}")
    return validate_filter(value)


def _subscription(value: Any) -> Subscription | None:
    if value is None:
        return None
    if not (isinstance(value, tuple) and len(value) == 2):
        raise HookError(f"expected (filter, options) or None, not {value!r}")
    topic_filter, options = value
    if not isinstance(options, SubscriptionOptions):
        raise HookError(f"expected SubscriptionOptions, not {type(options).__name__}")
    _filter(topic_filter)
    return topic_filter, options


def _same_id(message_id: bytes) -> Check[Message | None]:
    def check(value: Any) -> Message | None:
        if value is None:
            return None
        if not isinstance(value, Message):
            raise HookError(f"expected a Message or None, not {type(value).__name__}")
        if value.id != message_id:
            raise HookError("a message.publish hook may not change the message id")
        validate_topic(value.topic)
        if not isinstance(value.payload, bytes) or value.qos not in (0, 1, 2):
            raise HookError("the payload must be bytes and the QoS 0, 1 or 2")
        return dataclasses.replace(value, retain=bool(value.retain))

    return check
