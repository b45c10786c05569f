"""The architecture as a test: the core does no I/O, and adapters never import each other (shared
plumbing lives in ``kube/``)."""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import ROOT

ADAPTERS = ("webhook", "reconcilers", "scheduler", "certs")
IO_MODULES = {"kubernetes", "flask", "gunicorn", "urllib", "http", "socket", "sqlite3", "subprocess", "requests",
              "prometheus_client", "kube", *ADAPTERS}


def imported(package: str) -> dict[str, set[str]]:
    """File -> top-level packages it imports (anywhere in the file, lazy imports included)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_the_core_does_no_io():
    for path, names in imported("oversale").items():
        assert not names & IO_MODULES, f"{path} imports {sorted(names & IO_MODULES)}"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_adapters_never_import_each_other(adapter):
    others = set(ADAPTERS) - {adapter}
    for path, names in imported(adapter).items():
        assert not names & others, f"{path} imports {sorted(names & others)}: move the shared part to kube/"


def test_the_policy_map_names_functions_that_exist_where_they_are_called():
    """docs/architecture.md's "Changing a policy" is where a maintainer starts: every core
    function it names is defined in that ``oversale/`` module, every caller it names calls one of
    its row's functions, and every test file it names exists. A rename that leaves the map
    behind fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Changing a policy", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines()
            if line.startswith("| ") and "`" in line and not line.startswith("| decision")]
    assert len(rows) >= 8, "the map's rows"
    for decision, core, live, replay, tests in rows:
        qualified = re.findall(r"`(\w+)\.(\w+)`", core)
        assert qualified, f"{decision}: no oversale function named"
        names = {name for _, name in qualified}
        for module, name in qualified:
            tree = ast.parse((ROOT / "oversale" / f"{module}.py").read_text())
            defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            assert name in defined, f"{decision}: oversale/{module}.py defines no {name}"
        for caller in re.findall(r"`(\w+/\w+\.py)`", live + replay):
            source = (ROOT / caller).read_text()
            assert any(re.search(rf"\b{name}\b", source) for name in names), \
                f"{decision}: {caller} uses none of {sorted(names)}"
        for test in re.findall(r"`(test_\w+\.py)`", tests):
            assert (ROOT / "tests" / test).is_file(), f"{decision}: no tests/{test}"
