"""Certificates for the TLS tests, made by openssl: a CA, a server certificate for
127.0.0.1 and a client certificate, signed by it."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_pki(folder: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, in ``folder``."""
    ca_key, ca = folder / "ca.key", folder / "ca.pem"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        ca_key,
        "-out",
        ca,
        "-days",
        "2",
        "-subj",
        "/CN=router test CA",
    )
    made = {}
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", None)):
        key, request, cert = (folder / f"{name}.{s}" for s in ("key", "csr", "pem"))
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            request,
            "-subj",
            f"/CN={name}",
        )
        extra: list[str | Path] = []
        if extension:
            (folder / "ext.cnf").write_text(extension + "\n")
            extra = ["-extfile", folder / "ext.cnf"]
        openssl(
            "x509",
            "-req",
            "-in",
            request,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            *extra,
        )
        made[name] = (cert, key)
    return Pki(ca, *made["server"], *made["client"])
