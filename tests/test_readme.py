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
    assert "make toy CONFIG=config/test.yaml" in first_screen and "about 20 min" in first_screen


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
