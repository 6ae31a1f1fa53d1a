"""The webhook server's TLS files: from ``--tls-cert``/``--tls-key``, or a self-signed CA and
server certificate generated at start (SANs: ``--host``, 127.0.0.1, localhost), and the CA
bundle a managed configuration hands the API server."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509


@dataclass(frozen=True)
class TLSFiles:
    """The server's certificate and key files, and the CA bundle clients need (PEM)."""

    certfile: str
    keyfile: str
    cadata: bytes | None


def given(tls_cert: str, tls_key: str) -> TLSFiles:
    """The files from ``--tls-cert``/``--tls-key``; nothing is written (read-only root filesystem).

    caBundle for a managed configuration: a ca.crt next to the certificate (as in a
    cert-manager or kubernetes.io/tls secret mount), else the certificate file itself
    (right for a self-signed leaf or a file holding the chain up to the CA).
    """
    ca_file = Path(tls_cert).with_name("ca.crt")
    cadata = (ca_file if ca_file.exists() else Path(tls_cert)).read_bytes()
    return TLSFiles(tls_cert, tls_key, cadata)


def subject_alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """A certificate's SANs for ``hosts``: an IP address entry for an IP, a DNS name otherwise."""
    from cryptography import x509  # imported when a certificate is made, not by every importer

    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return sans


def self_signed(directory: Path, hosts: list[str]) -> TLSFiles:
    """A throwaway CA and a server certificate for ``hosts`` (IPs or DNS names), valid 1 year."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dra.net webhook CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = subject_alt_names(dict.fromkeys(hosts))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.touch(mode=0o600)
    keyfile.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cadata = ca.public_bytes(serialization.Encoding.PEM)
    (directory / "ca.crt").write_bytes(cadata)
    return TLSFiles(str(certfile), str(keyfile), cadata)
