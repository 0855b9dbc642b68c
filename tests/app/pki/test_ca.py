"""The CA core: root CA, CSR signing and its refusals, CRLs, renewal, job tokens."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.pki import ca
from contract.jobtoken import unverified_claims

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def root() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    return ca.create_root_ca("Test CA")


def test_root_ca_is_a_ca_that_signs_certificates_and_crls(root: tuple) -> None:
    _, cert = root
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign


def test_ca_key_round_trips_encrypted_and_refuses_the_wrong_secret(root: tuple) -> None:
    key, _ = root
    blob = ca.encrypt_private_key(key, b"platform secret")
    assert b"ENCRYPTED PRIVATE KEY" in blob
    loaded = ca.load_encrypted_private_key(blob, b"platform secret")
    assert loaded.private_numbers() == key.private_numbers()  # type: ignore[union-attr]
    with pytest.raises(ca.CertificateError):
        ca.load_encrypted_private_key(blob, b"another secret")


def test_signed_certificate_carries_name_serial_validity_and_usages(root: tuple) -> None:
    key, cert = root
    switch_key_pem, csr_pem = ca.make_switch_key_and_csr("cluster-a")
    pem = ca.sign_csr(key, cert, csr_pem, cluster_name="cluster-a", serial=1234, now=NOW)
    leaf = x509.load_pem_x509_certificate(pem)
    assert leaf.serial_number == 1234
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cluster-a"
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["cluster-a"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    validity = leaf.not_valid_after_utc - NOW
    assert timedelta(days=30) - timedelta(seconds=1) <= validity <= timedelta(days=30)
    leaf.verify_directly_issued_by(cert)
    assert ca.certificate_info(pem)["serial"] == 1234
    # the key stays with the switch: the certificate holds its public half only
    switch_key = serialization.load_pem_private_key(switch_key_pem, None)
    assert leaf.public_key() == switch_key.public_key()


def test_openssl_accepts_the_chain_for_tls(root: tuple, tmp_path) -> None:
    key, cert = root
    key_pem, csr_pem = ca.make_switch_key_and_csr("cluster-a")
    (tmp_path / "k").write_bytes(key_pem)
    (tmp_path / "c").write_bytes(ca.sign_csr(key, cert, csr_pem, cluster_name="cluster-a"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c", tmp_path / "k")


def test_csr_with_another_name_is_refused(root: tuple) -> None:
    key, cert = root
    _, csr_pem = ca.make_switch_key_and_csr("cluster-b")
    with pytest.raises(ca.CertificateError, match="expected"):
        ca.sign_csr(key, cert, csr_pem, cluster_name="cluster-a")


def test_csr_with_bad_signature_is_refused(root: tuple) -> None:
    key, cert = root
    _, good = ca.make_switch_key_and_csr("cluster-a")
    der = x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER)
    # rename the subject after signing: the structure parses, the self-signature fails
    tampered = x509.load_der_x509_csr(der.replace(b"cluster-a", b"cluster-b"))
    pem = tampered.public_bytes(serialization.Encoding.PEM)
    with pytest.raises(ca.CertificateError, match="signature"):
        ca.sign_csr(key, cert, pem, cluster_name="cluster-b")


def test_csr_with_a_weak_or_rsa_key_and_bad_names_are_refused(root: tuple) -> None:
    key, cert = root
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cluster-a")]))
        .sign(rsa_key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    with pytest.raises(ca.CertificateError, match="EC keys"):
        ca.sign_csr(key, cert, csr, cluster_name="cluster-a")
    with pytest.raises(ValueError):
        ca.sign_csr(key, cert, csr, cluster_name="Cluster A/..")
    with pytest.raises(ca.CertificateError):
        ca.sign_csr(key, cert, b"garbage", cluster_name="cluster-a")


def test_crl_lists_revoked_serials_and_is_verified_against_the_ca(root: tuple) -> None:
    key, cert = root
    crl = ca.build_crl(
        key, cert, [(7, NOW), (9, NOW)], next_update=NOW + timedelta(days=1), now=NOW
    )
    assert ca.load_crl(crl, ca.certificate_pem(cert), now=NOW) == {7, 9}
    other_key, other_cert = ca.create_root_ca("Other CA")
    foreign = ca.build_crl(other_key, other_cert, [], next_update=NOW + timedelta(days=1), now=NOW)
    with pytest.raises(ValueError):
        ca.load_crl(foreign, ca.certificate_pem(cert), now=NOW)
    # same issuer name, another key: the signature check catches it
    impostor_key, impostor_cert = ca.create_root_ca("Test CA")
    forged = ca.build_crl(impostor_key, impostor_cert, [], next_update=NOW + timedelta(days=1))
    with pytest.raises(ValueError, match="signature"):
        ca.load_crl(forged, ca.certificate_pem(cert))


def test_renewal_is_due_when_less_than_a_third_of_validity_is_left(root: tuple) -> None:
    key, cert = root
    _, csr = ca.make_switch_key_and_csr("cluster-a")
    pem = ca.sign_csr(key, cert, csr, cluster_name="cluster-a", valid_days=30, now=NOW)
    assert not ca.needs_renewal(pem, NOW + timedelta(days=19))
    assert ca.needs_renewal(pem, NOW + timedelta(days=21))


def test_job_tokens_verify_and_refuse_tampering_expiry_and_foreign_keys() -> None:
    key = ca.make_job_token_key()
    public = ca.load_job_token_public_key(ca.job_token_public_key_pem(key))
    token = ca.sign_job_token(
        key, job_id="42", role="G", cluster="cluster-a", expires_at=2_000, placement={"D": "b"}
    )
    claims = ca.verify_job_token(token, public, now=1_000)
    assert (claims.job_id, claims.role, claims.cluster, claims.expires_at) == (
        "42",
        "G",
        "cluster-a",
        2_000,
    )
    assert claims.placement == {"D": "b"}
    assert unverified_claims(token) == claims
    with pytest.raises(ca.JobTokenError, match="expired"):
        ca.verify_job_token(token, public, now=2_000)
    body, sig = token.split(".")
    forged_body = ca.sign_job_token(
        key, job_id="43", role="G", cluster="cluster-a", expires_at=2_000
    )
    with pytest.raises(ca.JobTokenError, match="signature"):
        ca.verify_job_token(forged_body.split(".")[0] + "." + sig, public, now=1_000)
    foreign = ca.sign_job_token(
        ca.make_job_token_key(), job_id="42", role="G", cluster="cluster-a", expires_at=2_000
    )
    with pytest.raises(ca.JobTokenError, match="signature"):
        ca.verify_job_token(foreign, public, now=1_000)
    for junk in ["", "a.b.c", "!!!.???", body]:
        with pytest.raises(ca.JobTokenError):
            ca.verify_job_token(junk, public, now=1_000)


def test_job_token_key_round_trips_encrypted() -> None:
    key = ca.make_job_token_key()
    blob = ca.encrypt_private_key(key, b"s3cret")
    assert ca.load_job_token_private_key(blob, b"s3cret").public_key() == key.public_key()
