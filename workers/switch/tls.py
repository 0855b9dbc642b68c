"""TLS for switches: keys and CSRs made on the switch, SSL contexts, peer and CRL checks.

Everything here runs on a cluster and needs only files: the switch's key and
certificate, the platform CA certificate and the CRL. The control plane's side
of the PKI (signing, revoking) is `app/pki/ca.py`.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509

# the rules both sides of the PKI apply live in the contract
from contract.certs import CrlInfo as CrlInfo
from contract.certs import load_crl as load_crl
from contract.certs import make_switch_key_and_csr as make_switch_key_and_csr
from contract.certs import needs_renewal as needs_renewal
from contract.certs import read_crl as read_crl
from contract.certs import validate_cluster_name as validate_cluster_name

# TLS 1.2 suites allowed when 1.3 cannot be had: forward secret and AEAD only.
# TLS 1.3 suites are all AEAD, so OpenSSL's defaults stand there.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class PeerRejected(Exception):
    """The other end of a TLS connection is not who it must be (name, revocation)."""


@dataclass(frozen=True)
class PeerIdentity:
    """Who the other end proved to be: its cluster names (SAN DNS), serial and expiry."""

    names: frozenset[str]
    serial: int
    not_after: datetime


def identity_of(cert_der: bytes) -> PeerIdentity:
    """Cluster names, serial and expiry of a DER certificate."""
    cert = x509.load_der_x509_certificate(cert_der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = frozenset(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = frozenset()
    return PeerIdentity(names=names, serial=cert.serial_number, not_after=cert.not_valid_after_utc)


def check_peer(
    sock: ssl.SSLSocket, *, expected_cluster: str, revoked: frozenset[int]
) -> PeerIdentity:
    """Check a verified peer's certificate names `expected_cluster` and is not revoked."""
    der = sock.getpeercert(binary_form=True)
    if not der:
        raise PeerRejected("peer sent no certificate")
    identity = identity_of(der)
    if expected_cluster not in identity.names:
        raise PeerRejected(
            f"certificate names {sorted(identity.names)}, expected cluster {expected_cluster!r}"
        )
    if identity.serial in revoked:
        raise PeerRejected(f"certificate serial {identity.serial} is revoked")
    return identity


def _harden(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return context


def server_context(
    *, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str], ca_path: str | None
) -> ssl.SSLContext:
    """Server context: TLS >= 1.2, AEAD only; with `ca_path`, a client certificate is required."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    context.load_cert_chain(os.fspath(cert_path), os.fspath(key_path))
    if ca_path is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=os.fspath(ca_path))
    return context


def client_context(
    *,
    ca_path: str | os.PathLike[str],
    cert_path: str | os.PathLike[str] | None = None,
    key_path: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """Client context: verifies the server against the CA; presents a certificate when given."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    # The expected cluster name is checked on the SAN by check_peer, not by hostname matching.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=os.fspath(ca_path))
    if cert_path is not None and key_path is not None:
        context.load_cert_chain(os.fspath(cert_path), os.fspath(key_path))
    return context
