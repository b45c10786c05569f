"""The one place JSON patches are built: RFC 6902 operations from a before and an after object.

jsonpatch escapes ``/`` and ``~`` in keys (``stke.platform~1original-requests``) and adds whole
maps where the original had none, which a hand-written patch easily gets wrong.
"""

from __future__ import annotations

from typing import Any

import jsonpatch


def make_patch(original: Any, mutated: Any) -> list[dict[str, Any]]:
    """The operations that turn ``original`` into ``mutated`` (empty when they are equal)."""
    operations: list[dict[str, Any]] = jsonpatch.make_patch(original, mutated).patch
    return operations
