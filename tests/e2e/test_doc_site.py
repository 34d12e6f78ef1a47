"""The documentation site's link checking: a dead link, a missing anchor or a broken image fails
`make docs`, and the repository files the pages link to (docs/hooks/repo_files.py) are served.

The failing cases build a two-page site in a scratch directory with mkdocs.yml's own validation
settings and hook (a second or so each); the real site is built once, by the slow test and by CI's
`make docs`."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

mkdocs_build = pytest.importorskip("mkdocs.commands.build")
from mkdocs.config import load_config  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOOD = "# Home\n\nSee [the results](../results/r.md) and ![a plot](../results/p.png).\n"


def scratch_site(tmp_path: Path, index: str) -> Path:
    """A repository in ``tmp_path``: mkdocs.yml (the real one, with the real hook and a two-page
    nav), docs/index.md = ``index``, docs/other.md, and results/r.md + results/p.png outside
    docs/. Returns the config file."""
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    cfg["hooks"] = [str(ROOT / hook) for hook in cfg["hooks"]]
    cfg["nav"] = ["index.md", "other.md"]
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text(index)
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.md").write_text("# R\n\nBack [home](../docs/other.md#a-section).\n")
    (tmp_path / "results" / "p.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def build(config_file: Path) -> Path:
    site = config_file.parent / "site"
    mkdocs_build.build(load_config(str(config_file), site_dir=str(site)))
    return site


def test_links_outside_docs_are_served_and_rewritten(tmp_path):
    site = build(scratch_site(tmp_path, GOOD))
    home = (site / "index.html").read_text()
    assert 'href="results/r/"' in home and 'src="results/p.png"' in home
    assert (site / "results" / "p.png").read_bytes() == b"\x89PNG\r\n\x1a\n"
    # the added page's own link back into docs/ follows the site's layout too
    assert 'href="../../other/#a-section"' in (site / "results" / "r" / "index.html").read_text()


@pytest.mark.parametrize(
    "line,warning",
    [
        ("[dead](missing.md)", "'missing.md', but the target is not found"),
        ("[dead](../results/missing.md)", "'../results/missing.md', but the target is not found"),
        ("![broken](../results/missing.png)", "'../results/missing.png', but the target is not"),
        ("[anchor](other.md#no-such-section)", "does not contain an anchor '#no-such-section'"),
        ("[anchor](../results/r.md#nowhere)", "does not contain an anchor '#nowhere'"),
        ("[anchor](#nowhere)", "there is no such anchor on this page"),
        ("[absolute](/other/)", "contains an absolute link '/other/'"),
    ],
)
def test_a_dead_link_fails_the_strict_build(tmp_path, caplog, line, warning):
    config_file = scratch_site(tmp_path, f"{GOOD}\n{line}\n")
    with pytest.raises(Abort, match="in strict mode"):
        build(config_file)
    assert warning in caplog.text


def test_make_docs_fails_on_a_dead_link(tmp_path):
    """The command of `make docs` itself, run on a site with a dead link: mkdocs' --quiet hides
    warnings from the strict check too, so a recipe with it would pass any dead link."""
    recipe = re.search(r"^docs:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe, "Makefile: no docs target"
    argv = shlex.split(recipe.group(1))
    env = dict(arg.split("=", 1) for arg in argv if re.match(r"^[A-Z0-9_]+=", arg))
    argv = [arg for arg in argv if not re.match(r"^[A-Z0-9_]+=", arg)]
    assert argv[0].endswith("mkdocs") and argv[1] == "build", argv
    config_file = scratch_site(tmp_path, f"{GOOD}\n[dead](missing.md)\n")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", *argv[1:], "-f", str(config_file)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert r.returncode != 0, "make docs passed a dead link"
    assert "'missing.md', but the target is not found" in r.stderr, r.stderr
    assert "Aborted with 1 warnings in strict mode" in r.stdout + r.stderr


@pytest.mark.slow
def test_every_link_and_image_of_the_site_resolves(tmp_path):
    """The real site builds strictly, and every relative href/src of its pages names a file of
    the built site (404.html links from the site root, which a scratch directory is not)."""
    site = tmp_path / "site"
    mkdocs_build.build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site)))
    dead = []
    for page in site.rglob("*.html"):
        if page.name == "404.html" or page.name == "report.html":
            continue
        for url in re.findall(r'(?:href|src)="([^"#?]+)', page.read_text(errors="replace")):
            if re.match(r"^[a-z]+:|/", url):
                continue
            target = page.parent / url
            if not (target / "index.html" if target.is_dir() else target).is_file():
                dead.append(f"{page.relative_to(site)}: {url}")
    assert not dead, dead
    for path in ("results/benchmarks/index.html", "results/ui/optuna_dashboard_study.png"):
        assert (site / path).is_file(), path
