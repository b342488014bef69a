from __future__ import annotations

import importlib

import pytest

MODULES = ["turnledger", "turnledger.events", "turnledger.sessions", "turnledger.testing"]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_complete(name: str) -> None:
    module = importlib.import_module(name)
    names = list(module.__all__)
    assert names == sorted(names, key=lambda n: (not n.isupper(), n)) or names == sorted(names)
    for n in names:
        assert hasattr(module, n), f"{name}.{n} is listed but missing"
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, type(importlib))
    }
    assert public <= set(names) | {"annotations"}, public - set(names)
