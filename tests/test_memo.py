"""The admission hot path's bounded memo (webhook.memo.Memo): what it keeps, and what it must not."""

from __future__ import annotations

from collections.abc import Callable

from webhook.memo import Memo


def counting(answer: str, calls: list[str]) -> Callable[[], str]:
    def compute() -> str:
        calls.append(answer)
        return answer
    return compute


def test_a_kept_answer_is_served_without_computing_again():
    memo: Memo[str] = Memo(size=4)
    calls: list[str] = []
    assert memo.get(b"pod-a", counting("first", calls)) == "first"
    assert memo.get(b"pod-a", counting("second", calls)) == "first"
    assert calls == ["first"]


def test_a_key_of_none_is_computed_every_time_and_never_shared():
    # None is what callers pass when a question cannot be keyed; two such questions are different.
    memo: Memo[str] = Memo(size=4)
    assert memo.get(None, lambda: "first") == "first"
    assert memo.get(None, lambda: "second") == "second"


def test_an_unhashable_key_is_computed_every_time():
    memo: Memo[str] = Memo(size=4)
    assert memo.get((b"pod", ["malformed"]), lambda: "first") == "first"
    assert memo.get((b"pod", ["malformed"]), lambda: "second") == "second"


def test_a_full_memo_is_emptied_before_it_keeps_one_more_answer():
    memo: Memo[str] = Memo(size=2)
    memo.get(b"a", lambda: "a")
    memo.get(b"b", lambda: "b")
    assert memo.get(b"a", lambda: "a again") == "a"  # within its size, it keeps every answer
    memo.get(b"c", lambda: "c")  # the memo held its size: emptied, then keeps only c
    calls: list[str] = []
    assert memo.get(b"c", counting("c again", calls)) == "c"
    assert memo.get(b"a", counting("a again", calls)) == "a again"
    assert memo.get(b"b", counting("b again", calls)) == "b again"
    assert calls == ["a again", "b again"]
