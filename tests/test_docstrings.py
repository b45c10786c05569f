"""The examples in the core's docstrings (and the webhook memo's) are run: one that no longer holds fails."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import oversale

MODULES = [*sorted(name for name in (f"oversale.{m.name}" for m in pkgutil.iter_modules(oversale.__path__))
                  if any(test.examples for test in doctest.DocTestFinder().find(importlib.import_module(name)))),
           "webhook.memo", "kube.prometheus", "reconcilers.plan", "reconcilers.prometheus", "scheduler.state"]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name):
    failures, _ = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert failures == 0, f"{name}: {failures} docstring example(s) no longer hold (output above)"
