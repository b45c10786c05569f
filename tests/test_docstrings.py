"""The examples in the docstrings of every package's modules are run: one that no longer holds fails."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("oversale", "kube", "webhook", "reconcilers", "scheduler", "certs", "simulator")


def modules_with_examples() -> list[str]:
    """Every module of the packages (their entry points aside) whose docstrings hold an example."""
    names = [f"{package}.{module.name}" for package in PACKAGES
             for module in pkgutil.iter_modules(importlib.import_module(package).__path__) if module.name != "__main__"]
    return sorted(name for name in names
                  if any(test.examples for test in doctest.DocTestFinder().find(importlib.import_module(name))))


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_docstring_examples_hold(name):
    failures, _ = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert failures == 0, f"{name}: {failures} docstring example(s) no longer hold (output above)"
