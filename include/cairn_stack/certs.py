"""TLS material for the stack's secured Kafka listener: a private CA and a server certificate.

Generated once, at the first start, into the Kafka state folder, and kept: clients trust the CA
file (`StackSettings.kafka_ca_file`). The broker reads PEM directly (`ssl.keystore.type=PEM`), so
no keystore tool and no keystore password are needed: the server key is unencrypted PKCS#8 in a
file only its owner can read. Tests also use `make_ca` for a CA the broker never heard of.

docker-compose.yml runs `python -m cairn_stack.certs /certs localhost 127.0.0.1 kafka
--readable` once, into a volume the broker mounts: there the broker runs as another user.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_FOR = timedelta(days=3650)
CA_FILE = "ca.pem"
KEYSTORE_FILE = "server-keystore.pem"
"""The broker's key (PKCS#8) and certificate chain, in one PEM file."""


class CA(NamedTuple):
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def make_ca(name: str = "Cairn local CA") -> CA:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return CA(key, cert)


def pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def ensure_server_tls(folder: Path, hosts: list[str], readable: bool = False) -> tuple[Path, Path]:
    """The CA file clients trust and the broker's PEM keystore (key + chain), made if missing.

    `hosts` (IP addresses or DNS names) go into the certificate's subject alternative names, so
    clients that verify the host name (librdkafka and Java both do by default) accept it.
    """
    ca_file, keystore = folder / CA_FILE, folder / KEYSTORE_FILE
    if ca_file.exists() and keystore.exists():
        return ca_file, keystore
    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca()
    key = ec.generate_private_key(ec.SECP256R1())
    names = [_alt_name(h) for h in dict.fromkeys(hosts)]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    cert = (
        _builder(subject, ca.cert.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,  # Kafka's PEM keystore reads PKCS#8 only
        serialization.NoEncryption(),
    ).decode()
    keystore.write_text(key_pem + pem(cert) + pem(ca.cert))
    os.chmod(keystore, 0o644 if readable else 0o600)
    ca_file.write_text(pem(ca.cert))  # last: its presence means the pair is complete
    return ca_file, keystore


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
    )


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make the secured Kafka listener's CA and key.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("hosts", nargs="+", help="names and addresses clients connect to")
    parser.add_argument(
        "--readable", action="store_true", help="let other users read the key (containers)"
    )
    args = parser.parse_args(argv)
    ca_file, keystore = ensure_server_tls(args.folder, args.hosts, args.readable)
    print(f"CA {ca_file}, broker keystore {keystore}")


if __name__ == "__main__":
    main()
