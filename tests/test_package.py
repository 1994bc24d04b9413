"""The package top: the facade's names load on first use, and the command line does not pay for them."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_building_the_command_line_imports_neither_the_facade_nor_the_memory_model():
    mods = _modules_after("import pipeloom.cli as c\nc.build_parser()")
    assert "pipeloom.cli.plan_cmd" in mods  # the parser was built
    assert "pipeloom.api" not in mods
    assert "pipeloom.memory.analytic" not in mods
    assert not {m for m in mods if m.split(".")[0] in ("torch", "matplotlib", "ortools", "rich")}


def test_the_public_names_are_there_on_first_use():
    import pipeloom
    from pipeloom import api

    assert set(pipeloom.__all__) == set(api.__all__)
    for name in api.__all__:
        assert getattr(pipeloom, name) is getattr(api, name)
    assert set(api.__all__) <= set(dir(pipeloom))
    ns: dict = {}
    exec("from pipeloom import *", ns)
    assert {n for n in ns if not n.startswith("__")} == set(api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pipeloom.no_such_name  # noqa: B018
