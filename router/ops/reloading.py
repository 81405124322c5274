"""What a node process rereads on reload (SIGHUP, ``router node reload``), all or nothing.

:class:`ProcessReloader` is the reloader :func:`router.ops.node_process.run_node`
installs on its node (:mod:`router.cluster.reloads` runs it and reports each reload).
It rereads what the settings name in files:

* the password file (users: the next CONNECT is checked against the new file) and the
  ACL file (rules: the next publish, subscribe and copy on its way to a client are
  judged by them, subscriptions already held included: :meth:`RouterNode.replace_acl
  <router.cluster.node.RouterNode.replace_acl>`);
* the TLS listeners' certificate, key and CA (new connections get them, connections
  already made keep theirs: :mod:`router.mqtt.certificates`);
* the limits file (the live MQTT limits: :mod:`router.mqtt.live_limits`).

Everything is read and checked first; only when every file could be used is anything
applied, so a file that does not parse leaves the node as it was, and the error names
the file and line. Connected clients stay connected whatever changed (``router clients
kick`` ends one now). Sources that are not files (``--auth-redis``, EMQX's Redis) keep
themselves current and are not reread; neither are the options themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.cluster.node import RouterNode
from router.core.passwords import PasswordFile
from router.mqtt.certificates import ServerCertificates
from router.mqtt.live_limits import changed, read_limits
from router.mqtt.server import MqttServer
from router.mqtt.settings import MqttSettings
from router.ops.auth_sources import AuthSources

if TYPE_CHECKING:
    from router.cluster.jwt_auth import JwtAuthenticator


class ProcessReloader:
    """The reloader of one node process (see the module docstring): call it to reload;
    it returns the words of what it loaded and raises the typed error of a file it
    could not use (:class:`PasswordFileError`, :class:`AclRuleError`,
    :class:`InvalidSettingError`), having changed nothing."""

    def __init__(
        self,
        node: RouterNode,
        sources: AuthSources,
        certificates: ServerCertificates | None,
        limits: tuple[str, MqttSettings] | None,
    ) -> None:
        """``limits``: the limits file and the settings of the options it amends. It
        reloads once it knows the listeners (:meth:`serving`)."""
        self._node = node
        self.sources = sources
        self._certificates = certificates
        self._limits = limits
        self._front: MqttServer | None = None
        #: The JWT authenticator, whose passwords that are not tokens go to the password file.
        self.jwt: JwtAuthenticator | None = None

    def serving(self, front: MqttServer) -> ProcessReloader:
        """This reloader, for the node's listeners ``front``."""
        self._front = front
        return self

    def passwords(self) -> PasswordFile:
        """The password file the node checks CONNECTs against now."""
        assert self.sources.passwords is not None  # (asked only when there is one)
        return self.sources.passwords

    def __call__(self) -> str:
        front = self._front
        assert front is not None  # (installed on the node with serving())
        sources = self.sources.reread()
        settings, changes = front.settings, {}
        if self._limits is not None:
            path, options = self._limits
            settings = read_limits(path, options)
            changes = changed(front.settings, settings)
        if self._certificates is not None:
            self._certificates.reload()  # (the last read: it applies itself once it succeeded)
        self.sources = sources
        if self.jwt is not None:
            self.jwt.passwords = sources.passwords
        if sources.acl is not None and sources.acl_file is not None:
            self._node.replace_acl(sources.acl)
        front.reconfigure(settings)
        told = self.describe()
        if self._limits is not None:
            moved = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changes.items())
            told += f" ({moved or 'no limit changed'})"
        return told or "nothing to reload: no password, ACL, TLS or limits file"

    def describe(self) -> str:
        """The words of what the node runs with now."""
        told = [self.sources.describe()]
        if self._certificates is not None:
            told.append(self._certificates.describe())
        if self._limits is not None:
            told.append(f"limits file {self._limits[0]}")
        return ", ".join(filter(None, told))
