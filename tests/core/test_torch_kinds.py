"""core/torch_kinds.py: the one map between pipeloom's job kinds and torch's action letters, against torch's own
enum (expected names written out here, not taken from pipeloom)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeloom.core.ir import Kind
from pipeloom.core.torch_kinds import KIND_OF_LETTER, TORCH_LETTER

ROOT = Path(__file__).resolve().parents[2]
#: files allowed their own copy for now: trace/ has another owner; drop the entry once it imports the map
EXEMPT = {"src/pipeloom/trace/torch_profile.py"}


def test_each_kind_is_the_torch_computation_it_names():
    ts = pytest.importorskip("torch.distributed.pipelining.schedules")
    expected = {Kind.F: "FORWARD", Kind.B: "BACKWARD_INPUT", Kind.W: "BACKWARD_WEIGHT", Kind.BW: "FULL_BACKWARD"}
    got = {k: ts._ComputationType.from_str(TORCH_LETTER[k]).name for k in Kind}
    assert got == expected
    assert {KIND_OF_LETTER[letter] for letter in TORCH_LETTER.values()} == set(Kind)


def test_no_other_module_writes_the_map_again():
    # a dict literal that pairs torch's "I" with pipeloom's "B" is a second copy of the map
    copies = []
    for path in [*(ROOT / "src" / "pipeloom").rglob("*.py"), *(ROOT / "bench").glob("*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "torch_kinds.py" or rel in EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                pairs = {(getattr(k, "value", None), getattr(v, "value", None)) for k, v in zip(node.keys, node.values)}
                if ("I", "B") in pairs:
                    copies.append(f"{rel}:{node.lineno}")
    assert not copies, f"the torch letter map is written again in {copies}; import pipeloom.core.torch_kinds"
