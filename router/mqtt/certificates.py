"""The certificate of a node's TLS listeners (``mqtts``, ``wss``), reread while they listen.

A listener is given one :class:`ssl.SSLContext` when it opens, and asyncio keeps it.
:class:`ServerCertificates` gives every TLS listener the same *listening* context and
keeps a *current* one beside it; the listening context's SNI callback, which OpenSSL
calls in every handshake (with a server name or without), hands the handshake to the
current context. :meth:`ServerCertificates.reload` builds a whole new context from the
files (certificate chain, key, CA: :func:`~router.mqtt.server.tls_context`) and makes it
current only when every file could be used; so a connection made after a reload gets
the new certificate and the new CA's judgement, one already made keeps what it
negotiated, and a bad file changes nothing (:class:`InvalidSettingError`, naming it).
Whether client certificates are required is decided when the node starts.
"""

from __future__ import annotations

import hashlib
import ssl

from router.errors import InvalidSettingError
from router.mqtt.server import tls_context


def fingerprint(cert_file: str) -> str:
    """The SHA-256 digest of the first certificate of a PEM file (its DER bytes), in
    upper-case hex; :class:`InvalidSettingError`."""
    try:
        with open(cert_file, encoding="ascii") as pem:
            der = ssl.PEM_cert_to_DER_cert(pem.read())
    except (OSError, ValueError) as error:
        raise InvalidSettingError(f"TLS certificate {cert_file}: {error}") from None
    return hashlib.sha256(der).hexdigest().upper()


class ServerCertificates:
    """The TLS contexts of one node's listeners (see the module docstring): pass
    :attr:`context` to them. Raises :class:`InvalidSettingError` for a file that cannot
    be used."""

    def __init__(
        self, cert: str, key: str, ca: str | None = None, *, require_client_cert: bool = False
    ) -> None:
        self._files = (cert, key, ca)
        self._require = require_client_cert
        self.context = tls_context(cert, key, ca, require_client_cert=require_client_cert)
        self.fingerprint = fingerprint(cert)
        self._current = self.context
        self.context.sni_callback = self._hand_over

    def _hand_over(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, context: ssl.SSLContext
    ) -> None:
        if self._current is not context:
            connection.context = self._current

    def reload(self) -> str:
        """Read the files again and serve new connections with them; returns the words of
        what was loaded. :class:`InvalidSettingError` (and nothing changed) for a file
        that cannot be used."""
        cert, key, ca = self._files
        context = tls_context(cert, key, ca, require_client_cert=self._require)
        self.fingerprint, self._current = fingerprint(cert), context
        return self.describe()

    def describe(self) -> str:
        cert, _, ca = self._files
        with_ca = "" if ca is None else f", CA {ca}"
        return f"TLS certificate {cert} (SHA-256 {self.fingerprint[:16]}...){with_ca}"
