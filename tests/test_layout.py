"""The architecture as a test: the core does no I/O, and adapters never import each other (shared
plumbing lives in ``kube/``)."""

from __future__ import annotations

import ast

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
