"""bench/_harness.py: the alternation, statistics and table writing every timing bench uses."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import _harness as h  # noqa: E402


def test_round_orders_given_mirrored_and_shuffled():
    assert list(h.round_orders("AB", 3)) == [["A", "B"], ["A", "B"], ["A", "B"]]
    assert list(h.round_orders("AB", 4, mirror=True)) == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    shuffled = list(h.round_orders("ABC", 50, shuffle=True, seed=3))
    assert all(sorted(o) == ["A", "B", "C"] for o in shuffled)
    assert len({tuple(o) for o in shuffled}) == 6              # every order turns up in 50 rounds
    assert shuffled == list(h.round_orders("ABC", 50, shuffle=True, seed=3))  # every rank draws the same
    with pytest.raises(ValueError):
        list(h.round_orders("AB", 2, shuffle=True, mirror=True))


def test_alternate_times_each_entry_once_per_round_in_round_order():
    now = [0.0]
    calls = []

    def entry(name, secs):
        def run():
            calls.append(name)
            now[0] += secs
        return run

    t = h.alternate({"a": entry("a", 2.0), "b": entry("b", 0.5)}, 3, mirror=True, warmup=1, clock=lambda: now[0])
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up round, then a b / b a / a b
    assert t == {"a": [2.0, 2.0, 2.0], "b": [0.5, 0.5, 0.5]}


def test_statistics():
    assert h.median([3, 1, 2, 10]) == 2.5
    assert h.quartiles([1, 2, 3, 4, 5, 6, 7]) == (2.0, 4.0, 6.0)
    assert h.quartiles([5]) == (5.0, 5.0, 5.0)
    assert h.paired_ratios([2, 3], [1, 6]) == [2.0, 0.5]
    with pytest.raises(ValueError):
        h.paired_ratios([1], [1, 2])
    # within-round ratios cancel a drift that the ratio of medians keeps
    s = h.ratio_summary([1.1, 2.2, 3.3], [1.0, 2.0, 3.0])
    assert s["median"] == pytest.approx(1.1) and s["of_medians"] == pytest.approx(1.1)
    s = h.ratio_summary([1.0, 10.0, 1.0], [2.0, 20.0, 2.0])
    assert (s["median"], s["of_medians"]) == (0.5, 0.5)


def test_tables_are_written_whole_and_json_is_strict(tmp_path):
    out = tmp_path / "sub" / "table.json"
    h.write_json(out, {"b": 1, "a": [1.5]}, sort_keys=True)
    assert out.read_text() == '{\n "a": [\n  1.5\n ],\n "b": 1\n}\n'
    with pytest.raises(ValueError):
        h.write_json(out, {"x": math.nan})
    assert json.loads(out.read_text()) == {"a": [1.5], "b": 1}  # the earlier file is untouched
    assert [p.name for p in out.parent.iterdir()] == ["table.json"]  # and no temporary is left


def test_write_section_replaces_only_its_own_section(tmp_path):
    page = tmp_path / "page.md"
    h.write_section(page, "## Speed", "## Speed\n\nfirst\n")
    assert page.read_text() == "## Speed\n\nfirst\n"
    page.write_text("# Title\n\nkept\n\n## Speed\n\nold\n")
    h.write_section(page, "## Speed", "## Speed\n\nnew\n")
    assert page.read_text() == "# Title\n\nkept\n\n## Speed\n\nnew\n"


def test_write_section_before_a_heading_sits_mid_page_and_replaces_only_itself(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nintro\n\n## Table\n\n| a |\n")
    h.write_section(page, "## Depth", "## Depth\n\nfirst\n", before="## Table")
    assert page.read_text() == "# Title\n\nintro\n\n## Depth\n\nfirst\n\n## Table\n\n| a |\n"
    h.write_section(page, "## Depth", "## Depth\n\nsecond\n", before="## Table")  # to the next heading only
    assert page.read_text() == "# Title\n\nintro\n\n## Depth\n\nsecond\n\n## Table\n\n| a |\n"
