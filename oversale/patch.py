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
    """
    if original == mutated:
        return []
    if original is None or mutated is None:
        return [{"op": "add", "path": at, "value": mutated} if original is None else {"op": "remove", "path": at}]
    operations: list[dict[str, Any]] = jsonpatch.make_patch(original, mutated).patch
    for operation in operations:
        operation["path"] = at + operation["path"]
        if "from" in operation:
            operation["from"] = at + operation["from"]
    return operations
