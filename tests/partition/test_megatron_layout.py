"""Megatron-Core --pipeline-model-parallel-layout strings: read, write, round trip, errors."""
from __future__ import annotations

import json
import subprocess
import sys
import os

import pytest

from pipeloom.partition import from_counts, uniform
from pipeloom.partition.megatron import (LayoutError, counts_to_layout, format_layout, layout_counts,
                                         layout_to_partition, parse_layout, partition_to_layout)
from pipeloom.core.ir import Placement

#: layout strings as published: Megatron-Core's docs (custom pipeline layout page and the parser's docstring
#: example), and training scripts / recipes that pass --pipeline-model-parallel-layout
PUBLISHED = [
    "Et*3|(tt|)*29,m|L",                       # Megatron-Core docs: DeepSeek-V3, PP16 VPP2
    "Ettt|(tt|)*29,m|L",                       # Megatron-Core's parse_str_to_list docstring
    "Et*3|(tt|)*29m|L",
    "Et|(tt|)*30L",
    "Et|t|t|tL",
    "Et*4|(t*4|)*6t*3mL",
    "Et*10|t*12|t*8|t*8|t*12|t*12|t*12|t*4L",
    "Et*4|t*4|t*4|t*4L",
    "Ett|tt|ttt|tmL",                           # Megatron docs: 8 layers + 1 MTP on PP2 VPP2
    "Et*11|t*11|t*11|t*10mL",
    "Et*10|t*10|t*11L",
    "Et*11|t*12|t*12|t*8mL",
    "Ettt|tttt|ttttt|tttttt|tttttt|ttttttt|ttttttt|tttttL",
    "Et*4|t*3|t*3|t*4|t*3|t*4|t*4|t*3,L",
]


@pytest.mark.parametrize("text", PUBLISHED)
def test_published_layouts_round_trip(text):
    stages = parse_layout(text)
    out = format_layout(stages)
    assert parse_layout(out) == stages
    assert format_layout(parse_layout(out)) == out  # the written form is a fixed point


def test_docs_example_expands_as_megatron_documents():
    # Megatron-Core docs: PP16 VPP2 of DeepSeek-V3 = 32 stages: E+3t, then 29 stages of 2 t, then m, then L
    st = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(st) == 32
    assert st[0] == ["E", "t", "t", "t"]
    assert all(s == ["t", "t"] for s in st[1:30])
    assert st[30] == ["m"] and st[31] == ["L"]
    assert sum(s.count("t") for s in st) == 61
    assert format_layout(st) == "Et*3|(tt|)*29,m|L"
    vpp, counts = layout_counts(st, 16)
    assert vpp == 2 and counts[0] == 3 and counts[30:] == [0, 0]


def test_groups_commas_spaces_and_empty_stages():
    assert parse_layout("(|)*2,EtL") == [[], [], ["E", "t", "L"]]
    assert parse_layout("E t*2 | t,t L") == [["E", "t", "t"], ["t", "t", "L"]]
    assert parse_layout("E|((t|)*2)*2,L") == [["E"], ["t"], ["t"], ["t"], ["t"], ["L"]]  # nesting: our extension
    assert parse_layout("Et*0|tL") == [["E"], ["t", "L"]]
    assert parse_layout("E|||L") == [["E"], [], [], ["L"]]
    assert format_layout([["E"], [], [], ["L"]]) == "E|(|)*2,L"


@pytest.mark.parametrize("bad, pos", [
    ("Et*|L", 3), ("Ett)L", 3), ("Etx|L", 2), ("E*t", 2), ("()*2", 0), ("Et|(tt|)L", 8), ("Et(t|L", 2),
    ("*3E", 0), ("Et|(t|)*L", 8),
])
def test_malformed_one_line_error_with_position(bad, pos):
    with pytest.raises(LayoutError) as e:
        parse_layout(bad)
    msg = str(e.value)
    assert "\n" not in msg and f"position {pos}" in msg


def test_semantic_checks():
    with pytest.raises(LayoutError, match="multiple of pp=4"):
        layout_counts(parse_layout("Et|t|tL"), 4)
    with pytest.raises(LayoutError, match="embedding"):
        layout_counts(parse_layout("tE|tL"), 2)
    with pytest.raises(LayoutError, match="loss"):
        layout_counts(parse_layout("Et|Lt"), 2)
    with pytest.raises(LayoutError, match="before MTP"):
        layout_counts(parse_layout("Etm|tL"), 2)
    with pytest.raises(LayoutError, match="no decoder layer"):
        layout_to_partition("Et|(tt|)*2,|L", 5)
    with pytest.raises(LayoutError, match="MTP"):
        layout_to_partition("Et|tmL", 2)


def test_partition_both_ways():
    # 8 layers, pp2 vpp2, counts per global chunk (chunk k = Megatron entry k) written by hand
    part = layout_to_partition("Ett|tt|ttt|tL", 2)
    assert part.vpp == 2 and part.seg_layer_num == [2, 2, 3, 1]
    assert part.chunks_of(0) == [0, 2]  # rank 0 holds entries 0 and 2 (virtual stages 0 and 1)
    assert partition_to_layout(part) == "Ett|tt|t*3|tL"
    assert layout_to_partition(partition_to_layout(uniform(30, 4, 2)), 4).seg_layer_num == uniform(30, 4, 2).seg_layer_num
    assert counts_to_layout([3, 3, 3, 3]) == "Et*3|(t*3|)*2,t*3L"
    with pytest.raises(LayoutError, match="interleaved"):
        partition_to_layout(from_counts([2, 2, 2, 2], 2, 2, Placement.V))


def _cli(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "pipeloom", *args], capture_output=True, text=True, env=env)


def test_partition_cli_reads_and_writes_layouts():
    r = _cli("partition", "--pp", "2", "--megatron-layout", "Ett|tt|ttt|tL", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["seg_layer_num"] == [2, 2, 3, 1] and out["vpp"] == 2
    assert out["megatron_layout"] == "Ett|tt|t*3|tL"
    r = _cli("partition", "--pp", "4", "--layers", "10", "--json")
    assert json.loads(r.stdout)["megatron_layout"] == "Et*3|t*3|tt|ttL"
    r = _cli("partition", "--pp", "2", "--megatron-layout", "Et(t|L")
    assert r.returncode == 2 and r.stderr.startswith("pipeloom: error:") and "position 2" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
