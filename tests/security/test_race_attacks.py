"""Attacks that race: parallel guesses, a shared enrollment token, login floods, renewals."""

from __future__ import annotations

import base64
import sqlite3
import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.accounts import attempts, passwords
from app.accounts import service as accounts
from app.audit.service import SYSTEM
from app.clusters import service as clusters
from app.clusters.models import Certificate
from app.errors import DomainError, NotAuthenticated, TooManyAttempts
from app.main import create_app
from app.pki import service as pki
from app.settings import Settings
from support.platforms import Platform
from workers.switch.tls import load_crl, make_switch_key_and_csr

API = "/api/v1"


def race(n: int, attempt: Callable[[int], object]) -> list[object]:
    """Run `attempt(i)` in n threads released at once; what each returned or raised."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[i] = attempt(i)
        except Exception as exc:  # the outcome under test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_parallel_wrong_passwords_cannot_outrun_the_lockout(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    victim = platform.user()
    # room for every guess in the hashing gate: a 429 from a full gate would hide the count
    roomy = settings.model_copy(update={"password_hash_slots": 16})

    def guess(i: int) -> object:
        with platform.factory() as db:
            return accounts.login(
                db, email=victim.email, password=f"guess-{i}", ip=None, settings=roomy
            )

    outcomes = race(12, guess)
    checked = [o for o in outcomes if isinstance(o, NotAuthenticated)]
    locked = [o for o in outcomes if isinstance(o, TooManyAttempts)]
    assert len(checked) == settings.lockout_failures  # no more guesses were ever checked
    assert len(checked) + len(locked) == 12, outcomes


def test_one_enrollment_token_enrolls_one_switch(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    with platform.factory() as db:
        cluster = clusters.create(
            db, actor=SYSTEM, name="cluster-a", switch_host="127.0.0.1", switch_port=7101
        )
        _row, token = pki.create_enrollment_token(
            db, actor=SYSTEM, cluster=cluster, ttl=timedelta(minutes=5)
        )
        db.commit()
    csrs = [make_switch_key_and_csr("cluster-a")[1].decode() for _ in range(6)]

    def enroll(i: int) -> object:
        with platform.factory() as db:
            _cluster, certificate = pki.enroll(
                db, token=token, csr_pem=csrs[i], ip=None, settings=settings
            )
            db.commit()
            return certificate.serial

    outcomes = race(6, enroll)
    assert sum(isinstance(o, str) for o in outcomes) == 1
    assert all(isinstance(o, str | NotAuthenticated) for o in outcomes), outcomes


def test_the_password_hash_runs_holding_no_database_lock(
    client: TestClient, platform: Platform, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = platform.user()
    real_verify = passwords.verify_password
    probes: list[bool] = []
    database = settings.resolved_database_url

    def verify_while_probing(password: str, hashed: str, settings: Settings) -> bool:
        if database.startswith("sqlite"):
            # another writer takes the database's one write lock at once, or it is held
            other = sqlite3.connect(database.removeprefix("sqlite:///"), timeout=0)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.rollback()
                probes.append(True)
            except sqlite3.OperationalError:
                probes.append(False)
            finally:
                other.close()
        else:
            with platform.factory() as db:
                # the attempts' advisory lock is free while the hash runs
                probes.append(bool(db.scalar(pg_try_lock)))
                db.rollback()
        return real_verify(password, hashed, settings)

    pg_try_lock = text("SELECT pg_try_advisory_xact_lock(:k)").bindparams(
        k=attempts._ATTEMPTS_LOCK_KEY
    )
    monkeypatch.setattr(passwords, "verify_password", verify_while_probing)
    for password in ("wrong", "violet-harbor-cinnamon-42"):
        client.post(f"{API}/auth/login", json={"email": user.email, "password": password})
    assert probes == [True, True]


def test_distinct_unknown_emails_from_one_address_meet_a_limit(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"login_ip_failures": 3}))
    with TestClient(app) as client:
        answers = [
            client.post(f"{API}/auth/login", json={"email": f"x{i}@e.org", "password": "p"})
            for i in range(5)
        ]
    app.state.engine.dispose()
    assert [a.status_code for a in answers] == [401, 401, 401, 429, 429]


def _renew(
    db: Session, settings: Settings, key_pem: bytes, certificate_pem: str
) -> tuple[bytes, Certificate]:
    """Renew with proof of holding `key_pem`: the new key and its certificate."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    new_key, csr = make_switch_key_and_csr("cluster-a")
    renewed = pki.renew(
        db,
        certificate_pem=certificate_pem,
        csr_pem=csr.decode(),
        signature_b64=base64.b64encode(key.sign(csr, ec.ECDSA(hashes.SHA256()))).decode(),
        ip=None,
        settings=settings,
    )
    return new_key, renewed


def test_revoking_a_certificate_revokes_what_was_renewed_from_it(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    """A stolen key renewed itself twice before its certificate was revoked."""
    with platform.factory() as db:
        cluster = clusters.create(
            db, actor=SYSTEM, name="cluster-a", switch_host="127.0.0.1", switch_port=7101
        )
        key_pem, csr = make_switch_key_and_csr("cluster-a")
        chain = [
            pki.issue(db, actor=SYSTEM, cluster=cluster, csr_pem=csr.decode(), settings=settings)
        ]
        for _ in range(2):
            key_pem, renewed = _renew(db, settings, key_pem, chain[-1].certificate_pem)
            chain.append(renewed)
        db.commit()
        pki.revoke(db, actor=SYSTEM, serial=chain[0].serial, reason="key compromise")
        db.commit()
        revoked = {c.serial for c in chain if c.revoked_at is not None}
        crl = pki.crl_pem(db, settings)
    assert revoked == {c.serial for c in chain}
    ca_pem = client.get(f"{API}/pki/ca.pem").content
    assert {int(c.serial) for c in chain} <= load_crl(crl, ca_pem)
    with platform.factory() as db, pytest.raises(DomainError):
        _renew(db, settings, key_pem, chain[-1].certificate_pem)
