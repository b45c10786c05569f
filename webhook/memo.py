"""A bounded memo for the admission hot path: answers of pure functions, by their inputs."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Answer = TypeVar("Answer")


class Memo(Generic[Answer]):
    """At most ``size`` answers, by key. A key of None, or one that cannot be hashed (a value
    somewhere in a malformed object), is computed and not kept. Answers are shared between
    requests, so callers only read them. When full, the memo is emptied rather than aged: the
    objects it serves (a cluster's nodes, its workloads' annotations) fill it again within one
    status period, and a dict needs no lock to be emptied. Keys are best one bytes object (the
    inputs serialised) and answers few objects: a miss then adds little for the garbage collector
    to traverse and promote (tuple keys and mutable answers made each miss of a Pod review cost
    50 us in collections on a worker holding the owner caches).

    >>> memo: Memo[int] = Memo(size=2)
    >>> memo.get(("a",), lambda: 1), memo.get(("a",), lambda: 2), memo.get(([],), lambda: 3)
    (1, 1, 3)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._answers: dict[Hashable, Answer] = {}

    def get(self, key: Hashable | None, compute: Callable[[], Answer]) -> Answer:
        if key is None:
            return compute()
        try:
            found = self._answers.get(key)
        except TypeError:
            return compute()
        if found is None:
            found = compute()
            if len(self._answers) >= self.size:
                self._answers.clear()
            self._answers[key] = found
        return found
