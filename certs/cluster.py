"""Certificates in a cluster: keep a TLS Secret valid (``ensure``) and put its CA into webhook
configurations (``inject``). Both are idempotent: safe from every replica, an init container or a
Job, and they write nothing when nothing needs to change.

The serving Secret (type kubernetes.io/tls) holds ``tls.crt``, ``tls.key`` and ``ca.crt``; the CA
key lives in a second Secret, ``<name>-ca``, that only this tool reads, so renewals are signed by
the same CA and the ``caBundle`` the API server trusts does not change under running replicas.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube.client import found
from kube.tls import (
    CA_FILE,
    CA_KEY_FILE,
    CERT_FILE,
    KEY_FILE,
    RENEW_FRACTION,
    Bundle,
    ca_usable,
    issue,
    problems_with,
    unexpired_certificates,
)
from oversale.timestamps import format_timestamp

log = logging.getLogger(__name__)

CERTIFICATE_FILES = (CERT_FILE, CA_FILE)
"""What a certificate digest covers: never ``tls.key``, whose digest would say something of the key."""

MANAGED_BY = {"app.kubernetes.io/managed-by": "oversale-certs"}
"""The label on every Secret ``ensure`` writes: one without it is someone else's and never replaced."""
REQUEST_TIMEOUT = 30.0
"""Seconds per API call: the certs Job fails (and is retried) rather than hang on a silent API server."""


class ForeignSecret(Exception):
    """The Secret ``ensure`` would write exists and was not written by it."""

WEBHOOK_KINDS = (
    ("MutatingWebhookConfiguration", "mutating_webhook_configuration"),
    ("ValidatingWebhookConfiguration", "validating_webhook_configuration"),
)


def ensure_secret(
    api_client: Any,
    namespace: str,
    name: str,
    hosts: Sequence[str],
    days: int,
    renew_fraction: float = RENEW_FRACTION,
    client_certificate: bool = False,
) -> str:
    """Create or renew the serving Secret when it is missing or has problems; return what was done
    (``created``, ``renewed: <why>``, ``unchanged``)."""
    core = client.CoreV1Api(api_client)
    for attempt in range(3):
        current = _read_secret(core, namespace, name)
        ca_secret = _read_secret(core, namespace, f"{name}-ca")
        for secret, secret_name in ((current, name), (ca_secret, f"{name}-ca")):
            labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
            if secret is not None and any(labels.get(key) != value for key, value in MANAGED_BY.items()):
                # A name shared with another tool's Secret (an Ingress certificate, a password):
                # replacing it would destroy what that tool keeps there.
                label = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())
                raise ForeignSecret(f"secret {namespace}/{secret_name} exists and was not written by oversale-certs "
                                    f"(no label {label}): choose another --secret, or label it to hand it over")
        bundle = _bundle_of(current, ca_secret)
        problems = problems_with(bundle, hosts, renew_fraction) if current is not None else ["missing"]
        if not problems:
            return "unchanged"
        ca = bundle if ca_secret is not None and ca_usable(bundle, renew_fraction) else None
        renewed = issue(hosts, days=days, ca=ca, client=client_certificate)
        trusted = renewed.ca_cert
        if ca is None and bundle.ca_cert:
            # A new CA: keep trusting the old one until it expires, so replicas still serving the
            # old certificate stay verifiable while the kubelet refreshes their mounted Secret.
            trusted += unexpired_certificates(bundle.ca_cert)
        data = {CERT_FILE: renewed.cert, KEY_FILE: renewed.key, CA_FILE: trusted}
        try:
            if ca is None:
                _write_secret(core, namespace, f"{name}-ca", ca_secret,
                              {CA_FILE: renewed.ca_cert, CA_KEY_FILE: renewed.ca_key}, "Opaque")
            _write_secret(core, namespace, name, current, data, "kubernetes.io/tls")
        except ApiException as error:
            # Copies can run at once (the install Job and a CronJob run, a second apply, a run by
            # hand): on a first install they all find nothing and create, and all but one meet 409
            # AlreadyExists (on either Secret) or, renewing, 409 Conflict. Read again: what the
            # winner wrote is usually good as it is.
            if error.status == 409 and attempt < 2:
                continue
            raise
        return "created" if current is None else f"renewed: {'; '.join(problems)}"
    raise RuntimeError("gave up after repeated write conflicts")


RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
"""The Pod template annotation ``kubectl rollout restart`` sets: a new value rolls the Pods."""


def read_certificates(api_client: Any, secrets: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
    """The ``data`` of each Secret, read once per run. LookupError names a Secret that is missing
    or holds neither ``tls.crt`` nor ``ca.crt`` (cert-manager has not issued it yet), before
    anything restarts."""
    core = client.CoreV1Api(api_client)
    held = {}
    for namespace, name in sorted(set(secrets)):
        data = (_read_secret(core, namespace, name) or {}).get("data")
        if not data or not any(data.get(key) for key in CERTIFICATE_FILES):
            raise LookupError(f"secret {namespace}/{name} is missing or holds no {' or '.join(CERTIFICATE_FILES)}")
        held[(namespace, name)] = data
    return held


def certificates_digest(held: Mapping[tuple[str, str], Mapping[str, str]],
                        mounted: Mapping[tuple[str, str], frozenset[str]] | None = None) -> str:
    """A short digest of the certificates the Secrets hold (``tls.crt``, ``ca.crt``; of a Secret in
    ``mounted``, only the certificate files named there): what a consumer that reads them only at
    start was started with. LookupError names a Secret that holds none of the files mounted."""
    digest = hashlib.sha256()
    for (namespace, name), data in sorted(held.items()):
        chosen = (mounted or {}).get((namespace, name))
        keys = [key for key in CERTIFICATE_FILES if chosen is None or key in chosen]
        if not any(data.get(key) for key in keys):
            raise LookupError(f"secret {namespace}/{name} is missing or holds no {' or '.join(keys)}")
        for key in keys:
            digest.update(f"{namespace}/{name}/{key}:".encode() + base64.b64decode(data.get(key) or ""))
    return digest.hexdigest()[:16]


def mounted_certificates(template: Mapping[str, Any], namespace: str,
                         secrets: Sequence[tuple[str, str]]) -> dict[tuple[str, str], frozenset[str]]:
    """Which certificate files of each Secret a Pod template mounts (a secret volume or a projected
    source; its ``items``, or all of them when it names none). kube-scheduler mounts only the
    ``ca.crt`` of the extender's serving Secret: a renewal of the extender's own certificate,
    signed by the same CA, changes nothing it reads and must not restart it. A Secret the template
    does not mount is left out (its whole certificate counts)."""
    wanted = {name for secret_namespace, name in secrets if secret_namespace == namespace}
    found: dict[tuple[str, str], set[str]] = {}
    for volume in (template.get("spec") or {}).get("volumes") or []:
        sources = [volume["secret"]] if volume.get("secret") else []
        sources += [(source.get("secret") or {}) for source in (volume.get("projected") or {}).get("sources") or []
                    if source.get("secret")]
        for source in sources:
            name = source.get("secretName") or source.get("name")
            if name in wanted:
                items = {item.get("key") for item in source.get("items") or []}
                found.setdefault((namespace, name), set()).update(items.intersection(CERTIFICATE_FILES)
                                                                  if items else CERTIFICATE_FILES)
    return {secret: frozenset(keys) for secret, keys in found.items() if keys}


def restart_on_change(api_client: Any, namespace: str, name: str,
                      held: Mapping[tuple[str, str], Mapping[str, str]], key: str) -> str:
    """Roll the Deployment when its Pod template does not record the digest of the certificates it
    mounts from the Secrets ``held`` (``read_certificates``) under ``key`` (and record it); one
    line saying what was done.

    For ``certs ensure --restart`` (one Secret, its own ``key``) and for certificates another tool
    renews (cert-manager; ``restart-on-change`` on a schedule). kube-scheduler loads its extender
    ``tlsConfig`` files once (client-go's ``TLSConfigFor``, no reloading), so without a restart it
    would present the old client certificate until it expired. The record lives in the template
    itself, so the roll that records it is the restart."""
    deployment = found(client.AppsV1Api(api_client).read_namespaced_deployment, name, namespace,
                       _request_timeout=REQUEST_TIMEOUT)
    if deployment is None:
        return f"deployment {namespace}/{name}: not found, nothing to restart"
    template = (deployment.get("spec") or {}).get("template") or {}
    digest = certificates_digest(held, mounted_certificates(template, namespace, list(held)))
    started_with = ((template.get("metadata") or {}).get("annotations") or {}).get(key)
    if started_with == digest:
        return f"deployment {namespace}/{name}: unchanged (certificates {digest})"
    return _roll(api_client, namespace, name, {key: digest}) or (
        f"deployment {namespace}/{name}: restarted (certificates {started_with or 'not recorded'} -> {digest})")


def _roll(api_client: Any, namespace: str, name: str, annotations: dict[str, str]) -> str | None:
    """Set the Pod template's annotations and ``restartedAt`` (a new template rolls the Pods); a
    line to say instead when the Deployment does not exist, else None."""
    annotations = {**annotations, RESTARTED_AT: format_timestamp(time.time())}
    body = {"spec": {"template": {"metadata": {"annotations": annotations}}}}
    try:
        client.AppsV1Api(api_client).patch_namespaced_deployment(
            name, namespace, body, _content_type="application/merge-patch+json", _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT)
    except ApiException as error:
        if error.status == 404:
            return f"deployment {namespace}/{name}: not found, nothing to restart"
        raise
    return None


def inject_ca_bundle(api_client: Any, names: Sequence[str], ca_pem: bytes) -> list[str]:
    """Set ``caBundle`` on every webhook entry of the Mutating/ValidatingWebhookConfigurations named;
    one line per configuration saying what was done. Raises LookupError for a name that exists as
    neither kind."""
    api = client.AdmissionregistrationV1Api(api_client)
    encoded = base64.b64encode(ca_pem).decode()
    report = []
    for name in names:
        exists = False
        for kind, stem in WEBHOOK_KINDS:
            configuration = found(getattr(api, f"read_{stem}"), name, _request_timeout=REQUEST_TIMEOUT)
            if configuration is None:
                continue
            exists = True
            operations: list[dict[str, Any]] = []
            for index, webhook in enumerate(configuration.get("webhooks") or []):
                if (webhook.get("clientConfig") or {}).get("caBundle") == encoded:
                    continue
                # The test guards against the list changing between our read and our write.
                operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
                operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
            if operations:
                getattr(api, f"patch_{stem}")(
                    name, operations, _content_type="application/json-patch+json", _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
                report.append(f"{kind} {name}: caBundle set on {len(operations) // 2} webhook(s)")
            else:
                report.append(f"{kind} {name}: unchanged")
        if not exists:
            raise LookupError(f"no MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name!r}")
    return report


def read_ca_from_secret(api_client: Any, namespace: str, name: str) -> bytes:
    secret = _read_secret(client.CoreV1Api(api_client), namespace, name)
    if secret is None:
        raise LookupError(f"no secret {namespace}/{name}")
    if CA_FILE not in (secret.get("data") or {}):
        raise LookupError(f"secret {namespace}/{name} has no {CA_FILE}")
    return base64.b64decode(secret["data"][CA_FILE])


def _read_secret(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    return found(core.read_namespaced_secret, name, namespace, _request_timeout=REQUEST_TIMEOUT)


def _bundle_of(secret: dict[str, Any] | None, ca_secret: dict[str, Any] | None) -> Bundle:
    data = (secret or {}).get("data") or {}
    ca_data = (ca_secret or {}).get("data") or {}

    def field(values: dict[str, str], key: str) -> bytes:
        return base64.b64decode(values.get(key, ""))

    return Bundle(
        ca_cert=field(ca_data, CA_FILE) or field(data, CA_FILE),
        ca_key=field(ca_data, CA_KEY_FILE),
        cert=field(data, CERT_FILE),
        key=field(data, KEY_FILE),
    )


def _write_secret(
    core: Any, namespace: str, name: str, current: dict[str, Any] | None, data: dict[str, bytes], kind: str
) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(MANAGED_BY),
        },
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }
    if current is None:
        core.create_namespaced_secret(namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        log.info("created secret %s/%s", namespace, name)
    else:
        # resourceVersion makes a concurrent writer's update a 409 instead of a silent overwrite.
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        core.replace_namespaced_secret(name, namespace, body, _preload_content=False,
                                       _request_timeout=REQUEST_TIMEOUT)
        log.info("replaced secret %s/%s", namespace, name)
