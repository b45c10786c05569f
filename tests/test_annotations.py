import re
from decimal import Decimal

import pytest

from oversale.annotations import AnnotationKeys, current_ratio, parse_ratio, parse_switch, read_ratios, wants
from oversale.errors import InvalidAnnotation, InvalidRatio


@pytest.mark.parametrize(("text", "ratio"), [("1", 1), ("1.5", Decimal("1.5")), ("2.25", Decimal("2.25")),
                                              ("3.7", Decimal("3.7")), (" 2 ", 2), ("10", 10)])
def test_plain_decimal_ratios_are_read_exactly(text, ratio):
    assert parse_ratio(text) == ratio


@pytest.mark.parametrize("text", ["abc", "0", "-1", "0.5", "NaN", "nan", "inf", "Infinity", "1e3", "1e400", "",
                                  "1.", ".5", "+2", "2x", "1,5", "9" * 40, "\u0662", "\uff12"])  # other scripts' 2
def test_anything_else_is_an_invalid_ratio(text):
    with pytest.raises(InvalidRatio):
        parse_ratio(text)


def test_a_compression_ratio_below_1_raises_requests_but_0_is_no_ratio():
    assert parse_ratio("0.5", minimum=Decimal("0.5")) == Decimal("0.5")
    with pytest.raises(InvalidRatio, match=r"'0' is not above 0 \(a ratio of 1 means no change, 0.5 doubles"):
        parse_ratio("0", minimum=Decimal("0.5"))
    with pytest.raises(InvalidRatio, match=r"'0.5' is below 1 \(a ratio of 1 means no change\)"):
        parse_ratio("0.5")
    with pytest.raises(InvalidRatio, match=r"'1e3' is not a plain decimal number such as 1, 1.5 or 2.25"):
        parse_ratio("1e3")


@pytest.mark.parametrize(("text", "value"), [("y", True), ("YES", True), ("true", True), ("n", False),
                                              ("No", False), ("FALSE", False)])
def test_switch_vocabulary(text, value):
    assert parse_switch(text) is value


def test_switch_rejects_other_words():
    with pytest.raises(InvalidAnnotation):
        parse_switch("maybe")


def test_keys_follow_the_configured_prefix():
    keys = AnnotationKeys("example.com")
    assert keys.cpu_requests_ratio == "example.com/cpu-requests-ratio"
    assert keys.memory_requests_ratio == "example.com/memory-requests-ratio"
    assert keys.enable_resource_compress == "example.com/enable-resource-compress"
    assert keys.original_requests == "example.com/original-requests"
    assert AnnotationKeys().cpu_requests_ratio == "stke.platform/cpu-requests-ratio"
    assert keys.certificates_from("oversale", "oversale-scheduler-client") == \
        "example.com/certificates.oversale.oversale-scheduler-client"
    assert keys.ours({"example.com/cpu-requests-ratio": "2", "other/x": "1"}) == {
        "example.com/cpu-requests-ratio": "2"
    }


def test_the_ratio_an_object_carries_reads_as_the_webhooks_read_it():
    key = AnnotationKeys().cpu_oversale_ratio
    assert current_ratio({key: "1.5"}, key) == Decimal("1.5")
    assert current_ratio({}, key) == current_ratio({key: "lots"}, key) == current_ratio({key: "0.5"}, key) == 1
    # A compression ratio below the minimum reads as the minimum, as the webhook clamps it.
    assert current_ratio({key: "0.25"}, key, minimum=Decimal("0.5")) == Decimal("0.5")
    assert current_ratio({key: "0.75"}, key, minimum=Decimal("0.5")) == Decimal("0.75")


def test_ratios_outside_the_bounds_are_clamped_with_a_warning_and_those_at_them_are_not():
    keys = AnnotationKeys()

    def read(cpu: str, memory: str):
        annotations = {keys.cpu_requests_ratio: cpu, keys.memory_requests_ratio: memory}
        return read_ratios(annotations, keys.requests_ratio, lambda resource: Decimal(4), "not compressed",
                           minimum=Decimal("0.5"))

    at_bounds = read("4", "0.5")
    assert at_bounds.ratios == {"cpu": 4, "memory": Decimal("0.5")} and at_bounds.warnings == []
    beyond = read("5", "0.25")
    assert beyond.ratios == {"cpu": 4, "memory": Decimal("0.5")}
    assert beyond.warnings == [
        "stke.platform/cpu-requests-ratio=5 is above the maximum 4; using 4",
        "stke.platform/memory-requests-ratio=0.25 is below the minimum 0.5; using 0.5"]
    unchanged = read("1", "x")
    assert unchanged.ratios == {} and unchanged.warnings == []
    assert [str(problem) for problem in unchanged.problems] == [
        "annotation stke.platform/memory-requests-ratio='x' ignored: 'x' is not a plain decimal number such as "
        "1, 1.5 or 2.25; memory not compressed"]


def test_a_per_secret_key_stays_a_valid_annotation_key_for_the_longest_names():
    """The API server refuses a Deployment whose annotation key's name part exceeds 63 characters
    or does not start and end with an alphanumeric; a long Secret name must not make ensure fail."""
    keys = AnnotationKeys()
    # The first is one character too long (64): the name part is a hash of it.
    long_names = [("oversale", "s" * 42), ("oversale", "s" * 50), ("n" * 63, "s" * 253), ("n" * 63, "t" * 253)]
    made = [keys.certificates_from(namespace, name) for namespace, name in long_names]
    for key in made:
        name_part = key.removeprefix("stke.platform/")
        assert len(name_part) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9_.]*[a-z0-9])?", name_part), key
    assert len(set(made)) == len(made), "different Secrets never share a record"
    fitting = keys.certificates_from("oversale", "s" * 41)
    assert fitting == f"stke.platform/certificates.oversale.{'s' * 41}"


def test_the_docs_name_every_annotation_key_and_only_keys_that_exist():
    """Users write these keys by hand from the docs: each key the code reads or writes is named
    there (in full, or by its name part where a sentence gives the pair, e.g. ``cpu-runtime-
    watermark`` / ``memory-runtime-watermark``), and every full key the docs name is one of them."""
    from functools import cached_property

    from tests.conftest import ROOT

    keys = AnnotationKeys()
    ours = {getattr(keys, name) for name, value in vars(AnnotationKeys).items() if isinstance(value, cached_property)}
    ours = {key for key in ours if isinstance(key, str)}
    for per_resource in (keys.hot_time_budget, keys.oversale_ratio, keys.requests_ratio,
                         keys.original_target_utilization_of):
        ours |= {per_resource("cpu"), per_resource("memory")}
    assert len(ours) >= 40 and all(key.startswith("stke.platform/") for key in ours)
    docs = "\n".join(path.read_text() for path in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
    undocumented = {key for key in ours if key not in docs and f"`{key.split('/')[1]}`" not in docs}
    assert undocumented == set()
    named = set(re.findall(r"stke\.platform/[A-Za-z0-9.<>-]*[A-Za-z0-9>]", docs))
    per_secret = {key for key in named if key.startswith(f"{keys.certificates}.")}  # certificates_from's
    assert named - per_secret - ours == set()


def test_a_ratio_is_at_least_1_unless_the_caller_allows_less():
    """Node ratios (the default minimum): 1 means no change and is allowed; below 1 would shrink
    a node below its real capacity and is refused."""
    assert parse_ratio("1") == 1
    with pytest.raises(InvalidRatio) as refused:
        parse_ratio("0.9")
    assert str(refused.value) == "'0.9' is below 1 (a ratio of 1 means no change)"
    assert parse_ratio("0.9", minimum=Decimal("0.5")) == Decimal("0.9")


@pytest.mark.parametrize(("annotations", "wanted"), [
    ({}, False), ({"stke.platform/inplace-resize": "yes"}, True), ({"stke.platform/inplace-resize": "Y"}, True),
    ({"stke.platform/inplace-resize": "n"}, False), ({"stke.platform/inplace-resize": "maybe"}, False),
])
def test_a_yes_no_annotation_is_wanted_only_when_it_says_yes(annotations, wanted):
    assert wants(annotations, AnnotationKeys().inplace_resize) is wanted
