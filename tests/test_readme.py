"""The README as a reader meets it (issue 37): every file and folder of the repository it names
exists, every line fits 200 characters, and the paper is cited in CITATION.cff as in the README.
The code map (docs/code-map.md, issue 48) the same way, and it names every module of bfspo/."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CODE_MAP = ROOT / "docs/code-map.md"
# Where a path that the README names must be in the repository; generated paths (results/runs/...,
# logs/, .snakemake/) are outputs, not repository files.
TRACKED = ("bfspo/", "docs/", "config/", "workflow/", "bench/", "tests/", "data/", "slurm/", "requirements/",
           "results/recorded", "Makefile", "Snakefile", "environment.yml", "pyproject.toml", "CITATION.cff")


def named_paths(text: str, folder: str = "") -> set[str]:
    """Markdown link targets in the repository (relative to the document's `folder`, as a link is read),
    and `code` spans that are paths under TRACKED (from the repository root), as repository paths."""
    links = {os.path.normpath(os.path.join(folder, t.split("#")[0])) for t in re.findall(r"\]\(([^)\s]+)\)", text)
             if not re.match(r"[a-z]+:|#", t)}
    spans = {s for s in re.findall(r"`([^`\s]+)`", text) if s.startswith(TRACKED) and not re.search(r"[<>*{]", s)}
    return {p.rstrip("/.,:") for p in links | spans if p}


def missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not (ROOT / p).exists())


def test_the_readme_names_only_files_the_repository_has():
    paths = named_paths(README)
    assert {"docs/running.md", "config/README.md", "CITATION.cff", "docs/code-map.md"} <= paths
    assert not missing(paths), missing(paths)
    assert ".tex" not in README.replace("`.tex`", "")  # the paper is cited, not named as a file


def test_the_code_map_names_every_module_and_only_files_the_repository_has():
    paths = named_paths(CODE_MAP.read_text(encoding="utf-8"), "docs")
    assert not missing(paths), missing(paths)
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bfspo").rglob("*.py") if p.name != "__init__.py"}
    assert modules - paths == set(), f"docs/code-map.md does not name {sorted(modules - paths)}"


def test_named_paths_reads_links_from_the_documents_folder():
    paths = named_paths("[a](../README.md#x), [b](gpu-plan.md), `bfspo/cli.py`, `bfspo/nothing.py`", "docs")
    assert paths == {"README.md", "docs/gpu-plan.md", "bfspo/cli.py", "bfspo/nothing.py"}
    assert missing(paths) == ["bfspo/nothing.py"]


def test_the_readme_lines_fit_and_its_first_screen_has_the_fast_path():
    assert max(len(line) for line in README.splitlines()) <= 200
    assert len(README.splitlines()) <= 160  # a screen or two (issue 48): the module lists are in docs/code-map.md
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make toy CONFIG=config/test.yaml" in first_screen and "about 15 min" in first_screen


def test_the_citation_names_the_paper_as_the_readme_does():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    paper = cff["preferred-citation"]
    assert paper["title"] == "BFS-PO: Best-First Search for Large Reasoning Models" and paper["year"] == 2026
    names = [f"{a['given-names']} {a['family-names']}" for a in paper["authors"]]
    assert names == ["Fiorenzo Parascandolo", "Wenhui Tan", "Enver Sangineto", "Ruihua Song", "Rita Cucchiara"]
    assert "arxiv.org/abs/2602.14917" in paper["url"] and "arXiv:2602.14917" in README
    for name in names:
        assert name.split()[-1] in README


RESULTS = ROOT / "bench/RESULTS.md"


def anchors(text: str) -> set[str]:
    """A Markdown file's link targets: its `<a id>`s and its headings as GitHub names them."""
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    return ids | headings


def test_anchors_are_html_ids_and_github_heading_names():
    assert anchors('<a id="fig-x"></a>\n## The GPU check: `bench/gpu/gpu_session.sh OUT`\n') == {
        "fig-x", "the-gpu-check-benchgpugpu_sessionsh-out"}


def test_every_link_into_results_finds_its_row_or_section():
    """Issue 48: the docs cite a row of RESULTS.md's current figures (or a section), by anchor."""
    text = RESULTS.read_text(encoding="utf-8")
    targets = anchors(text)
    inside = re.findall(r"\]\(#([^)\s]+)\)", text)
    assert inside and set(inside) - targets == set()
    docs = [ROOT / "README.md", ROOT / "config/README.md", ROOT / "bench/gpu/README.md", *(ROOT / "docs").glob("*.md")]
    cited = {f"{doc.relative_to(ROOT)}#{a}" for doc in docs
             for a in re.findall(r"RESULTS\.md#([^)\s]+)\)", doc.read_text(encoding="utf-8"))}
    assert len(cited) >= 10
    assert sorted(c for c in cited if c.split("#")[1] not in targets) == []
    links = {os.path.normpath(os.path.join("bench", t.split("#")[0])) for t in re.findall(r"\]\(([^)#\s]+)", text)}
    assert missing(links) == []  # its sections' `code` spans are history: files and configs of their day
    outward = re.findall(r"\]\(([^)#\s]+\.md)#([^)\s]+)\)", text)
    assert outward and [(f, a) for f, a in outward
                        if a not in anchors((RESULTS.parent / f).read_text(encoding="utf-8"))] == []


def test_the_current_figures_name_every_benchmark():
    """Every script under bench/ has a row in the current figures, measured or "not yet recorded"."""
    text = RESULTS.read_text(encoding="utf-8")
    table = text[text.index("## Current figures"):].split("\n\n<a id=")[0]
    scripts = [p for p in (ROOT / "bench").glob("*") if p.suffix in (".py", ".sh") and p.stem not in ("__init__", "common")]
    scripts.append(ROOT / "bench/gpu/gpu_check.py")
    assert len(scripts) > 15
    unnamed = [p.name for p in scripts if p.stem not in re.findall(r"bench[./](?:gpu/)?(\w+)", table)]
    assert unnamed == []
