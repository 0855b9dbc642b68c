"""The platform's keys are derived apart: one key that leaks opens nothing of the others."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.clusters.models import PlatformKey
from app.keyring import Purpose, derive, subkey
from app.pki import ca
from app.pki import service as pki
from app.settings import Settings
from app.workspaces import storage


def test_every_purpose_has_its_own_key() -> None:
    keys = {purpose: derive(b"one platform secret", purpose) for purpose in Purpose}
    assert len(set(keys.values())) == len(Purpose)
    assert all(len(key) == 32 for key in keys.values())
    assert storage.master_key(b"one platform secret") not in keys.values()
    with pytest.raises(ValueError):
        derive(b"", Purpose.csrf)


def test_the_stored_ca_and_job_token_keys_open_only_with_their_own_derived_key(
    client: TestClient, db_factory: sessionmaker[Session], settings: Settings
) -> None:
    with db_factory() as db:
        ca_row = db.get(PlatformKey, pki.ROOT_CA)
        job_row = db.get(PlatformKey, pki.JOB_TOKEN_KEY)
    assert ca_row is not None and job_row is not None
    ca.load_encrypted_private_key(ca_row.encrypted_key, subkey(settings, Purpose.ca_key_wrap))
    ca.load_job_token_private_key(
        job_row.encrypted_key, subkey(settings, Purpose.job_token_key_wrap)
    )
    others = [
        settings.secret(),
        storage.master_key(settings.secret()),
        subkey(settings, Purpose.job_token_key_wrap),
        subkey(settings, Purpose.audit_chain),
    ]
    for wrong in others:
        with pytest.raises(ca.CertificateError):
            ca.load_encrypted_private_key(ca_row.encrypted_key, wrong)


def test_a_key_stored_under_the_bare_secret_is_wrapped_again_at_start_up(
    client: TestClient, db_factory: sessionmaker[Session], settings: Settings
) -> None:
    with db_factory() as db:
        row = db.get(PlatformKey, pki.JOB_TOKEN_KEY)
        assert row is not None
        key = ca.load_job_token_private_key(
            row.encrypted_key, subkey(settings, Purpose.job_token_key_wrap)
        )
        row.encrypted_key = ca.encrypt_private_key(key, settings.secret())  # the old way
        db.commit()
    pki.ensure_platform_keys(db_factory, settings)
    with db_factory() as db:
        row = db.get(PlatformKey, pki.JOB_TOKEN_KEY)
        assert row is not None
        again = ca.load_job_token_private_key(
            row.encrypted_key, subkey(settings, Purpose.job_token_key_wrap)
        )
    assert ca.job_token_public_key_pem(again) == ca.job_token_public_key_pem(key)
