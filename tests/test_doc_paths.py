"""Every repository file that the README, docs, configs, scripts and code comments point a reader to exists.

A path such as `configs/recipes/grpo.yaml` or `tests/core/test_mapo.py` in prose is a promise that the file is
there; a renamed file must take its mentions along. Placeholders (`configs/X.yaml`, `configs/my_run.yaml`,
`docs/figures/FIGURE.json`) (`X`, `NAME`, `FIGURE`, `my_...`) are not checked."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH = re.compile(
    r"(?<![\w/.-])((?:configs|scripts|docs|tests|rlvr_lightning)/[\w./-]*?\.(?:yaml|py|sh|md|png|jsonl|json))(?![\w])"
)
PLACEHOLDER = re.compile(r"(?:^|/)(?:X|NAME|FIGURE|my_\w+)\.\w+$")  # the names the docs use for "yours"


def mentioned_paths() -> dict[str, list[str]]:
    """Each repository path named in README.md, docs/, configs/, scripts/, the package and the tests, and where."""
    files = [REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("configs/**/*.yaml"), *REPO.glob("scripts/*")]
    files += [*REPO.glob("rlvr_lightning/**/*.py"), *REPO.glob("tests/**/*.py")]
    found: dict[str, list[str]] = {}
    for path in files:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in PATH.finditer(line):
                if not PLACEHOLDER.search(match.group(1)) and "*" not in match.group(1):
                    found.setdefault(match.group(1), []).append(f"{path.relative_to(REPO)}:{number}")
    return found


def test_the_placeholder_rule_spares_only_placeholders():
    assert PLACEHOLDER.search("configs/X.yaml") and PLACEHOLDER.search("docs/figures/FIGURE.json")
    assert PLACEHOLDER.search("configs/my_run.yaml")
    assert not PLACEHOLDER.search("configs/recipes/grpo.yaml") and not PLACEHOLDER.search("docs/ARCHITECTURE.md")


def test_every_mentioned_repository_file_exists():
    found = mentioned_paths()
    assert len(found) >= 100, len(found)  # the pattern still finds the docs' paths
    missing = {path: where[:3] for path, where in found.items() if not (REPO / path).exists()}
    assert not missing, missing


def test_every_snippet_include_is_well_formed_and_names_an_example():
    """The docs' `--8<-- "file"` lines (pymdownx.snippets, base path docs/examples) include files that exist; a
    formatter that rewrites one inside a Python block (`--8 < --"file"`) would leave the page without its code."""
    includes, mangled = [], []
    for path in REPO.glob("docs/**/*.md"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"--8<-- \"[^\"]+\"$", line):
                includes.append((f"{path.relative_to(REPO)}:{number}", line.split('"')[1]))
            elif re.match(r"-+\s*8\s*<", line):
                mangled.append(f"{path.relative_to(REPO)}:{number}: {line}")
    assert not mangled, mangled
    assert len(includes) >= 12, includes
    assert [where for where, name in includes if not (REPO / "docs" / "examples" / name).is_file()] == []
