"""The package's floors: imports only point down, and no files or folders import each other in a loop.

The layer list lives here. Lowest first; a module may import its own folder and any folder of a
lower layer, never one above. A sub-package may have a floor of its own (``trace/ops``: op traces and the
what-if analysis, below the run logs of ``trace/``); its files belong to it, not to their top folder. Every import counts, also those inside functions (a lazy import is
still a dependency). Read with ``ast``, nothing is imported.
"""
from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "pipeloom"

#: lowest first; names in one entry share a floor (and must still not form a cycle)
LAYERS: list[tuple[str, ...]] = [
    ("core",),        # the schedule value, the rules, costs, errors
    ("sim",),         # event simulator, replay
    ("schedule",),    # registry, validator, families, search engines, file formats, planning
    ("models",),      # what pipeloom knows of a model; the built-in torch models
    ("autograd",),    # torch autograd mechanisms below the runtime and the memory tracer (the split backward)
    ("partition",),   # layers -> chunks, cost balancing
    ("viz",),         # drawing only
    ("trace/ops",),   # op traces of any trainer and the what-if analysis on them (never the run logs above)
    ("trace",),       # run logs: format, reader, check, synthetic logs; run logs as op traces (runops)
    ("memory",),      # analytic and traced memory (never the runtime: the split backward it replays is in autograd)
    ("runtime",),     # torch.distributed executor, driver, launch
    ("integrations",),  # other frameworks' runtimes (torch.distributed.pipelining)
    ("tune",),        # parallel-configuration search (cost model, bounds, launch files)
    ("api",),         # the facade for users; nothing inside the library imports it
    ("cli", "demo"),  # the command line and the demo on top
    ("__init__", "__main__"),
]


#: sub-packages with a floor of their own (named ``folder/sub`` in LAYERS)
SUBFLOORS = {names[0] for names in LAYERS if "/" in names[0]}


def _folder(rel: Path) -> str:
    """The unit a file belongs to: its sub-floor (``trace/ops``) or top folder under pipeloom/, or its own name
    for a top-level module."""
    if len(rel.parts) > 2 and "/".join(rel.parts[:2]) in SUBFLOORS:
        return "/".join(rel.parts[:2])
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module_of(rel: Path) -> list[str]:
    parts = list(rel.with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


@functools.lru_cache(maxsize=None)
def _imports_in(text: str, pkg: tuple[str, ...], names: frozenset) -> tuple[tuple[int, tuple[tuple[str, ...], ...]], ...]:
    """(line, candidate module paths) of every pipeloom import in one file's source ``text`` (``pkg``: its package;
    ``names``: the modules that exist). Cached by the text, so the tests below that copy the package and change one
    file parse only that file again."""
    out = []
    for node in ast.walk(ast.parse(text)):
        targets: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - (node.level - 1)]) if node.level > 1 else list(pkg)
            elif node.module and node.module.split(".")[0] == "pipeloom":
                base = []
            else:
                continue
            mod = base + (node.module.split(".") if node.module else [])
            if not node.level:
                mod = mod[1:]  # drop "pipeloom"
            for a in node.names:  # "from pkg import submodule" names the submodule
                targets.append(mod + [a.name] if tuple(mod + [a.name]) in names else mod)
        elif isinstance(node, ast.Import):
            targets = [n.name.split(".")[1:] for n in node.names if n.name.split(".")[0] == "pipeloom"]
        if targets:
            out.append((node.lineno, tuple(tuple(t) for t in targets)))
    return tuple(out)


def import_edges(root: Path) -> list[tuple[Path, Path, int]]:
    """(importing file, imported file, line) for every import of a pipeloom module under ``root``."""
    files = {p.relative_to(root): p for p in root.rglob("*.py")}
    by_module = {tuple(_module_of(rel)): rel for rel in files}
    names = frozenset(by_module)
    edges = []
    for rel, path in files.items():
        pkg = _module_of(rel) if rel.name == "__init__.py" else _module_of(rel)[:-1]
        for line, targets in _imports_in(path.read_text(), tuple(pkg), names):
            for t in targets:
                t = list(t)
                while t and tuple(t) not in by_module:
                    t = t[:-1]
                dst = by_module.get(tuple(t))
                if dst is not None and dst != rel:
                    edges.append((rel, dst, line))
    return edges


def _cycles(graph: dict) -> list[list]:
    """Strongly connected components with more than one member (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(map(str, comp)))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def layer_problems(root: Path) -> list[str]:
    """Every upward import, unknown folder, file cycle and folder cycle under ``root`` (empty = clean)."""
    floor = {name: i for i, names in enumerate(LAYERS) for name in names}
    problems = []
    edges = import_edges(root)
    for src, dst, line in edges:
        a, b = _folder(src), _folder(dst)
        for unit in (a, b):
            if unit not in floor:
                problems.append(f"{unit}: a folder no layer names; add it to LAYERS in tests/test_layers.py")
        if a in floor and b in floor and floor[b] > floor[a]:
            problems.append(f"upward import: {src}:{line} imports {dst} ({a} is below {b})")
    files: dict = {}
    folders: dict = {}
    for src, dst, _ in edges:
        files.setdefault(src, set()).add(dst)
        if _folder(src) != _folder(dst):
            folders.setdefault(_folder(src), set()).add(_folder(dst))
    problems += [f"files import each other in a loop: {' <-> '.join(c)}" for c in _cycles(files)]
    problems += [f"folders import each other in a loop: {' <-> '.join(c)}" for c in _cycles(folders)]
    return sorted(set(problems))


def test_imports_point_down_and_never_loop():
    problems = layer_problems(PKG)
    assert not problems, "\n".join(problems)


def test_the_facade_is_not_used_inside_the_library():
    users = sorted({str(s) for s, d, _ in import_edges(PKG) if d == Path("api.py")} - {"__init__.py", "cli/common.py"})
    assert not users, f"library modules import the api facade: {users}"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "pipeloom"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.c"))
    return root


def test_an_upward_import_is_caught(tmp_path):
    root = _copy(tmp_path)
    ir = root / "core" / "ir.py"
    ir.write_text(ir.read_text() + "\n\ndef _late():\n    from ..sim import simulate  # upward, even inside a function\n")
    problems = layer_problems(root)
    assert any(p.startswith("upward import: core/ir.py:") and "sim/simulate.py" in p for p in problems), problems


def test_a_file_cycle_and_a_folder_cycle_are_caught(tmp_path):
    root = _copy(tmp_path)
    errors = root / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom .rules import needs\n")  # rules -> ir; ir -> errors below
    ir = root / "core" / "ir.py"
    ir.write_text(ir.read_text() + "\nfrom . import errors\n")
    viz = root / "viz" / "text.py"
    viz.write_text(viz.read_text() + "\nfrom ..trace import check\n")  # trace already imports viz
    problems = layer_problems(root)
    assert any(p.startswith("files import each other in a loop") and "core/ir.py" in p and "core/errors.py" in p
               for p in problems), problems
    assert any(p.startswith("folders import each other in a loop") and "trace" in p and "viz" in p
               for p in problems), problems


def test_a_new_unlisted_folder_is_named(tmp_path):
    root = _copy(tmp_path)
    (root / "tuner").mkdir()
    (root / "tuner" / "__init__.py").write_text("from ..sim import simulate\n")
    assert any(p.startswith("tuner: a folder no layer names") for p in layer_problems(root))


def test_the_memory_tracer_may_not_import_the_runtime(tmp_path):
    # the split backward both use lives in autograd/, below both; memory sits below runtime
    root = _copy(tmp_path)
    traced = root / "memory" / "traced.py"
    traced.write_text(traced.read_text() + "\n\ndef _late():\n    from ..runtime import executor\n")
    assert any(p.startswith("upward import: memory/traced.py:") and "runtime" in p for p in layer_problems(root))


def test_the_op_traces_may_not_read_the_run_logs(tmp_path):
    # trace/ops sits below trace/: run logs reach the what-if analysis only as op traces (trace/runops.py)
    root = _copy(tmp_path)
    whatif = root / "trace" / "ops" / "whatif.py"
    whatif.write_text(whatif.read_text() + "\n\ndef _late():\n    from ..run import RunLog\n")
    problems = layer_problems(root)
    assert any(p.startswith("upward import: trace/ops/whatif.py:") and "trace/run.py" in p for p in problems), problems


def test_every_subfloor_is_a_folder():
    assert SUBFLOORS == {"trace/ops"}
    for sub in SUBFLOORS:
        assert (PKG / sub / "__init__.py").is_file(), sub
