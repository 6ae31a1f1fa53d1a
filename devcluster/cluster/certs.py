"""Certificates, keys and credentials for a throwaway loopback control plane (cryptography)."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from driver.webhook.certificates import subject_alt_names


@dataclass(frozen=True)
class ClusterCredentials:
    """Files the control plane and its clients use; all inside one temp directory."""

    ca_crt: Path
    serving_crt: Path
    serving_key: Path
    sa_key: Path  # service-account signing key (private)
    sa_pub: Path  # its public half, for token verification
    tokens_csv: Path  # static token file: admin in system:masters
    admin_token: str


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def generate(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> ClusterCredentials:
    """Create a CA, a serving cert for ``hosts``, an SA key pair and a token file in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    # EC P-256: generation takes ~1 ms vs ~50-200 ms for RSA-2048, which matters for start time.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("dranet-test-ca"))
        .issuer_name(_name("dranet-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = ec.generate_private_key(ec.SECP256R1())
    sans = subject_alt_names(hosts)
    srv = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-apiserver"))
        .issuer_name(ca.subject)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    creds = ClusterCredentials(
        ca_crt=directory / "ca.crt",
        serving_crt=directory / "serving.crt",
        serving_key=directory / "serving.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        tokens_csv=directory / "tokens.csv",
        admin_token=secrets.token_hex(16),
    )
    creds.ca_crt.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    creds.serving_crt.write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    _write_key(creds.serving_key, srv_key)
    _write_key(creds.sa_key, sa_key)
    creds.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    creds.tokens_csv.write_text(f'{creds.admin_token},admin,admin,"system:masters"\n')
    creds.tokens_csv.chmod(0o600)
    return creds


def kubeconfig_yaml(server: str, ca_crt: Path, token: str, name: str = "dranet-dev") -> str:
    """An admin kubeconfig (token auth) for ``server``."""
    return (
        f"apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n"
        f"    server: {server}\n    certificate-authority: {ca_crt}\n"
        f"users:\n- name: admin\n  user:\n    token: {token}\n"
        f"contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: admin\n"
        f"current-context: {name}\n"
    )
