"""The TLS listeners' certificates reread while they listen (:mod:`router.mqtt.certificates`):
a reload replaces the certificate, the key and the CA that judges client certificates for
the connections made after it, and a file that cannot be used changes nothing."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.errors import InvalidSettingError
from router.mqtt.certificates import ServerCertificates, fingerprint
from tests.support.pki import Pki, make_pki


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    return make_pki(tmp_path_factory.mktemp("one")), make_pki(tmp_path_factory.mktemp("two"))


@pytest.fixture
async def served(
    pkis: tuple[Pki, Pki], tmp_path: Path
) -> AsyncIterator[tuple[ServerCertificates, int, tuple[Path, Path, Path]]]:
    """A TLS echo server on the first PKI's files (copied: the test rewrites them), client
    certificates required: (its certificates, its port, the cert, key and CA files)."""
    old = pkis[0]
    files = (tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem")
    for source, target in zip((old.server_cert, old.server_key, old.ca), files, strict=True):
        target.write_bytes(source.read_bytes())
    certificates = ServerCertificates(*map(str, files), require_client_cert=True)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read(10))
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=certificates.context)
    try:
        yield certificates, server.sockets[0].getsockname()[1], files
    finally:
        server.close()
        await server.wait_closed()


async def handshake(port: int, pki: Pki, trusted: Path | None = None) -> str:
    """Connect with ``pki``'s client certificate, trusting its CA (or ``trusted``); the
    SHA-256 of the server's certificate once it echoed (raises when the server refused)."""
    context = ssl.create_default_context(cafile=str(trusted or pki.ca))
    context.load_cert_chain(pki.client_cert, pki.client_key)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        writer.write(b"ping")
        assert await reader.read(10) == b"ping"  # (TLS 1.3: a refusal shows here)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return hashlib.sha256(der).hexdigest()
    finally:
        writer.close()


def digest(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


async def test_a_reload_replaces_certificate_key_and_ca_for_new_connections(
    served: tuple[ServerCertificates, int, tuple[Path, Path, Path]], pkis: tuple[Pki, Pki]
) -> None:
    certificates, port, files = served
    cert = files[0]
    old, new = pkis
    assert await handshake(port, old) == digest(old.server_cert)
    for source, target in zip((new.server_cert, new.server_key, new.ca), files, strict=True):
        target.write_bytes(source.read_bytes())
    assert f"SHA-256 {digest(new.server_cert).upper()[:16]}" in certificates.reload()
    assert certificates.fingerprint == fingerprint(str(cert))
    assert await handshake(port, new) == digest(new.server_cert)
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        await handshake(port, old, new.ca)  # (its client certificate: the CA replaced signed it)


async def test_a_file_that_cannot_be_used_changes_nothing(
    served: tuple[ServerCertificates, int, tuple[Path, Path, Path]], pkis: tuple[Pki, Pki]
) -> None:
    certificates, port, (_, key, ca) = served
    old, new = pkis
    key.write_bytes(new.server_key.read_bytes())  # (not the key of the certificate)
    with pytest.raises(InvalidSettingError, match=str(key)):
        certificates.reload()
    ca.write_text("not a certificate\n")
    key.write_bytes(old.server_key.read_bytes())
    with pytest.raises(InvalidSettingError, match="TLS CA file"):
        certificates.reload()
    assert await handshake(port, old) == digest(old.server_cert)
