"""Assemble README.md from docs/readme/*.md and docs/benchmarks.md from docs/bench/*.md (sorted by name).

Run: .venv/bin/python docs/build_docs.py
"""
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent


def cat(folder: Path) -> str:
    return "\n\n".join(p.read_text().strip() for p in sorted(folder.glob("*.md"))) + "\n"


(ROOT / "README.md").write_text(cat(DOCS / "readme"))
(DOCS / "benchmarks.md").write_text(
    "# Benchmarks\n\nEvery table below was produced by the command shown above it, on the project's 2-core CPU "
    "machine unless it says otherwise. Timings are noisy there: compare ratios measured side by side in one run.\n\n"
    + cat(DOCS / "bench"))
print("wrote README.md and docs/benchmarks.md")
