"""Every file pipeloom writes goes through pipeloom.core.files.atomic_write: no module opens a file for writing
itself (read with ``ast``: open/os.fdopen with a write mode, Path.write_text/write_bytes, savefig to a path,
pyarrow's write_csv/write_table)."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "pipeloom"

#: writes that do not go through atomic_write yet, each with its reason; remove an entry when it is fixed
EXEMPT = {
    "core/files.py": "atomic_write itself",
    "runtime/launch.py": "a private mkstemp file handed to a child process, not an output",
    "trace/writer.py": "the streamed job log, line by line while a run goes (a .partial file renamed when closed)",
}


def _mode(call: ast.Call, pos: int) -> str | None:
    if len(call.args) > pos and isinstance(call.args[pos], ast.Constant):
        return call.args[pos].value
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def direct_writes(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            mode = None
            if name in ("open", "fdopen"):
                mode = _mode(node, 1)
            what = None
            if mode and any(c in mode for c in "wax+"):
                what = f"{name}(.., {mode!r})"
            elif name in ("write_text", "write_bytes") and isinstance(f, ast.Attribute) and len(node.args) == 1:
                what = name
            elif name == "savefig" and node.args and not (isinstance(node.args[0], ast.Name)
                                                          and node.args[0].id in ("fh", "f", "buf")):
                what = "savefig(path)"
            elif name in ("write_csv", "write_table") and not (len(node.args) > 1 and isinstance(node.args[1], ast.Name)
                                                               and node.args[1].id in ("fh", "f", "buf")):
                what = name  # pyarrow writing to a path itself (to an atomic_write handle is fine)
            if what:
                found.append((rel, node.lineno, what))
    return [f"{rel}:{line}: {what}" for rel, line, what in sorted(found)]


def test_every_write_goes_through_atomic_write():
    left = [w for w in direct_writes(PKG) if w.split(":")[0] not in EXEMPT]
    assert not left, "files written without core.files.atomic_write:\n" + "\n".join(left)


def test_no_stale_exemption():
    writers = {w.split(":")[0] for w in direct_writes(PKG)}
    assert set(EXEMPT) - {"core/files.py"} <= writers, "an exempt file writes through atomic_write now: drop it"


def test_the_scan_sees_a_direct_write(tmp_path):
    (tmp_path / "m.py").write_text("import json\n\ndef save(p, d):\n    with open(p, 'w') as fh:\n"
                                   "        json.dump(d, fh)\n\ndef draw(fig, p):\n    fig.savefig(p)\n")
    assert direct_writes(tmp_path) == ["m.py:4: open(.., 'w')", "m.py:8: savefig(path)"]


def test_the_scan_tells_pyarrow_to_a_path_from_pyarrow_to_a_handle(tmp_path):
    (tmp_path / "m.py").write_text("import pyarrow.parquet as pq\n\ndef save(t, p):\n    pq.write_table(t, p)\n\n"
                                   "def save2(t, p):\n    with atomic_write(p, 'wb') as fh:\n        pq.write_table(t, fh)\n")
    assert direct_writes(tmp_path) == ["m.py:4: write_table"]
