"""docs/torch.md quotes the examples: every Python block there that names no import of its own is a verbatim run of
lines of one of examples/*.py (so the page shows code that the test suite runs)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_torch_md_quotes_the_examples_verbatim():
    page = (ROOT / "docs" / "torch.md").read_text()
    sources = {p.name: p.read_text() for p in (ROOT / "examples").glob("*.py")}
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.M | re.S)
    quoted = [b for b in blocks if "build_stages_from_csv(" in b or "pipeline_llm(" in b or "def make_chunk" in b]
    assert len(quoted) >= 3
    for b in quoted:
        assert any(b in src for src in sources.values()), b[:200]
    assert "build_torch_schedule(schedule, stages, loss_fn)   #" not in page  # the old snippet with `stages` undefined
    assert "```toml" not in page and "```toml" not in (ROOT / "README.md").read_text()
