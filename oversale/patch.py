"""The one place JSON patches are built: RFC 6902 operations from a before and an after object.

jsonpatch escapes ``/`` and ``~`` in keys (``stke.platform~1original-requests``) and adds whole
maps where the original had none, which a hand-written patch easily gets wrong.
"""

from __future__ import annotations

from typing import Any

import jsonpatch


def make_patch(original: Any, mutated: Any, at: str = "") -> list[dict[str, Any]]:
    """The operations that turn ``original`` into ``mutated`` (empty when they are equal).

    ``at`` is the JSON pointer of both inside a larger document, so a caller that changed one
    small part of a large object diffs only that part:

    >>> make_patch({"a/b": "1"}, {"a/b": "2"}, at="/metadata/annotations")
    [{'op': 'replace', 'path': '/metadata/annotations/a~1b', 'value': '2'}]
    >>> make_patch(None, {"x": "1"}, at="/metadata/annotations")
    [{'op': 'add', 'path': '/metadata/annotations', 'value': {'x': '1'}}]

    Maps within maps are diffed down to the value that changed, not replaced whole:

    >>> make_patch({"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
    ...            {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}, at="/spec/containers/0/resources")
    [{'op': 'replace', 'path': '/spec/containers/0/resources/requests/cpu', 'value': '500m'}]
    """
    if original == mutated:
        return []
    if original is None or mutated is None:
        return [{"op": "add", "path": at, "value": mutated} if original is None else {"op": "remove", "path": at}]
    if _flat(original) and _flat(mutated):
        return map_patch(original, mutated, at)
    operations: list[dict[str, Any]] = jsonpatch.make_patch(original, mutated).patch
    for operation in operations:
        operation["path"] = at + operation["path"]
        if "from" in operation:
            operation["from"] = at + operation["from"]
    return operations


def _flat(value: Any) -> bool:
    """A map of strings to scalars (annotations, allocatable): diffed without jsonpatch, whose
    general algorithm costs far more than these maps need on the node-heartbeat hot path."""
    return isinstance(value, dict) and all(isinstance(v, _SCALARS) for v in value.values())


_SCALARS = (str, int, float, bool)


def map_patch(original: dict[str, Any], mutated: dict[str, Any], at: str) -> list[dict[str, Any]]:
    """:func:`make_patch` for two maps known to exist, key by key: a changed value is replaced
    whole (right for maps of scalars such as a container's requests, and cheaper than asking).

    >>> map_patch({"cpu": "1", "memory": "1Gi"}, {"cpu": "500m"}, at="/spec/containers/0/resources/requests")
    [{'op': 'remove', 'path': '/spec/containers/0/resources/requests/memory'}, \
{'op': 'replace', 'path': '/spec/containers/0/resources/requests/cpu', 'value': '500m'}]
    """
    operations: list[dict[str, Any]] = []
    for key in original:
        if key not in mutated:
            operations.append({"op": "remove", "path": f"{at}/{_escape(key)}"})
    for key, value in mutated.items():
        if key not in original:
            operations.append({"op": "add", "path": f"{at}/{_escape(key)}", "value": value})
        elif original[key] != value:
            operations.append({"op": "replace", "path": f"{at}/{_escape(key)}", "value": value})
    return operations


def _escape(key: str) -> str:
    """RFC 6901: ``~`` becomes ``~0`` and ``/`` becomes ``~1`` in a JSON pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")
