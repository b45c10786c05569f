"""Where every adapter gets its API client, and how its errors are told in one line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit


def load_api_client(mode: str) -> Any | None:
    """A kubernetes ApiClient from in-cluster config, else the kubeconfig; None when neither exists
    or ``mode`` is ``off``.

    A kubeconfig that exists but is broken (a context that names no cluster, an unreadable
    certificate) raises ``kubernetes.config.ConfigException``: silently falling back to "no
    cluster" would hide a mistake the user has to fix."""
    if mode == "off":
        return None
    from kubernetes import client, config

    try:
        configuration = _configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        pass
    paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p] or \
        [os.path.expanduser(config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)]
    if not any(os.path.exists(p) for p in paths):
        return None
    configuration = _configuration()
    try:
        # The paths just checked, not the client library's default: that one is read from
        # KUBECONFIG once, when the library is imported.
        config.load_kube_config(config_file=os.pathsep.join(paths), client_configuration=configuration)
    except config.ConfigException as error:
        raise config.ConfigException(f"kubeconfig {os.pathsep.join(paths)}: {one_line(error)}") from None
    except (OSError, TypeError, ValueError, AttributeError) as error:
        raise config.ConfigException(f"kubeconfig {os.pathsep.join(paths)} is not a valid kubeconfig "
                                     f"({type(error).__name__})") from None
    return client.ApiClient(configuration)


def _configuration() -> Any:
    """A client configuration whose requests give up once their ``_request_timeout`` has passed.

    urllib3's default retries send a GET (or PUT, DELETE) again up to 3 times after its answer
    timed out, so a read given 1 s took 4 s against an API server that stopped answering: longer
    than the 5 s an admission webhook is given for a list of 3 s, or kube-scheduler for a bind.
    A connection dropped or refused is still tried again (a keep-alive connection the API server
    closed while idle); an answer that did not come in time is not."""
    from kubernetes import client
    from urllib3.exceptions import ReadTimeoutError
    from urllib3.util.retry import Retry

    class NoRetryAfterTimeout(Retry):
        def increment(self, method: str | None = None, url: str | None = None, response: Any = None,
                      error: Exception | None = None, _pool: Any = None, _stacktrace: Any = None) -> Any:
            if isinstance(error, ReadTimeoutError):
                raise error
            return super().increment(method, url, response, error, _pool, _stacktrace)

    configuration = client.Configuration()
    configuration.retries = NoRetryAfterTimeout(3)
    return configuration


VPA = ("autoscaling.k8s.io", "v1", "verticalpodautoscalers")
"""Group, version and plural of the VerticalPodAutoscaler custom resource."""


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj``, as the API server sent it, less ``metadata.managedFields`` (server-side field
    tracking: each writer's fields, much of a Pod, 56% of ``bench.served``'s as JSON), which no
    part of oversale reads: what a cache or a pass keeps of a listed object stays smaller. In
    place: the objects are freshly parsed."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return obj


class GarbledAnswer(Exception):
    """A call answered 2xx with a body that is no Kubernetes object: a proxy in front of the API
    server answering its own page (a sign-in, a captive portal), or an aggregated API such as
    ``metrics.k8s.io`` whose APIService points at a backend that is not what it names. The
    client would stop with a bare ``JSONDecodeError`` that names neither the call nor the answer."""


def decoded(response: Any) -> dict[str, Any]:
    """The object a ``_preload_content=False`` call answered (its raw urllib3 response), parsed;
    :class:`GarbledAnswer`, naming the path and what came back, when the body is no JSON object
    or its ``items`` no list.

    >>> class Empty:
    ...     data, url, headers = b'{"kind": "PodMetricsList", "items": null}', "/apis/metrics.k8s.io/v1beta1/pods", {}
    >>> decoded(Empty())["kind"]
    'PodMetricsList'

    >>> class Page:
    ...     data, url, headers = b"<html>Sign in</html>", "/api/v1/nodes?limit=500", {"Content-Type": "text/html"}
    >>> decoded(Page())
    Traceback (most recent call last):
    ...
    kube.client.GarbledAnswer: the answer to /api/v1/nodes is no Kubernetes object (text/html, 20 bytes)
    """
    try:
        obj = json.loads(response.data)
    except (ValueError, TypeError):
        obj = None
    # A list's ``items`` may come as null: Go encodes an empty slice left nil that way.
    if not isinstance(obj, dict) or not isinstance(obj.get("items") or [], list):
        path, kind = answered(response)
        raise GarbledAnswer(f"the answer to {path} is no Kubernetes object ({kind}, "
                            f"{len(response.data or b'')} bytes)")
    return obj


def answered(response: Any) -> tuple[str, str]:
    """The path a raw urllib3 response answers and its Content-Type, for a message about it."""
    path = urlsplit(getattr(response, "url", None) or "").path or "the API server"
    return path, (getattr(response, "headers", None) or {}).get("Content-Type") or "no Content-Type"


def found(read: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """What a read or list of the ``kubernetes`` client answers (``read(*args, **kwargs)``, made
    with ``_preload_content=False``), :func:`decoded`; None when the API server has none: 404, no
    such object, or no such kind served (a CRD not installed). Other refusals raise."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = read(*args, _preload_content=False, **kwargs)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return decoded(response)


def api_server_of(api_client: Any) -> str:
    """The API server an ApiClient talks to, for a log line that says which cluster is used."""
    return str(getattr(getattr(api_client, "configuration", None), "host", "") or "?")


def first_few(names: Sequence[str], few: int = 5) -> str:
    """The first ``few`` of ``names`` for a log line, and how many more there are.

    >>> first_few(["node-a", "node-b"]), first_few(["a", "b", "c", "d"], 2)
    ('node-a, node-b', 'a, b and 2 more')
    """
    return ", ".join(names[:few]) + (f" and {len(names) - few} more" if len(names) > few else "")


def one_line(error: BaseException, all_words: bool = False) -> str:
    """An API or connection error as one short line: the client's own messages span many lines
    and name library internals (urllib3 pools, retry objects), which logs and kubectl users should
    not have to read. An API error is its HTTP status, then the API server's own words
    (:func:`api_message`) where it refused the request (4xx): they say which permission, policy
    or conflict (RBAC's "cannot list resource", an admission webhook's denial, "already assigned
    to node"). A 5xx's words are said too with ``all_words``.

    >>> class Forbidden(Exception):
    ...     status, reason = 403, "Forbidden"
    ...     body = '{"kind": "Status", "message": "nodes is forbidden: User x cannot list resource nodes"}'
    >>> one_line(Forbidden())
    'HTTP 403 Forbidden: nodes is forbidden: User x cannot list resource nodes'
    """
    status = getattr(error, "status", None)
    if isinstance(status, int) and status:
        line = f"HTTP {status} {getattr(error, 'reason', None) or ''}".strip()
        said = api_message(error)[:200] if all_words or 400 <= status < 500 else ""
        return f"{line}: {said}" if said else line
    unreachable = _unreachable(error)
    if unreachable:
        return unreachable
    text = str(error)
    return text.splitlines()[0][:200] if text.strip() else type(error).__name__


def api_message(error: BaseException) -> str:
    """The API server's own explanation of a refusal, from the Status in its body (its first
    line: an admission webhook's or a policy engine's words, RBAC's "cannot patch resource");
    "" when the body holds none.

    >>> class Refused(Exception):
    ...     body = '{"kind": "Status", "message": "admission webhook denied the request: no"}'
    >>> api_message(Refused()), api_message(ValueError("no body"))
    ('admission webhook denied the request: no', '')
    """
    try:
        message = json.loads(getattr(error, "body", None) or "{}").get("message")
    except (ValueError, TypeError, AttributeError):
        return ""
    return str(message).splitlines()[0] if message else ""


def api_refusal(error: BaseException) -> str:
    """A refused API call for a log line or an Event: its HTTP status and the API server's own
    words (:func:`api_message`), else its HTTP reason.

    >>> class Conflict(Exception):
    ...     status, reason, body = 409, "Conflict", None
    >>> api_refusal(Conflict())
    '409 Conflict'
    """
    return f"{getattr(error, 'status', '')} {api_message(error) or getattr(error, 'reason', '')}".strip()


def refused_by_server(error: BaseException) -> bool:
    """The API server answered the request with a refusal (HTTP 4xx): what it asked for did not
    happen. A timeout, a dropped connection or a 5xx (the API server's own timeout writing to
    etcd among them) leaves open whether it did."""
    status = getattr(error, "status", None)
    return isinstance(status, int) and 400 <= status < 500


def _unreachable(error: BaseException) -> str | None:
    """urllib3 wraps a refused or timed-out connection in MaxRetryError(pool, url, reason);
    say which host and the root cause instead."""
    try:
        import urllib3
    except ImportError:  # pragma: no cover - kubernetes depends on urllib3
        return None
    if not isinstance(error, urllib3.exceptions.HTTPError):
        return None
    pool = getattr(error, "pool", None)
    where = f"{pool.host}:{pool.port}" if pool is not None and getattr(pool, "host", None) else "the server"
    root = getattr(error, "reason", None) or error
    text = str(root)
    for known, said in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                        ("Name or service not known", "unknown host"), ("nodename nor servname", "unknown host"),
                        ("Temporary failure in name resolution", "name lookup failed"),
                        ("CERTIFICATE_VERIFY_FAILED", "its certificate is not trusted"),
                        ("No route to host", "no route to host"),
                        # A connection the server (or a proxy) closed or reset before it answered.
                        ("Connection aborted", "connection dropped"),
                        ("Connection reset by peer", "connection dropped")):
        if known in text:
            return f"{where} unreachable ({said})"
    detail = text.split(": ", 1)[-1].splitlines()[0][:120] if text else type(root).__name__
    return f"{where} unreachable ({detail})"
