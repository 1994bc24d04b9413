"""The README stays short and complete, and the docs site's sources stay in step with the code.

The site itself is built by ``make docs`` with ``mkdocs build --strict`` (``make test`` runs it first): that
build fails on a broken link or anchor, a missing picture or an API page naming a module that is gone.
These tests cover what the build cannot see: the README (GitHub shows it without any build), its committed
picture, and that every package and every floor of the layer list has its place in the docs.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PKG = ROOT / "src" / "pipeloom"
README_LIMIT = 15_000  # bytes


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cli_commands(help_text: str) -> list[str]:
    """The command names listed under COMMAND by ``pipeloom --help`` (argparse's sub-command list)."""
    names, inside = [], False
    for line in help_text.splitlines():
        if line.strip() == "COMMAND":
            inside = True
            continue
        if inside:
            if line and not line.startswith(" "):
                break  # the next section ("options:")
            m = re.match(r"^ {4}([a-z][\w-]*)(\s|$)", line)
            if m:
                names.append(m.group(1))
    return names


def examples_in(markdown: str) -> set[str]:
    """Commands shown as ``$ pipeloom CMD ...`` inside fenced code blocks."""
    found = set()
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.M | re.S):
        found.update(re.findall(r"^\$ pipeloom ([a-z][\w-]*)", block, flags=re.M))
    return found


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; keep it at most {README_LIMIT} (move detail to docs/)"


def test_every_command_has_an_example_in_the_readme():
    out = subprocess.run([sys.executable, "-m", "pipeloom", "--help"], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    commands = cli_commands(out)
    assert len(commands) >= 9, f"could not read the command list from pipeloom --help:\n{out}"
    missing = [c for c in commands if c not in examples_in(README.read_text())]
    assert not missing, f"README.md has no '$ pipeloom CMD' example for: {', '.join(missing)}"


def test_the_parsers_see_a_missing_example():
    help_text = "usage: x\n\npositional arguments:\n  COMMAND\n    simulate  plan it\n    partition\n" \
                "              map layers\n\noptions:\n  -h, --help  show\n"
    assert cli_commands(help_text) == ["simulate", "partition"]
    md = "text $ pipeloom plan outside\n```\n$ pipeloom simulate -s zbv\n```\n"
    assert examples_in(md) == {"simulate"}


def test_readme_links_and_picture_exist():
    text = README.read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert any(t.endswith(".png") for t in targets), "README.md shows no picture"
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_picture_is_what_the_script_draws(tmp_path):
    """The committed picture is redrawn from the current code; a change in planning or drawing shows here."""
    mpimg = pytest.importorskip("matplotlib.image")
    gen = _load(DOCS / "gen_pictures.py", "gen_pictures")
    fresh = gen.readme_picture(tmp_path / "readme.png")
    a, b = mpimg.imread(gen.README_PNG), mpimg.imread(fresh)
    assert a.shape == b.shape and (a == b).all(), (
        f"{gen.README_PNG.relative_to(ROOT)} is stale: run 'python docs/gen_pictures.py --readme' and commit it")
    # the caption's numbers are the two plans' makespans
    spans = [gen._plan(name, gen.PP, gen.M, vpp, "1p", {})[2].makespan for name, vpp in (("1f1b", 1), ("zbv", 2))]
    caption = f"from {spans[0]:g} to {spans[1]:g} cost units"
    for page in (README, DOCS / "index.md"):
        assert caption in " ".join(page.read_text().split()), f"{page.name}: the picture's caption should say '{caption}'"


def _nav_pages() -> set[str]:
    return set(re.findall(r"([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M))


def test_every_package_has_an_api_page_in_the_nav():
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists()) + ["api"]
    nav = _nav_pages()
    problems = []
    for name in packages:
        page = DOCS / "api" / f"{name}.md"
        if not page.exists() or f"::: pipeloom.{name}" not in page.read_text():
            problems.append(f"docs/api/{name}.md with '::: pipeloom.{name}'")
        if f"api/{name}.md" not in nav:
            problems.append(f"api/{name}.md in mkdocs.yml's nav")
    assert not problems, "missing: " + "; ".join(problems)


def test_every_page_is_in_the_nav():
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "gen" not in p.relative_to(DOCS).parts}
    missing = sorted(pages - _nav_pages())
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_layer_diagram_lists_the_floors_of_the_layer_test():
    gen = _load(DOCS / "gen_pictures.py", "gen_pictures")
    layers = _load(ROOT / "tests" / "test_layers.py", "layers_under_test")
    floors = [names[0] for names in layers.LAYERS if names[0] != "__init__"]
    drawn = [name for name, _, _ in gen.LAYERS]
    assert drawn == floors, f"docs/gen_pictures.py LAYERS {drawn} != tests/test_layers.py LAYERS {floors}"
