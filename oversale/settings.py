"""Every knob of the service: one dataclass, read from the environment in one place.

Each field names its environment variable in ``metadata["env"]``; the README's settings table
lists them all (a test keeps the two in step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from oversale.annotations import DEFAULT_PREFIX, AnnotationKeys
from oversale.compression import CompressionConfig
from oversale.errors import QuantityError, SettingsError
from oversale.node_oversale import OversaleLimits
from oversale.quantity import parse_bytes, parse_millicores

SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


def _env(name: str) -> dict[str, Any]:
    return {"env": name}


@dataclass(frozen=True)
class Settings:
    """Runtime settings of the webhook (and, later, of the other components)."""

    annotation_prefix: str = field(default=DEFAULT_PREFIX, metadata=_env("OVERSALE_ANNOTATION_PREFIX"))
    """Prefix of every annotation key read or written, e.g. ``stke.platform/cpu-requests-ratio``."""

    max_ratio: Decimal = field(default=Decimal(4), metadata=_env("OVERSALE_MAX_RATIO"))
    """Largest compression ratio applied; larger annotations are clamped to it with a warning."""

    cpu_floor_millicores: int = field(default=10, metadata=_env("OVERSALE_CPU_FLOOR"))
    """No CPU request is compressed below this (a quantity such as ``10m``)."""

    memory_floor_bytes: int = field(default=16 * 2**20, metadata=_env("OVERSALE_MEMORY_FLOOR"))
    """No memory request is compressed below this (a quantity such as ``16Mi``)."""

    allow_guaranteed_downgrade: bool = field(default=False, metadata=_env("OVERSALE_ALLOW_GUARANTEED_DOWNGRADE"))
    """Compress Guaranteed Pods too (they become Burstable). Off: they are left alone, with a warning."""

    namespace: str = field(default="oversale", metadata=_env("OVERSALE_NAMESPACE"))
    """The service's own namespace (always excluded). Defaults to ``POD_NAMESPACE`` when that is set."""

    excluded_namespaces: frozenset[str] = field(
        default=frozenset(SYSTEM_NAMESPACES), metadata=_env("OVERSALE_EXCLUDED_NAMESPACES")
    )
    """Comma-separated namespaces whose Pods are never touched (the own namespace is added)."""

    max_cpu_oversale_ratio: Decimal = field(default=Decimal(3), metadata=_env("OVERSALE_MAX_CPU_OVERSALE_RATIO"))
    """Largest node CPU oversale ratio (inclusive); larger annotations are clamped."""

    max_memory_oversale_ratio: Decimal = field(default=Decimal(2), metadata=_env("OVERSALE_MAX_MEMORY_OVERSALE_RATIO"))
    """Largest node memory oversale ratio (inclusive); larger annotations are clamped."""

    kubelet_username: str = field(default="system:node:{node}", metadata=_env("OVERSALE_KUBELET_USERNAME"))
    """How a node's own kubelet authenticates; ``{node}`` is the Node name. Only its writes (and
    Node CREATE) may refresh the real allocatable/capacity."""

    pod_lookup_timeout_seconds: float = field(default=3.0, metadata=_env("OVERSALE_POD_LOOKUP_TIMEOUT"))
    """Timeout of the live Pod list the node validating webhook makes when a ratio is lowered."""

    max_body_bytes: int = field(default=6 * 2**20, metadata=_env("OVERSALE_MAX_BODY_BYTES"))
    """AdmissionReview bodies larger than this get a 400 (a quantity such as ``6Mi``)."""

    kubernetes: str = field(default="auto", metadata=_env("OVERSALE_KUBERNETES"))
    """``auto``: use in-cluster config, else the kubeconfig, else run with Pod annotations only;
    ``off``: never contact an API server."""

    owner_lookup_timeout_seconds: float = field(default=1.0, metadata=_env("OVERSALE_OWNER_LOOKUP_TIMEOUT"))
    """Timeout of the one GET made when an owner is not in the watch cache yet."""

    watch_timeout_seconds: int = field(default=300, metadata=_env("OVERSALE_WATCH_TIMEOUT"))
    """Server-side timeout of each watch request; the cache re-watches from its last version."""

    workers: int = field(default=2, metadata=_env("OVERSALE_WORKERS"))
    """gunicorn worker processes (``--workers`` overrides)."""

    threads: int = field(default=4, metadata=_env("OVERSALE_THREADS"))
    """Threads per gunicorn gthread worker (``--threads`` overrides)."""

    keepalive_seconds: int = field(default=75, metadata=_env("OVERSALE_KEEPALIVE"))
    """How long an idle keep-alive connection stays open; the API server reuses connections."""

    log_level: str = field(default="INFO", metadata=_env("OVERSALE_LOG_LEVEL"))
    """Python log level name (DEBUG logs every admission)."""

    @property
    def keys(self) -> AnnotationKeys:
        return AnnotationKeys(self.annotation_prefix)

    @property
    def compression(self) -> CompressionConfig:
        return CompressionConfig(
            max_ratio=self.max_ratio,
            cpu_floor_millicores=self.cpu_floor_millicores,
            memory_floor_bytes=self.memory_floor_bytes,
            allow_guaranteed_downgrade=self.allow_guaranteed_downgrade,
        )

    @property
    def oversale_limits(self) -> OversaleLimits:
        return OversaleLimits(self.max_cpu_oversale_ratio, self.max_memory_oversale_ratio)

    def is_kubelet_of(self, username: str, node: str) -> bool:
        return username == self.kubelet_username.format(node=node)

    def skips_namespace(self, namespace: str) -> bool:
        return namespace in self.excluded_namespaces or namespace == self.namespace

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Read every field from ``environ``; unset variables keep their defaults.

        Raises SettingsError naming the variable and the value when one cannot be used.
        """
        values: dict[str, Any] = {}
        if environ.get("POD_NAMESPACE"):
            values["namespace"] = environ["POD_NAMESPACE"]
        for spec in dataclasses.fields(cls):
            name = spec.metadata["env"]
            if name not in environ:
                continue
            try:
                values[spec.name] = _PARSERS[spec.name](environ[name])
            except (ValueError, InvalidOperation, QuantityError) as error:
                raise SettingsError(f"{name}={environ[name]!r}: {error}") from None
        return cls(**values)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number of seconds")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "y", "on"}:
        return True
    if lowered in {"0", "false", "no", "n", "off", ""}:
        return False
    raise ValueError("must be true or false")


def _max_ratio(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise ValueError("must be a number >= 1") from None
    if not value.is_finite() or value < 1:
        raise ValueError("must be a number >= 1")
    return value


def _username_template(text: str) -> str:
    if "{node}" not in text:
        raise ValueError("must contain {node}, e.g. system:node:{node}")
    text.format(node="x")
    return text


def _prefix(text: str) -> str:
    if not text or "/" in text or len(text) > 253:
        raise ValueError("must be a DNS subdomain such as stke.platform (no slash)")
    return text


def _choice(*allowed: str) -> Any:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


def _level(text: str) -> str:
    level = text.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


_PARSERS: dict[str, Any] = {
    "annotation_prefix": _prefix,
    "max_ratio": _max_ratio,
    "cpu_floor_millicores": parse_millicores,
    "memory_floor_bytes": parse_bytes,
    "allow_guaranteed_downgrade": _bool,
    "namespace": str,
    "excluded_namespaces": lambda text: frozenset(n.strip() for n in text.split(",") if n.strip()),
    "max_cpu_oversale_ratio": _max_ratio,
    "max_memory_oversale_ratio": _max_ratio,
    "kubelet_username": _username_template,
    "pod_lookup_timeout_seconds": _positive_float,
    "max_body_bytes": parse_bytes,
    "kubernetes": _choice("auto", "off"),
    "owner_lookup_timeout_seconds": _positive_float,
    "watch_timeout_seconds": _positive_int,
    "workers": _positive_int,
    "threads": _positive_int,
    "keepalive_seconds": _positive_int,
    "log_level": _level,
}
