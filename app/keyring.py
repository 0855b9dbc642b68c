"""The platform's keys, each derived apart from the one platform secret.

Every purpose gets its own key (HKDF-SHA256 with a purpose label), so a key that
leaks gives nothing of the others: the dataset master key cannot unwrap the CA's
key, the audit chain's HMAC key cannot sign a job token. The platform secret itself
lives only in the control plane's settings (or var/secret_key), never in the
database and never on a cluster.
"""

from __future__ import annotations

from enum import StrEnum

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.settings import Settings

KEY_BYTES = 32


class Purpose(StrEnum):
    """What a derived key is for; the label is part of the derivation."""

    dataset_master = "dataset-master"  # wraps every workspace's data key
    ca_key_wrap = "ca-key-wrap"  # encrypts the CA's private key at rest
    job_token_key_wrap = "job-token-key-wrap"  # encrypts the job-token signing key
    audit_chain = "audit-chain"  # keys the audit log's hash chain
    audit_anchor = "audit-anchor"  # the anchor key of earlier releases (now a key file; migration)
    csrf = "csrf"  # binds CSRF tokens to sessions
    checkpoints = "checkpoints"  # derives each job's key for what it leaves on clusters
    row_seal = "row-seal"  # MACs the rows that confer access (app/seals.py)
    totp_seal = "totp-seal"  # encrypts users' TOTP secrets at rest
    totp_digest = "totp-digest"  # keys the digests of TOTP secrets and recovery codes
    broker_passwords = "broker-passwords"  # derives each cluster's RabbitMQ password


def derive(secret: bytes, purpose: Purpose) -> bytes:
    """The key for `purpose`, derived from `secret` (one-way: a key does not give `secret`)."""
    if not secret:
        raise ValueError("an empty secret derives no key")
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=f"nebula/{purpose}/v1".encode()
    ).derive(secret)


def subkey(settings: Settings, purpose: Purpose) -> bytes:
    """The key for `purpose` under the configured platform secret."""
    return derive(settings.secret(), purpose)


def job_checkpoint_key(settings: Settings, job_id: str) -> bytes:
    """The key a job's roles seal their files on the clusters with (one per job)."""
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=f"nebula/job/{job_id}".encode()
    ).derive(subkey(settings, Purpose.checkpoints))
