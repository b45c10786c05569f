"""Where every adapter gets its API client."""

from __future__ import annotations

from typing import Any


def load_api_client(mode: str) -> Any | None:
    """A kubernetes ApiClient from in-cluster config, else the kubeconfig; None when neither exists
    or ``mode`` is ``off``."""
    if mode == "off":
        return None
    from kubernetes import client, config

    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        pass
    try:
        configuration = client.Configuration()
        config.load_kube_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except (config.ConfigException, OSError, TypeError, ValueError):
        return None


def one_line(error: Exception) -> str:
    """An API or connection error as one short line: the client's own messages span many lines
    and name library internals, which logs and users should not have to read."""
    status = getattr(error, "status", None)
    if status:
        return f"HTTP {status} {getattr(error, 'reason', None) or ''}".strip()
    text = str(error)
    return text.splitlines()[0][:200] if text else type(error).__name__
