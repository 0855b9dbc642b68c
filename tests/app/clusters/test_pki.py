"""Clusters and the certificate manager through the API: issue, enroll, renew, revoke, CRL."""

from __future__ import annotations

import base64
from datetime import timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.accounts.models import Role
from app.clusters.models import EnrollmentToken
from app.db import utcnow
from support.platforms import Account, Platform
from workers.switch.tls import load_crl, make_switch_key_and_csr


def _cluster(client: TestClient, admin: Account, name: str = "cluster-a") -> dict:
    answer = client.post(
        "/api/v1/clusters",
        json={"name": name, "switch_host": "127.0.0.1", "switch_port": 7101},
        headers=admin.headers,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_admin_registers_clusters_everyone_signed_in_reads_them(
    client: TestClient, platform: Platform
) -> None:
    admin, member = platform.user(Role.admin), platform.user()
    cluster = _cluster(client, admin)
    assert cluster["has_valid_certificate"] is False
    body = {"name": "cluster-b", "switch_host": "h", "switch_port": 1}
    assert client.post("/api/v1/clusters", json=body, headers=member.headers).status_code == 403
    assert client.get("/api/v1/clusters", headers=member.headers).json()["total"] == 1
    assert client.get("/api/v1/clusters").status_code == 401
    duplicate = {"name": "cluster-a", "switch_host": "h", "switch_port": 1}
    assert client.post("/api/v1/clusters", json=duplicate, headers=admin.headers).status_code == 409
    bad = {"name": "Cluster_A", "switch_host": "h", "switch_port": 1}
    assert client.post("/api/v1/clusters", json=bad, headers=admin.headers).status_code == 422


def test_the_ca_signs_a_csr_and_never_sees_the_key(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    cluster = _cluster(client, admin)
    key_pem, csr_pem = make_switch_key_and_csr("cluster-a")
    issued = client.post(
        f"/api/v1/clusters/{cluster['id']}/csr",
        json={"csr_pem": csr_pem.decode()},
        headers=admin.headers,
    )
    assert issued.status_code == 201, issued.text
    cert = x509.load_pem_x509_certificate(issued.json()["certificate_pem"].encode())
    ca = x509.load_pem_x509_certificate(client.get("/api/v1/pki/ca.pem").content)
    cert.verify_directly_issued_by(ca)
    assert cert.subject.rfc4514_string() == "CN=cluster-a"
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 29 <= days <= 30
    listed = client.get(
        f"/api/v1/clusters/{cluster['id']}/certificates", headers=admin.headers
    ).json()
    assert listed["items"][0]["serial"] == issued.json()["serial"]
    assert client.get(f"/api/v1/clusters/{cluster['id']}", headers=admin.headers).json()[
        "has_valid_certificate"
    ]
    # a CSR naming another cluster is refused
    _key, other_csr = make_switch_key_and_csr("cluster-b")
    wrong = client.post(
        f"/api/v1/clusters/{cluster['id']}/csr",
        json={"csr_pem": other_csr.decode()},
        headers=admin.headers,
    )
    assert wrong.status_code == 422
    garbage = client.post(
        f"/api/v1/clusters/{cluster['id']}/csr", json={"csr_pem": "hello"}, headers=admin.headers
    )
    assert garbage.status_code == 422  # the schema's PEM pattern refuses it before any work


def test_enrollment_token_is_single_use_and_expires(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    cluster = _cluster(client, admin)
    minted = client.post(
        f"/api/v1/clusters/{cluster['id']}/enrollment-tokens", headers=admin.headers
    )
    assert minted.status_code == 201  # no body: the default lifetime
    token = minted.json()["token"]
    _key, csr = make_switch_key_and_csr("cluster-a")
    first = client.post("/api/v1/pki/enroll", json={"token": token, "csr_pem": csr.decode()})
    assert first.status_code == 201
    again = client.post("/api/v1/pki/enroll", json={"token": token, "csr_pem": csr.decode()})
    assert again.status_code == 401
    late = client.post(
        f"/api/v1/clusters/{cluster['id']}/enrollment-tokens", json={}, headers=admin.headers
    ).json()["token"]
    with platform.factory() as db:
        db.execute(update(EnrollmentToken).values(expires_at=utcnow() - timedelta(seconds=1)))
        db.commit()
    assert (
        client.post("/api/v1/pki/enroll", json={"token": late, "csr_pem": csr.decode()}).status_code
        == 401
    )
    assert (
        client.post(
            "/api/v1/pki/enroll", json={"token": "nbe_guess", "csr_pem": csr.decode()}
        ).status_code
        == 401
    )
    # enrollment tokens are for admins to make
    member = platform.user()
    assert (
        client.post(
            f"/api/v1/clusters/{cluster['id']}/enrollment-tokens", json={}, headers=member.headers
        ).status_code
        == 403
    )


def _issue(client: TestClient, admin: Account, cluster_id: str) -> tuple[bytes, dict]:
    key_pem, csr_pem = make_switch_key_and_csr("cluster-a")
    issued = client.post(
        f"/api/v1/clusters/{cluster_id}/csr",
        json={"csr_pem": csr_pem.decode()},
        headers=admin.headers,
    ).json()
    return key_pem, issued


def _renewal(key_pem: bytes, cert_pem: str) -> dict[str, str]:
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    _new_key, csr = make_switch_key_and_csr("cluster-a")
    signature = key.sign(csr, ec.ECDSA(hashes.SHA256()))
    return {
        "certificate_pem": cert_pem,
        "csr_pem": csr.decode(),
        "signature": base64.b64encode(signature).decode(),
    }


def test_renewal_needs_proof_of_the_current_key(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    cluster = _cluster(client, admin)
    key_pem, issued = _issue(client, admin, cluster["id"])
    renewed = client.post("/api/v1/pki/renew", json=_renewal(key_pem, issued["certificate_pem"]))
    assert renewed.status_code == 201 and renewed.json()["serial"] != issued["serial"]
    stranger_key, _ = make_switch_key_and_csr("cluster-a")
    forged = client.post(
        "/api/v1/pki/renew", json=_renewal(stranger_key, issued["certificate_pem"])
    )
    assert forged.status_code == 401


def test_revocation_enters_the_signed_crl_and_blocks_renewal(
    client: TestClient, platform: Platform
) -> None:
    admin = platform.user(Role.admin)
    cluster = _cluster(client, admin)
    key_pem, issued = _issue(client, admin, cluster["id"])
    ca_pem = client.get("/api/v1/pki/ca.pem").content
    assert int(issued["serial"]) not in load_crl(client.get("/api/v1/pki/crl.pem").content, ca_pem)
    revoked = client.post(
        f"/api/v1/certificates/{issued['serial']}/revoke",
        json={"reason": "key compromise"},
        headers=admin.headers,
    )
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert int(issued["serial"]) in load_crl(client.get("/api/v1/pki/crl.pem").content, ca_pem)
    assert (
        client.post(
            f"/api/v1/certificates/{issued['serial']}/revoke",
            json={"reason": "again"},
            headers=admin.headers,
        ).status_code
        == 409
    )
    assert (
        client.post(
            "/api/v1/certificates/12345/revoke", json={"reason": "x"}, headers=admin.headers
        ).status_code
        == 404
    )
    assert (
        client.post(
            "/api/v1/pki/renew", json=_renewal(key_pem, issued["certificate_pem"])
        ).status_code
        == 401
    )
    assert not client.get(f"/api/v1/clusters/{cluster['id']}", headers=admin.headers).json()[
        "has_valid_certificate"
    ]
    actions = {
        e["action"]
        for e in client.get("/api/v1/audit?limit=500", headers=admin.headers).json()["items"]
    }
    assert {"cluster.create", "pki.certificate.issue", "pki.certificate.revoke"} <= actions


def test_ca_key_is_stored_encrypted(client: TestClient, platform: Platform) -> None:
    client.get("/api/v1/pki/ca.pem")
    from sqlalchemy import select

    from app.clusters.models import PlatformKey

    with platform.factory() as db:
        rows = db.scalars(select(PlatformKey)).all()
    assert {r.name for r in rows} == {"root_ca", "job_token"}
    assert all(b"ENCRYPTED PRIVATE KEY" in r.encrypted_key for r in rows)
