"""certs/: generation, Secret ensure/renewal and caBundle injection against the API double, and
hot reload of rotated files under a running server."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import ipaddress
import json
import re
import socket
import ssl
import subprocess
import sys
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from kubernetes.client.exceptions import ApiException

from certs.cluster import (
    MANAGED_BY,
    ForeignSecret,
    ensure_secret,
    inject_ca_bundle,
    read_ca_from_secret,
    read_certificates,
    restart_on_change,
)
from kube.tls import (
    Bundle,
    CertificatePaths,
    ca_usable,
    generate,
    issue,
    problems_with,
    service_hosts,
    serving_pair_problem,
    unexpired_certificates,
)
from tests.conftest import ROOT, RunningWebhook, expiry_samples

HOSTS = service_hosts("oversale-webhook", "oversale")


def load(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(cert):
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(names.get_values_for_type(x509.DNSName)), set(names.get_values_for_type(x509.IPAddress))


def test_generate_cli_writes_an_ecdsa_pair_with_service_sans(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "certs", "generate", "--dir", str(tmp_path), "--service", "oversale-webhook",
         "--namespace", "oversale", "--host", "localhost", "--host", "127.0.0.1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    cert, ca = load(tmp_path / "tls.crt"), load(tmp_path / "ca.crt")
    dns, ips = sans(cert)
    assert dns == {*HOSTS, "localhost"}
    assert ips == {ipaddress.ip_address("127.0.0.1")}
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    cert.verify_directly_issued_by(ca)
    # Valid from 5 minutes back, for clocks a little behind ours.
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=365, minutes=5)
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == datetime.timedelta(days=3650, minutes=5)
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600


def test_a_key_is_written_readable_by_its_owner_only_over_a_temporary_file_left_behind(tmp_path):
    """Files are written to a temporary name and renamed; a temporary key a crash left behind,
    readable by all, must not hand its mode to the new key."""
    left_behind = tmp_path / ".tls.key.tmp"
    left_behind.write_bytes(b"half a key")
    left_behind.chmod(0o644)
    paths = generate(tmp_path, ["localhost"])
    assert paths.key.stat().st_mode & 0o777 == 0o600
    assert paths.cert.stat().st_mode & 0o777 == paths.ca.stat().st_mode & 0o777 == 0o644
    assert not left_behind.exists()


def test_generate_cli_rejects_missing_names(tmp_path):
    result = subprocess.run([sys.executable, "-m", "certs", "generate", "--dir", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--service" in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("names", "said"), [
    (["--host", ""], "empty"), (["--host", "bad host"], "neither an IP address nor a DNS name"),
    (["--host", "web.svc "], "with spaces around it"),
    (["--service", "web hook"], "Service name 'web hook' is not one Kubernetes accepts"),
    (["--service", "Web"], "Service name 'Web'"), (["--service", "web", "--namespace", "Prod"], "namespace 'Prod'"),
    (["--host", "under_score.svc"], "neither"),
    (["--host", "a" * 63 + ".svc"], "at most 64 characters"),
    (["--host", "localhost", "--ca-days", "1", "--days", "30"], "--days 30 outlives --ca-days 1"),
])
def test_generate_cli_refuses_names_no_client_could_match_and_writes_nothing(tmp_path, names, said):
    result = subprocess.run([sys.executable, "-m", "certs", "generate", "--dir", str(tmp_path), *names], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "said"), [
    ([], "python -m certs: error: the following arguments are required: command"),
    (["generate", "--host", "h"], "python -m certs generate: error: the following arguments are required: --dir"),
    (["generate", "--dir", "{tmp}", "--host", "h", "--days", "0"], "--days must be at least 1"),
    (["ensure", "--service", "x"], "python -m certs ensure: error: the following arguments are required: --secret"),
    (["ensure", "--secret", "a/b", "--service", "x", "--renew-fraction", "1"], "--renew-fraction must be"),
    (["ensure", "--secret", "a/b", "--service", "x", "--renew-fraction", "0"], "--renew-fraction must be"),
    (["restart-on-change", "--secret", "a/b"], "the following arguments are required: --restart"),
    (["restart-on-change", "--restart", "a/b"], "the following arguments are required: --secret"),
    (["inject", "--secret", "a/b"], "the following arguments are required: --webhook"),
    (["inject", "--webhook", "x"], "one of the arguments --secret --ca-file is required"),
    (["ensure", "--secret", "/b", "--service", "x"], "expected NAMESPACE/NAME, got '/b'"),
    (["ensure", "--secret", "a/b/c", "--service", "x"], "expected NAMESPACE/NAME, got 'a/b/c'"),
    (["ensure", "--secret", "a/b"], "give --service and/or --host"),
    (["ensure", "--secret", "a/b", "--host", "bad host"], "host 'bad host' is neither an IP address nor a DNS name"),
    # A client certificate's name is an identity, any text: past the names, on to the cluster.
    (["ensure", "--secret", "a/b", "--client", "--host", "system:kube-scheduler"],
     "error: no in-cluster config and no kubeconfig: ensure needs an API server"),
])
def test_each_certs_command_names_a_bad_argument_before_it_reaches_a_cluster(tmp_path, args, said):
    env = {"KUBECONFIG": str(tmp_path / "no-kubeconfig"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "certs", *(a.format(tmp=tmp_path) for a in args)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


def test_generate_names_a_service_in_the_default_namespace_unless_told(tmp_path):
    # A certificate may end with its CA, not after it.
    result = subprocess.run([sys.executable, "-m", "certs", "generate", "--dir", str(tmp_path), "--service", "web",
                             "--days", "30", "--ca-days", "30"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert sans(load(tmp_path / "tls.crt")) == (set(service_hosts("web", "default")), set())
    assert result.stdout == (f"wrote {tmp_path}/ca.crt, {tmp_path}/tls.crt, {tmp_path}/tls.key for web, web.default, "
                             "web.default.svc, web.default.svc.cluster.local\n")


def test_serving_names_may_be_ips_and_wildcards_and_a_client_name_any_identity():
    bundle = issue(["*.oversale.svc", "10.0.0.1", "::1", "a" * 63])
    longest = x509.load_pem_x509_certificate(issue(["a" * 60 + ".svc"]).cert)  # X.509's longest common name
    assert longest.subject.rfc4514_string() == "CN=" + "a" * 60 + ".svc"
    longest_dns = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # DNS's longest name: 253 characters
    issue(["web.svc", longest_dns])
    with pytest.raises(ValueError, match="neither an IP address nor a DNS name"):
        issue(["web.svc", longest_dns + "d"])
    names = x509.load_pem_x509_certificate(bundle.cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["*.oversale.svc", "a" * 63]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("::1")]
    client = x509.load_pem_x509_certificate(issue(["system:kube-scheduler"], client=True).cert)
    assert client.subject.rfc4514_string() == "CN=system:kube-scheduler"
    with pytest.raises(ValueError, match="system:kube-scheduler"):
        issue(["system:kube-scheduler"])  # as a serving name no client could dial it


def test_each_certificate_may_be_used_only_for_what_it_is_for():
    """Clients check a certificate's extensions: the CA signs certificates and revocation lists,
    with none below it (path length 0); a serving or client certificate signs TLS handshakes, on
    its side only, and is no CA."""

    def key_usage(certificate):
        extension = certificate.extensions.get_extension_for_class(x509.KeyUsage)
        uses = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
                "key_cert_sign", "crl_sign")
        return extension.critical, {use for use in uses if getattr(extension.value, use)}

    def constraints(certificate):
        extension = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
        return extension.critical, extension.value.ca, extension.value.path_length

    def extended_key_usage(certificate):
        extension = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
        return extension.critical, list(extension.value)

    serving, client = issue(HOSTS), issue(["kube-scheduler"], client=True)
    ca = x509.load_pem_x509_certificate(serving.ca_cert)
    assert key_usage(ca) == (True, {"digital_signature", "key_cert_sign", "crl_sign"})
    assert constraints(ca) == (True, True, 0)
    for bundle, side in ((serving, x509.oid.ExtendedKeyUsageOID.SERVER_AUTH),
                         (client, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)):
        certificate = x509.load_pem_x509_certificate(bundle.cert)
        assert key_usage(certificate) == (True, {"digital_signature"})
        assert constraints(certificate) == (True, False, None)
        assert extended_key_usage(certificate) == (False, [side])


def test_problems_name_what_is_wrong():
    good = issue(HOSTS)
    assert problems_with(good, HOSTS) == []
    assert problems_with(good, [*HOSTS, "other"]) == ["names missing: other"]
    # An IP written another way, a DNS name in other letters: the same names a client matches.
    addressed = issue([*HOSTS, "::1", "10.0.0.1"])
    assert problems_with(addressed, ["0:0:0:0:0:0:0:1", "10.0.0.1", "OVERSALE-WEBHOOK.oversale.svc"]) == []
    assert problems_with(addressed, ["10.0.0.2", "::2"]) == ["names missing: 10.0.0.2, ::2"]
    late = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)
    assert problems_with(good, HOSTS, now=late)[0].startswith("within the renewal window")
    # By default a certificate is renewed once less than a third of its life is left: of 365
    # days, about 121.7.
    issued = x509.load_pem_x509_certificate(good.cert).not_valid_before_utc
    assert problems_with(good, HOSTS, now=issued + datetime.timedelta(days=242)) == []
    assert problems_with(good, HOSTS, now=issued + datetime.timedelta(days=245)) == [
        "within the renewal window (120 days left)"]
    foreign = issue(HOSTS)
    mixed = type(good)(ca_cert=foreign.ca_cert, ca_key=b"", cert=good.cert, key=foreign.key)
    assert set(problems_with(mixed, HOSTS)) == {"tls.key does not match tls.crt", "tls.crt is not signed by ca.crt"}
    assert problems_with(type(good)(b"x", b"", b"x", b"x"), HOSTS)[0].startswith("unreadable")
    # A common name alone (no SAN): clients match SANs only, so every name is missing.
    cert, key = common_name_only(ec.generate_private_key(ec.SECP256R1()))
    assert problems_with(type(good)(cert, b"", cert, key), ["localhost"]) == ["names missing: localhost"]


@pytest.fixture
def api_client(kube_api):
    from kubernetes import client

    configuration = client.Configuration(host=kube_api.url)
    return client.ApiClient(configuration)


def secret_bundle(kube_api, name="webhook-tls"):
    data = kube_api.get("secrets", "oversale", name)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}


def test_ensure_creates_then_leaves_a_valid_secret_alone(kube_api, api_client):
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "created"
    secret = kube_api.get("secrets", "oversale", "webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert "ca.key" not in secret["data"], "the CA key stays out of the Secret the webhook mounts"
    ca_secret = kube_api.get("secrets", "oversale", "webhook-tls-ca")
    assert (ca_secret["type"], set(ca_secret["data"])) == ("Opaque", {"ca.crt", "ca.key"})
    writes = kube_api.count("POST") + kube_api.count("PUT")
    for _ in range(3):
        assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "unchanged"
    assert kube_api.count("POST") + kube_api.count("PUT") == writes


def test_ensure_renews_inside_the_window_with_the_same_ca(kube_api, api_client):
    ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365)
    first = secret_bundle(kube_api)
    ca_version = kube_api.get("secrets", "oversale", "webhook-tls-ca")["metadata"]["resourceVersion"]
    # A fresh certificate is inside a renewal window of (nearly) its whole lifetime.
    outcome = ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365, renew_fraction=0.999999)
    assert outcome.startswith("renewed: within the renewal window")
    assert kube_api.get("secrets", "oversale", "webhook-tls-ca")["metadata"]["resourceVersion"] == ca_version, \
        "the CA kept is not written again"
    second = secret_bundle(kube_api)
    assert second["tls.crt"] != first["tls.crt"]
    assert second["ca.crt"] == first["ca.crt"], "caBundle in webhook configurations stays valid"
    x509.load_pem_x509_certificate(second["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(first["ca.crt"]))



def encoded(values: dict[str, bytes]) -> dict[str, str]:
    """A Secret's ``data``: each value base64-encoded, as the API server holds it."""
    return {key: base64.b64encode(value).decode() for key, value in values.items()}


def managed_secrets(kube_api, bundle) -> None:
    """``bundle`` in the Secrets ``ensure`` keeps, as it writes them: webhook-tls and its -ca."""
    kube_api.put("secrets", {"metadata": {"name": "webhook-tls-ca", "namespace": "oversale", "labels": MANAGED_BY},
                             "type": "Opaque", "data": encoded({"ca.crt": bundle.ca_cert, "ca.key": bundle.ca_key})})
    kube_api.put("secrets", {"metadata": {"name": "webhook-tls", "namespace": "oversale", "labels": MANAGED_BY},
                             "type": "kubernetes.io/tls",
                             "data": encoded({"tls.crt": bundle.cert, "tls.key": bundle.key,
                                              "ca.crt": bundle.ca_cert})})


def test_a_ca_near_its_end_is_replaced_and_the_old_one_trusted_until_it_expires(kube_api, api_client):
    """A CA inside its own renewal window cannot sign a renewal that outlives it: ensure makes a
    new CA, signs the serving certificate with it, and the Secret's ca.crt (the caBundle the
    webhook configurations and kube-scheduler read) holds the new CA and the old one. Replicas
    still serving the old certificate stay trusted until the kubelet hands them the new one."""
    old = issue(HOSTS, days=1, ca_days=1)  # a CA whose whole life is one day
    managed_secrets(kube_api, old)
    # Both the one-day certificate and its one-day CA have less than this share of their life left.
    outcome = ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365, renew_fraction=0.999999)
    assert outcome.startswith("renewed: within the renewal window")
    new_ca = kube_api.get("secrets", "oversale", "webhook-tls-ca")["data"]
    new_ca_cert = x509.load_pem_x509_certificate(base64.b64decode(new_ca["ca.crt"]))
    assert new_ca_cert != x509.load_pem_x509_certificate(old.ca_cert), "a new CA"
    served = secret_bundle(kube_api)
    trusted = x509.load_pem_x509_certificates(served["ca.crt"])
    assert trusted == [new_ca_cert, x509.load_pem_x509_certificate(old.ca_cert)], "the new CA, then the old one"
    x509.load_pem_x509_certificate(served["tls.crt"]).verify_directly_issued_by(new_ca_cert)
    x509.load_pem_x509_certificate(old.cert).verify_directly_issued_by(trusted[1])
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "unchanged"


def test_a_ca_already_expired_is_replaced_and_no_longer_trusted(kube_api, api_client):
    expired = issue(HOSTS, days=1, ca_days=0)  # the CA, and so the certificate, end as they are made
    managed_secrets(kube_api, expired)
    time.sleep(1)
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "renewed: expired"
    served = secret_bundle(kube_api)
    [trusted] = x509.load_pem_x509_certificates(served["ca.crt"])
    assert trusted != x509.load_pem_x509_certificate(expired.ca_cert)
    x509.load_pem_x509_certificate(served["tls.crt"]).verify_directly_issued_by(trusted)

def test_a_ca_signs_renewals_only_while_readable_its_own_key_and_well_inside_its_life():
    """A CA that cannot sign a renewal others trust is replaced, not used: its certificate or key
    unreadable, a key that is not the CA's (a certificate it signed would verify with no client),
    or too little of its life left."""
    good, other = issue(HOSTS), issue(HOSTS)
    assert ca_usable(good)
    assert not ca_usable(dataclasses.replace(good, ca_key=other.ca_key))
    assert not ca_usable(dataclasses.replace(good, ca_cert=b"junk"))
    assert not ca_usable(dataclasses.replace(good, ca_key=b""))
    assert not ca_usable(issue(HOSTS, days=1, ca_days=0)), "it ends as it is made"


def test_the_cas_trusted_while_one_is_replaced_are_those_not_expired():
    expired, current = issue(HOSTS, days=1, ca_days=0), issue(HOSTS)
    time.sleep(1)  # the expired CA ends as it is made
    assert unexpired_certificates(expired.ca_cert + current.ca_cert) == current.ca_cert
    assert unexpired_certificates(b"junk") == b""


def common_name_only(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``localhost`` by its common name alone, no SAN (as older
    tools issue them), and its key, both PEM."""
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=30)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def test_a_pair_openssl_refuses_to_serve_is_refused_in_openssls_words(tmp_path):
    """A 1024-bit RSA key loads as PEM and matches its certificate, but OpenSSL's default security
    level refuses to serve with it: every handshake would fail, so it is said before serving."""
    cert, key = common_name_only(rsa.generate_private_key(public_exponent=65537, key_size=1024))
    paths = CertificatePaths.in_dir(tmp_path)
    paths.cert.write_bytes(cert)
    paths.key.write_bytes(key)
    assert "key too small" in (serving_pair_problem(paths) or "")


def test_ensure_replaces_a_certificate_for_the_wrong_names(kube_api, api_client):
    ensure_secret(api_client, "oversale", "webhook-tls", ["elsewhere"], 365)
    outcome = ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365, renew_fraction=0.999999)
    assert outcome == (f"renewed: names missing: {', '.join(HOSTS)}; within the renewal window (364 days left)"), \
        "every reason, in one line"
    assert sans(x509.load_pem_x509_certificate(secret_bundle(kube_api)["tls.crt"]))[0] == set(HOSTS)


def secret_writes(kube_api) -> list[str]:
    """The method and path of each create or replace of a Secret, refused or not, in order."""
    return [f"{r.method} {r.path.split('/namespaces/oversale/')[-1]}" for r in list(kube_api.requests)
            if r.method in ("POST", "PUT") and "/secrets" in r.path]


def test_a_write_conflict_with_another_copy_is_read_again_and_its_renewal_kept(kube_api, api_client):
    """Copies of ensure can run at once (the Job and a CronJob run): two renewing both read the old Secret,
    and the later replace is a 409 (its resourceVersion is stale). The loser reads again, finds
    the winner's certificate good and leaves it: no third certificate, no restart."""
    ensure_secret(api_client, "oversale", "webhook-tls", ["elsewhere"], 365)
    held = secret_bundle(kube_api, "webhook-tls-ca")
    winner = issue(HOSTS, days=365, ca=Bundle(held["ca.crt"], held["ca.key"], b"", b""))
    kube_api.concurrent_writes["secrets/webhook-tls"] = 1
    kube_api.written_meanwhile["secrets"] = lambda secret: secret["data"].update(
        encoded({"tls.crt": winner.cert, "tls.key": winner.key}))
    before = len(secret_writes(kube_api))
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "unchanged"
    assert secret_writes(kube_api)[before:] == ["PUT secrets/webhook-tls"], "the one refused"
    assert secret_bundle(kube_api)["tls.crt"] == winner.cert


def test_copies_installing_at_once_all_use_the_ca_the_first_one_created(kube_api, api_client):
    """A first install: each copy of ensure running at once finds no Secret and creates the CA's. One
    created it just before this one (409 AlreadyExists): this one reads again and signs its
    certificate with that CA, so the caBundle injected from either Secret verifies every copy's certificate."""
    theirs = issue(HOSTS)
    kube_api.concurrent_writes["secrets/webhook-tls-ca"] = 1
    kube_api.written_meanwhile["secrets"] = lambda secret: secret["data"].update(
        encoded({"ca.crt": theirs.ca_cert, "ca.key": theirs.ca_key}))
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "created"
    assert secret_writes(kube_api) == ["POST secrets", "POST secrets"], "the CA's refused, then the serving one"
    assert secret_bundle(kube_api, "webhook-tls-ca") == {"ca.crt": theirs.ca_cert, "ca.key": theirs.ca_key}
    served = secret_bundle(kube_api)
    assert served["ca.crt"] == theirs.ca_cert
    x509.load_pem_x509_certificate(served["tls.crt"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(theirs.ca_cert))
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365) == "unchanged"


def test_a_write_conflict_with_a_write_that_mends_nothing_is_renewed_on_the_next_read(kube_api, api_client):
    ensure_secret(api_client, "oversale", "webhook-tls", ["elsewhere"], 365)
    kube_api.concurrent_writes["secrets/webhook-tls"] = 1  # another writer, same content
    before = len(secret_writes(kube_api))
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365).startswith("renewed: names missing")
    assert secret_writes(kube_api)[before:] == ["PUT secrets/webhook-tls"] * 2
    assert sans(x509.load_pem_x509_certificate(secret_bundle(kube_api)["tls.crt"]))[0] == set(HOSTS)


def test_ensure_gives_up_after_three_conflicts_and_any_other_refusal_at_once(kube_api, api_client):
    """Three writes in a row lost to others: the third conflict is the error (exit 1, the certs
    Job retried); a refusal that is no conflict (a policy webhook) is not tried again. Either way
    the Secret keeps what the others wrote."""
    ensure_secret(api_client, "oversale", "webhook-tls", ["elsewhere"], 365)
    held = secret_bundle(kube_api)
    kube_api.concurrent_writes["secrets/webhook-tls"] = 3
    before = len(secret_writes(kube_api))
    with pytest.raises(ApiException) as conflict:
        ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365)
    assert conflict.value.status == 409 and "the object has been modified" in conflict.value.body
    assert secret_writes(kube_api)[before:] == ["PUT secrets/webhook-tls"] * 3
    assert secret_bundle(kube_api) == held
    kube_api.validating["secrets"] = lambda review: {"uid": review["request"]["uid"], "allowed": False,
                                                     "status": {"code": 403, "message": "secrets are frozen"}}
    before = len(secret_writes(kube_api))
    with pytest.raises(ApiException) as refused:
        ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365)
    assert refused.value.status == 403 and "secrets are frozen" in refused.value.body
    assert secret_writes(kube_api)[before:] == ["PUT secrets/webhook-tls"]
    assert secret_bundle(kube_api) == held


def test_ensure_replaces_garbage(kube_api, api_client):
    kube_api.put("secrets", {"metadata": {"name": "webhook-tls", "namespace": "oversale", "labels": MANAGED_BY},
                             "type": "kubernetes.io/tls",
                             "data": {"tls.crt": base64.b64encode(b"junk").decode(), "tls.key": ""}})
    assert ensure_secret(api_client, "oversale", "webhook-tls", HOSTS, 365).startswith("renewed: unreadable")
    assert problems_with(type(issue(HOSTS))(secret_bundle(kube_api)["ca.crt"], b"",
                                            secret_bundle(kube_api)["tls.crt"], secret_bundle(kube_api)["tls.key"]),
                         HOSTS) == []


@pytest.mark.parametrize("name", ["ingress-tls", "ingress-tls-ca"])
def test_ensure_never_replaces_another_tools_secret(kube_api, api_client, name):
    # An Ingress certificate for other names (or a password in the "-ca" one) under the name asked
    # for: "renewing" it would destroy what its owner keeps there.
    owner = {"app.kubernetes.io/managed-by": "cert-manager"}
    theirs = {"metadata": {"name": name, "namespace": "web", "labels": owner},
              "type": "kubernetes.io/tls" if name == "ingress-tls" else "Opaque",
              "data": {"tls.crt": base64.b64encode(issue(["shop.example.com"]).cert).decode()}}
    kube_api.put("secrets", theirs)
    with pytest.raises(ForeignSecret, match=f"secret web/{name} exists and was not written by oversale-certs"):
        ensure_secret(api_client, "web", "ingress-tls", HOSTS, 365)
    assert kube_api.get("secrets", "web", name)["data"] == theirs["data"]
    assert kube_api.get("secrets", "web", "ingress-tls-ca" if name == "ingress-tls" else "ingress-tls") is None


def webhook_configuration(name, entries):
    return {"metadata": {"name": name}, "webhooks": [
        {"name": f"{entry}.oversale.stke.platform", "admissionReviewVersions": ["v1"], "sideEffects": "None",
         "clientConfig": {"service": {"name": "oversale-webhook", "namespace": "oversale", "path": f"/{entry}"}}}
        for entry in entries]}


def test_inject_sets_every_ca_bundle_once(kube_api, api_client):
    kube_api.put("mutatingwebhookconfigurations", webhook_configuration("oversale", ["pods", "nodes"]))
    kube_api.put("validatingwebhookconfigurations", webhook_configuration("oversale", ["nodes"]))
    ca = issue(HOSTS).ca_cert
    report = inject_ca_bundle(api_client, ["oversale"], ca)
    assert report == ["MutatingWebhookConfiguration oversale: caBundle set on 2 webhook(s)",
                      "ValidatingWebhookConfiguration oversale: caBundle set on 1 webhook(s)"]
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for webhook in kube_api.get(plural, "", "oversale")["webhooks"]:
            assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca
    patches = kube_api.count("PATCH")
    assert inject_ca_bundle(api_client, ["oversale"], ca) == [
        "MutatingWebhookConfiguration oversale: unchanged", "ValidatingWebhookConfiguration oversale: unchanged"]
    assert kube_api.count("PATCH") == patches


def test_inject_sets_only_the_webhooks_without_it_of_whichever_kind_exists(kube_api, api_client):
    """A name that is a ValidatingWebhookConfiguration alone is found; an entry already holding
    the CA is passed over, not the entries after it; a configuration with no webhooks is unchanged."""
    ca = issue(HOSTS).ca_cert
    partly = webhook_configuration("policy", ["pods", "nodes"])
    partly["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    kube_api.put("validatingwebhookconfigurations", partly)
    kube_api.put("mutatingwebhookconfigurations", {"metadata": {"name": "empty"}})
    assert inject_ca_bundle(api_client, ["policy", "empty"], ca) == [
        "ValidatingWebhookConfiguration policy: caBundle set on 1 webhook(s)",
        "MutatingWebhookConfiguration empty: unchanged"]
    for webhook in kube_api.get("validatingwebhookconfigurations", "", "policy")["webhooks"]:
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca


def test_inject_names_a_secret_without_a_ca(kube_api, api_client):
    kube_api.put("secrets", {"metadata": {"name": "shop-tls", "namespace": "oversale"}, "type": "Opaque"})
    with pytest.raises(LookupError) as unset:
        read_ca_from_secret(api_client, "oversale", "shop-tls")
    assert str(unset.value) == "secret oversale/shop-tls has no ca.crt"


def test_inject_names_a_missing_configuration(kube_api, api_client):
    with pytest.raises(LookupError, match="'absent'"):
        inject_ca_bundle(api_client, ["absent"], issue(HOSTS).ca_cert)


def test_ensure_and_inject_through_the_cli(kube_api, tmp_path):
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    kube_api.put("mutatingwebhookconfigurations", webhook_configuration("oversale", ["pods"]))
    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = [sys.executable, "-m", "certs"]
    ensured = subprocess.run([*run, "ensure", "--secret", "oversale/webhook-tls", "--service", "oversale-webhook"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert ensured.returncode == 0, ensured.stderr
    assert ensured.stdout.strip() == "secret oversale/webhook-tls: created"
    injected = subprocess.run([*run, "inject", "--webhook", "oversale", "--secret", "oversale/webhook-tls"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert injected.returncode == 0, injected.stderr
    assert "caBundle set on 1 webhook(s)" in injected.stdout
    injected_bundle = kube_api.get("mutatingwebhookconfigurations", "", "oversale")["webhooks"][0]["clientConfig"]
    # A file that holds no certificate would leave the API server unable to call the webhook.
    junk = tmp_path / "ca.crt"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    refused = subprocess.run([*run, "inject", "--webhook", "oversale", "--ca-file", str(junk)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and f"{junk}: holds no PEM CA certificate; no caBundle was changed" in refused.stderr
    # So would a Secret whose ca.crt is no certificate.
    kube_api.put("secrets", {"metadata": {"name": "junk-ca", "namespace": "oversale"}, "type": "Opaque",
                             "data": encoded({"ca.crt": junk.read_bytes()})})
    from_secret = subprocess.run([*run, "inject", "--webhook", "oversale", "--secret", "oversale/junk-ca"],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert from_secret.returncode == 2 and \
        "oversale/junk-ca: holds no PEM CA certificate; no caBundle was changed" in from_secret.stderr
    after = kube_api.get("mutatingwebhookconfigurations", "", "oversale")["webhooks"][0]["clientConfig"]
    assert after["caBundle"] == injected_bundle["caBundle"]
    kube_api.put("secrets", {"metadata": {"name": "shop-tls", "namespace": "oversale"}, "type": "kubernetes.io/tls"})
    foreign = subprocess.run([*run, "ensure", "--secret", "oversale/shop-tls", "--service", "oversale-webhook"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert foreign.returncode == 2 and foreign.stderr.strip().splitlines() == [
        "error: secret oversale/shop-tls exists and was not written by oversale-certs (no label "
        "app.kubernetes.io/managed-by=oversale-certs): choose another --secret, or label it to hand it over"]
    missing = subprocess.run([*run, "inject", "--webhook", "oversale", "--secret", "oversale/absent"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no secret oversale/absent" in missing.stderr


def scheduler_annotations(kube_api) -> dict:
    """The annotations of the oversale-scheduler Deployment's Pod template: where restarts are
    recorded."""
    template = kube_api.get("deployments", "oversale", "oversale-scheduler")["spec"]["template"]
    return template["metadata"].get("annotations") or {}


def test_a_renewed_client_certificate_restarts_the_scheduler_that_reads_it_only_at_start(kube_api, tmp_path):
    """kube-scheduler loads its extender tlsConfig files once: after a renewal it would present
    the old certificate until that expired, and every call of the oversale profile would fail.
    Two ensure runs restart it (its client Secret, the extender's serving Secret), as the
    self-signed overlay has them."""
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    volumes = [  # what deploy/base/scheduler.yaml mounts: its client pair, the extender's CA only
        {"name": "client", "secret": {"secretName": "scheduler-client",
                                      "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key",
                                                                                       "path": "tls.key"}]}},
        {"name": "extender-ca", "secret": {"secretName": "extender-tls", "items": [{"key": "ca.crt",
                                                                                    "path": "ca.crt"}]}}]
    scheduler = {"metadata": {"name": "oversale-scheduler", "namespace": "oversale"},
                 "spec": {"template": {"metadata": {"labels": {"app": "s"}},
                                       "spec": {"containers": [], "volumes": volumes}}}}
    kube_api.put("deployments", scheduler)

    def ensure(secret: str, *extra: str) -> subprocess.CompletedProcess[str]:
        names = ["--host", "kube-scheduler", "--client"] if secret == "scheduler-client" else ["--service", secret]
        return subprocess.run([sys.executable, "-m", "certs", "ensure", "--secret", f"oversale/{secret}", *names,
                               "--restart", "oversale/oversale-scheduler", *extra], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)

    client_key, extender_key = "stke.platform/certificates.oversale.scheduler-client", \
        "stke.platform/certificates.oversale.extender-tls"
    created = ensure("scheduler-client")
    assert created.returncode == 0, created.stderr
    assert created.stdout.splitlines()[0] == "secret oversale/scheduler-client: created"
    client_digest = scheduler_annotations(kube_api)[client_key]
    assert created.stdout.splitlines()[1:] == [
        f"deployment oversale/oversale-scheduler: restarted (certificates not recorded -> {client_digest})"]
    assert scheduler_annotations(kube_api)["kubectl.kubernetes.io/restartedAt"].endswith("Z")
    time.sleep(1.1)  # the annotation has whole seconds: a new rollout needs a new value
    assert ensure("extender-tls").stdout.splitlines()[0] == "secret oversale/extender-tls: created"
    extender_digest = scheduler_annotations(kube_api)[extender_key]
    assert scheduler_annotations(kube_api)[client_key] == client_digest, "each Secret keeps its own record"
    recorded = scheduler_annotations(kube_api)
    for secret, digest in (("scheduler-client", client_digest), ("extender-tls", extender_digest)):
        again = ensure(secret)
        assert again.stdout.splitlines() == [
            f"secret oversale/{secret}: unchanged",
            f"deployment oversale/oversale-scheduler: unchanged (certificates {digest})"]
    assert scheduler_annotations(kube_api) == recorded, "the two runs do not restart it in turn"
    # The extender's serving certificate renewed by the same CA: kube-scheduler mounts only that CA.
    renewed = ensure("extender-tls", "--renew-fraction", "0.999999")
    assert renewed.stdout.splitlines()[0].startswith("secret oversale/extender-tls: renewed")
    assert renewed.stdout.splitlines()[1:] == [
        f"deployment oversale/oversale-scheduler: unchanged (certificates {extender_digest})"]
    assert scheduler_annotations(kube_api) == recorded

    # The client certificate renewed, but the roll refused (a policy webhook, an API server
    # failing): the next run, which finds the Secret good, still restarts kube-scheduler.
    kube_api.validating["deployments"] = lambda review: {
        "allowed": False, "status": {"code": 500, "message": "policy engine unavailable"}}
    refused = ensure("scheduler-client", "--renew-fraction", "0.999999")
    assert refused.returncode == 2 and refused.stdout.splitlines()[0].startswith(
        "secret oversale/scheduler-client: renewed"), refused.stdout
    assert "policy engine unavailable" in refused.stderr.strip().splitlines()[-1]
    assert scheduler_annotations(kube_api) == recorded
    del kube_api.validating["deployments"]
    time.sleep(1.1)
    retried = ensure("scheduler-client")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.splitlines()[0] == "secret oversale/scheduler-client: unchanged"
    assert retried.stdout.splitlines()[1].startswith(
        f"deployment oversale/oversale-scheduler: restarted (certificates {client_digest} -> ")
    assert scheduler_annotations(kube_api)[client_key] not in (None, client_digest)
    assert scheduler_annotations(kube_api)[extender_key] == extender_digest
    assert scheduler_annotations(kube_api)["kubectl.kubernetes.io/restartedAt"] != \
        recorded["kubectl.kubernetes.io/restartedAt"]

    kube_api.delete("deployments", "oversale", "oversale-scheduler")
    gone = ensure("scheduler-client", "--renew-fraction", "0.999999")
    assert gone.returncode == 0 and gone.stdout.splitlines()[-1] == \
        "deployment oversale/oversale-scheduler: not found, nothing to restart"
    kube_api.put("deployments", scheduler)
    kube_api.storms["deployments"] = [403, 1]  # a Role without get on it: an error, not "not found"
    refused = ensure("scheduler-client", "--renew-fraction", "0.999999")
    assert refused.returncode == 2 and refused.stdout.splitlines()[-1].startswith(
        "secret oversale/scheduler-client: renewed"), refused.stdout
    assert refused.stderr.strip().splitlines()[-1] == (
        'error: the API server refused the request: HTTP 403 Forbidden: deployments "oversale-scheduler" is '
        'forbidden: User "system:serviceaccount:oversale:oversale" cannot get resource "deployments" '
        '(--debug shows the traceback)')
    assert scheduler_annotations(kube_api) == {}
    bad = subprocess.run([sys.executable, "-m", "certs", "ensure", "--secret", "oversale/x", "--host", "h",
                          "--restart", "oversale-scheduler"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "expected NAMESPACE/NAME, got 'oversale-scheduler'" in bad.stderr


def test_certificates_another_tool_renews_restart_the_scheduler_once_per_change(kube_api, tmp_path):
    """With cert-manager no ``ensure`` knows when kube-scheduler's client certificate is renewed;
    a schedule compares what the Secrets hold with what the Pods were started with."""
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    template = {"metadata": {"labels": {"app": "s"}}, "spec": {"containers": []}}
    kube_api.put("deployments", {"metadata": {"name": "oversale-scheduler", "namespace": "oversale"},
                                 "spec": {"template": template}})

    def issued(name: str, days: int) -> None:  # what cert-manager writes: tls.crt, tls.key, ca.crt
        paths = generate(tmp_path / f"{name}-{days}", ["kube-scheduler"], days=days)
        kube_api.put("secrets", {"metadata": {"name": name, "namespace": "oversale"}, "type": "kubernetes.io/tls",
                                 "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in
                                          (("tls.crt", paths.cert), ("tls.key", paths.key), ("ca.crt", paths.ca))}})

    def follow() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "certs", "restart-on-change", "--secret",
                               "oversale/scheduler-client", "--secret", "oversale/extender-tls", "--restart",
                               "oversale/oversale-scheduler"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)

    issued("extender-tls", 30)
    missing = follow()
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        "error: secret oversale/scheduler-client is missing or holds no tls.crt or ca.crt; nothing was restarted"]
    assert scheduler_annotations(kube_api) == {}
    issued("scheduler-client", 30)
    first = follow()
    assert first.returncode == 0, first.stderr
    (line,) = first.stdout.splitlines()
    assert re.fullmatch(r"deployment oversale/oversale-scheduler: restarted \(certificates not recorded -> "
                        r"[0-9a-f]{16}\)", line)
    recorded = scheduler_annotations(kube_api)
    digest = recorded["stke.platform/certificates"]
    assert recorded["kubectl.kubernetes.io/restartedAt"].endswith("Z")
    kube_api.requests.clear()
    again = follow()
    assert kube_api.count("GET", "secrets") == 2, "each Secret read once per run"
    assert again.stdout.splitlines() == [f"deployment oversale/oversale-scheduler: unchanged (certificates {digest})"]
    assert scheduler_annotations(kube_api) == recorded, "no second rollout for the same certificates"
    issued("scheduler-client", 31)  # renewed
    renewed = follow()
    assert renewed.stdout.startswith(f"deployment oversale/oversale-scheduler: restarted (certificates {digest} -> ")
    assert scheduler_annotations(kube_api)["stke.platform/certificates"] != digest
    kube_api.delete("deployments", "oversale", "oversale-scheduler")
    assert follow().stdout.splitlines() == ["deployment oversale/oversale-scheduler: not found, nothing to restart"]


def test_only_a_change_in_what_kube_scheduler_mounts_restarts_it(kube_api, tmp_path):
    """kube-scheduler mounts the extender Secret's ca.crt alone: the extender's own certificate,
    renewed by the same CA, changes nothing it reads; a new CA, or a new client certificate, does."""
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    volumes = [{"name": "client", "secret": {"secretName": "scheduler-client", "items": [
                   {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}},
               {"name": "extender-ca", "projected": {"sources": [{"secret": {"name": "extender-tls", "items": [
                   {"key": "ca.crt", "path": "ca.crt"}]}}]}}]
    kube_api.put("deployments", {"metadata": {"name": "oversale-scheduler", "namespace": "oversale"}, "spec": {
        "template": {"metadata": {"labels": {"app": "s"}}, "spec": {"containers": [], "volumes": volumes}}}})

    def put(name: str, bundle) -> None:
        kube_api.put("secrets", {"metadata": {"name": name, "namespace": "oversale"}, "type": "kubernetes.io/tls",
                                 "data": encoded({"tls.crt": bundle.cert, "tls.key": bundle.key,
                                                  "ca.crt": bundle.ca_cert})})

    def follow(exit_code: int = 0) -> str:
        result = subprocess.run([sys.executable, "-m", "certs", "restart-on-change", "--secret",
                                 "oversale/scheduler-client", "--secret", "oversale/extender-tls", "--restart",
                                 "oversale/oversale-scheduler"], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == exit_code, result.stderr
        return result.stdout.strip() if exit_code == 0 else result.stderr.strip()

    extender = issue(["oversale-extender"])
    put("extender-tls", extender)
    put("scheduler-client", issue(["kube-scheduler"], client=True))
    assert follow().startswith("deployment oversale/oversale-scheduler: restarted (certificates not recorded -> ")
    put("extender-tls", issue(["oversale-extender"], ca=extender))  # renewed by the same CA
    assert follow().startswith("deployment oversale/oversale-scheduler: unchanged")
    put("extender-tls", issue(["oversale-extender"]))  # a new CA: kube-scheduler must trust it
    assert "restarted" in follow()
    put("scheduler-client", issue(["kube-scheduler"], client=True))  # a new client certificate
    assert "restarted" in follow()
    assert follow().startswith("deployment oversale/oversale-scheduler: unchanged"), "recorded: once per change"
    recorded = kube_api.get("deployments", "oversale", "oversale-scheduler")
    kube_api.put("secrets", {"metadata": {"name": "extender-tls", "namespace": "oversale"},
                             "type": "kubernetes.io/tls", "data": encoded({"tls.crt": extender.cert,
                                                                           "tls.key": extender.key})})
    assert follow(exit_code=2) == ("error: secret oversale/extender-tls is missing or holds no ca.crt; "
                                   "deployment oversale/oversale-scheduler not restarted")
    assert kube_api.get("deployments", "oversale", "oversale-scheduler") == recorded


def test_a_secret_not_issued_yet_or_without_the_file_mounted_restarts_nothing(kube_api, api_client):
    """cert-manager makes a Secret before it has issued into it: one holding its key alone, or a
    Secret mounted for its ca.crt that holds none yet, is named and nothing rolls until it has."""
    kube_api.put("secrets", {"metadata": {"name": "scheduler-client", "namespace": "oversale"},
                             "type": "kubernetes.io/tls", "data": encoded({"tls.key": issue(HOSTS).key})})
    with pytest.raises(LookupError) as unissued:
        read_certificates(api_client, [("oversale", "scheduler-client")])
    assert str(unissued.value) == "secret oversale/scheduler-client is missing or holds no tls.crt or ca.crt"
    extender = issue(["oversale-extender"])
    kube_api.put("secrets", {"metadata": {"name": "extender-tls", "namespace": "oversale"}, "type": "kubernetes.io/tls",
                             "data": encoded({"tls.crt": extender.cert, "tls.key": extender.key})})
    volumes = [{"name": "extender-ca", "secret": {"secretName": "extender-tls", "items": [
        {"key": "ca.crt", "path": "ca.crt"}]}}]
    kube_api.put("deployments", {"metadata": {"name": "oversale-scheduler", "namespace": "oversale"}, "spec": {
        "template": {"metadata": {"labels": {"app": "s"}}, "spec": {"containers": [], "volumes": volumes}}}})
    held = read_certificates(api_client, [("oversale", "extender-tls")])  # a tls.crt: issued, to this reading
    with pytest.raises(LookupError) as unmounted:
        restart_on_change(api_client, "oversale", "oversale-scheduler", held, "example.com/certificates")
    assert str(unmounted.value) == "secret oversale/extender-tls is missing or holds no ca.crt"
    assert kube_api.count("PATCH", "deployments") == 0
    # Issued: the ca.crt it is mounted for, and no tls.crt (a trust bundle holds none), which a
    # Deployment mounting it whole (no items) reads whole.
    kube_api.put("secrets", {"metadata": {"name": "extender-tls", "namespace": "oversale"},
                             "data": encoded({"ca.crt": extender.ca_cert})})
    held = read_certificates(api_client, [("oversale", "extender-tls")])
    said = restart_on_change(api_client, "oversale", "oversale-scheduler", held, "example.com/certificates")
    assert said.startswith("deployment oversale/oversale-scheduler: restarted (certificates not recorded -> ")
    kube_api.put("deployments", {"metadata": {"name": "trust-reader", "namespace": "oversale"}, "spec": {
        "template": {"metadata": {"labels": {"app": "t"}}, "spec": {"containers": [], "volumes": [
            {"name": "trust", "secret": {"secretName": "extender-tls"}}]}}}})
    assert re.fullmatch(r"deployment oversale/trust-reader: restarted \(certificates not recorded -> [0-9a-f]{16}\)",
                        restart_on_change(api_client, "oversale", "trust-reader", held, "example.com/certificates"))


def served_certificate(server: RunningWebhook, ca_file) -> x509.Certificate:
    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", server.port)) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_rotated_files_are_served_on_new_connections_without_restart(tmp_path):
    server = RunningWebhook(tmp_path)
    try:
        paths = CertificatePaths.in_dir(server.certs)
        before = served_certificate(server, paths.ca)
        old_ca = tmp_path / "old-ca.crt"
        old_ca.write_bytes(paths.ca.read_bytes())
        kept_alive = server.connection()
        kept_alive.request("GET", "/healthz")
        assert kept_alive.getresponse().read()

        generate(server.certs, ["localhost", "127.0.0.1"])
        after = served_certificate(server, paths.ca)
        assert after.serial_number != before.serial_number
        assert after.fingerprint(after.signature_hash_algorithm) == load(paths.cert).fingerprint(
            after.signature_hash_algorithm)
        with pytest.raises(ssl.SSLError):
            served_certificate(server, old_ca)  # new connections no longer get the old certificate
        kept_alive.request("GET", "/healthz")  # an open connection keeps working
        assert json.loads(kept_alive.getresponse().read()) == {"status": "ok"}
        assert server.process.poll() is None
    finally:
        server.stop()


def test_in_process_metrics_show_the_certificate_expiry_too(tmp_path, monkeypatch):
    """Served by Flask alone (no PROMETHEUS_MULTIPROC_DIR), the webhook's one registry holds the
    expiry as well."""
    from webhook.metrics import Metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    paths = generate(tmp_path, ["localhost"], days=20)
    exposition = Metrics(certificates={"serving": paths.cert}).exposition()[0].decode()
    assert expiry_samples(exposition) == {"serving": load(paths.cert).not_valid_after_utc.timestamp()}


def test_metrics_show_when_the_served_certificates_expire_and_follow_a_renewal(tmp_path):
    """A renewal that never happens is silent until the API server can no longer call the
    webhook; the expiry on /metrics is what an alert can watch (OversaleCertificateExpiringSoon)."""
    server = RunningWebhook(tmp_path)
    try:
        paths = CertificatePaths.in_dir(server.certs)
        status, body = server.get("/metrics")
        assert status == 200
        assert expiry_samples(body.decode()) == {"ca": load(paths.ca).not_valid_after_utc.timestamp(),
                                                 "serving": load(paths.cert).not_valid_after_utc.timestamp()}
        generate(server.certs, ["localhost", "127.0.0.1"], days=20)  # renewed, for a shorter life
        _, body = server.get("/metrics")
        serving = expiry_samples(body.decode())["serving"]
        assert serving == load(paths.cert).not_valid_after_utc.timestamp()
        assert 19 * 86400 < serving - time.time() <= 20 * 86400
    finally:
        server.stop()


def test_the_peer_certificate_follows_what_the_client_presents_and_is_forgotten_when_idle(tmp_path):
    """kube-scheduler reads its client certificate only at start; the expiry of the one it presents
    is what shows a renewal that never reached it. Real handshakes over a socket pair."""
    from concurrent.futures import ThreadPoolExecutor

    from kube.certificate_expiry import PeerCertificate
    from kube.tls import LOCAL_HOSTS, write_bundle

    serving = write_bundle(tmp_path / "serving", issue(LOCAL_HOSTS))
    client_ca = issue(["oversale-scheduler-ca"])
    (tmp_path / "client-ca.crt").write_bytes(client_ca.ca_cert)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "client-ca.crt"))
    server_context.load_cert_chain(str(serving.cert), str(serving.key))
    server_context.verify_mode = ssl.CERT_REQUIRED
    now = [1_000_000.0]
    peer = PeerCertificate(clock=lambda: now[0])

    def present(days: int) -> float:
        client = write_bundle(tmp_path / f"client-{days}", issue(["kube-scheduler"], days=days, ca=client_ca,
                                                                  client=True))
        context = ssl.create_default_context(cafile=str(serving.ca))
        context.load_cert_chain(str(client.cert), str(client.key))
        near, far = socket.socketpair()
        with ThreadPoolExecutor(1) as pool:
            accepted = pool.submit(server_context.wrap_socket, near, server_side=True)
            with context.wrap_socket(far, server_hostname="localhost"), accepted.result() as connection:
                peer.saw(connection)
                peer.saw(connection)  # kept alive: the same certificate again
        return load(client.cert).not_valid_after_utc.timestamp()

    assert peer.expiry() is None, "nothing presented yet"
    first = present(days=30)
    assert peer.expiry() == first
    renewed = present(days=300)  # restarted with its renewed certificate
    assert peer.expiry() == renewed != first
    with socket.socket() as plain:
        peer.saw(plain)  # a plain connection (the probe port) tells nothing
    peer.saw(None)
    assert peer.expiry() == renewed
    # Forgotten after 7 days without a call, as docs/operating.md says.
    now[0] += 7 * 86400
    assert peer.expiry() == renewed
    now[0] += 1
    assert peer.expiry() is None, "idle for longer than a week: what it would present is unknown"


def test_ensure_client_makes_a_client_certificate_for_kube_scheduler(kube_api, api_client):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    assert ensure_secret(api_client, "oversale", "scheduler-client", ["kube-scheduler"], 365,
                         client_certificate=True) == "created"
    cert = x509.load_pem_x509_certificate(secret_bundle(kube_api, "scheduler-client")["tls.crt"])
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.rfc4514_string() == "CN=kube-scheduler"
