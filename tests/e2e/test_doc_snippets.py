"""Every code block in the README and docs/ is checked, so that no page drifts from the code.

- ``python`` blocks compile, and run as written in a scratch directory unless listed in
  ``PYTHON_NOT_RUN`` with the reason (they need a finished study, a model, ...).
- ``bash`` blocks: every ``harness ...`` line parses against the real CLI (subcommand, options,
  arguments) without running it; every ``--set key=value`` names a real field; ``harness ablate
  FILE`` on a shipped experiment file runs with ``--dry-run``; ``make X`` names a Makefile target;
  ``python -m MODULE`` names an importable module.
- ``yaml`` blocks parse; an experiment file (``name:`` first) loads as one; a run config's keys are
  run-config fields. ``jsonl`` blocks are one JSON object per line.
- every relative link resolves to a file in the repository.

The training examples themselves run in tests/e2e/test_misuse.py and tests/tasks/test_local_data.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import pytest
import typer
import yaml
from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A python block whose first line is a key here compiles but does not run, for the reason given.
PYTHON_NOT_RUN = {
    "from harness.report import ranking, render_ranking_table, build_report": (
        "needs the StudyData of a finished study"
    ),
}


def blocks(lang: str) -> list[tuple[str, str]]:
    """``(page:line, body)`` of every fenced block tagged ``lang`` in the README and docs/."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```(\S*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
            if m.group(1) == lang:
                line = text[: m.start()].count("\n") + 1
                out.append((f"{page.relative_to(ROOT)}:{line}", m.group(2)))
    return out


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments and `export` lines
    dropped, a trailing `&` removed; each as argv (environment assignments in front dropped)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line.rstrip("&").strip())
        while argv and re.match(r"^[A-Z_]+=", argv[0]):
            argv = argv[1:]
        if argv and argv[0] != "export":
            out.append(argv)
    return out


def test_the_pages_have_blocks_of_every_kind():
    assert len(blocks("python")) >= 4 and len(blocks("bash")) >= 5 and len(blocks("yaml")) >= 4
    assert blocks("jsonl")


@pytest.mark.parametrize("where,body", blocks("python"), ids=[w for w, _ in blocks("python")])
def test_python_blocks_compile_and_run(where, body, tmp_path, monkeypatch, capsys):
    code = compile(body, where, "exec")
    first = body.splitlines()[0]
    if first in PYTHON_NOT_RUN:
        return
    if "from datasets import" in body:
        pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    exec(code, {"__name__": "__doc_snippet__"})


def _click_command(argv: list[str]) -> tuple[click.Command, list[str]]:
    group = typer.main.get_command(app)  # a click.Group subclass
    name, rest = argv[0], argv[1:]
    cmd = group.get_command(click.Context(group), name)  # type: ignore[attr-defined]
    assert cmd is not None, f"no command 'harness {name}'"
    return cmd, rest


def _check_set_keys(argv: list[str], where: str) -> None:
    from harness.cli.commands.fields import field_rows

    known = {row[0] for row in field_rows()}
    for i, arg in enumerate(argv):
        if arg == "--set":
            key = argv[i + 1].split("=", 1)[0]
            ok = key in known or any(k.startswith(key + ".") for k in known)
            ok = ok or key.startswith("task_options.")  # rg: generator fields pass through
            assert ok, f"{where}: --set {key} is not a run-config field"


@pytest.mark.parametrize("where,body", blocks("bash"), ids=[w for w, _ in blocks("bash")])
def test_shell_commands_are_real(where, body, tmp_path):
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for argv in shell_commands(body):
        if argv[0] == "make":
            assert set(argv[1:]) <= targets, f"{where}: {argv} names no Makefile target"
        elif argv[0] == "harness":
            cmd, rest = _click_command(argv[1:])
            # parses the arguments exactly as the CLI would, without running the command
            cmd.make_context(f"harness {argv[1]}", list(rest), resilient_parsing=False)
            _check_set_keys(rest, where)
            shipped = [a for a in rest if a.startswith("experiments/")]
            if argv[1] == "ablate" and shipped and "--launcher" not in rest:
                r = CliRunner().invoke(
                    app,
                    ["ablate", str(ROOT / shipped[0]), "--dry-run"]
                    + ["--results-dir", str(tmp_path)],
                )
                assert r.exit_code == 0, (where, argv, r.output)
                assert list(tmp_path.iterdir()) == [], "a dry run wrote files"
        elif argv[:2] == ["python", "-m"] and argv[2].startswith("harness"):
            import importlib.util

            assert importlib.util.find_spec(argv[2]), f"{where}: no module {argv[2]}"


@pytest.mark.parametrize("where,body", blocks("yaml"), ids=[w for w, _ in blocks("yaml")])
def test_yaml_blocks_load(where, body, tmp_path):
    data = yaml.safe_load(body)
    assert isinstance(data, dict), where
    if "name" in data:
        from harness.config.experiment import load_experiment

        path = tmp_path / "experiment.yaml"
        path.write_text(body)
        spec = load_experiment(path)
        assert spec.cells, where
    elif not set(data) <= {"seeds", "limits"}:  # experiment-file blocks shown on their own
        from harness.config import RunConfig
        from harness.core.fields import field_help

        tops = {path.split(".")[0] for path in field_help(RunConfig)}
        assert set(data) <= tops, f"{where}: {set(data) - tops} are not run-config fields"


@pytest.mark.parametrize("where,body", blocks("jsonl"), ids=[w for w, _ in blocks("jsonl")])
def test_jsonl_blocks_are_json_lines(where, body):
    rows = [json.loads(line) for line in body.splitlines() if line.strip()]
    assert all({"prompt", "answer"} <= set(row) for row in rows), where


def test_relative_links_resolve():
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 14 * 1024
    assert "make test" in readme and "make ablate" in readme
    # every docs page is reachable from the README and from the site's navigation
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"({page.relative_to(ROOT)}" in readme or page.name == "index.md", page.name
        assert f": {page.name}" in nav, f"mkdocs.yml: {page.name} is not in the nav"


def test_generated_pages_are_current():
    from harness.cli.commands.fields import fields_markdown

    assert (ROOT / "docs" / "fields.md").read_text() == fields_markdown(), (
        "regenerate with harness fields --markdown > docs/fields.md"
    )


def test_make_ablate_output_is_ignored_by_git():
    """`make ablate` writes results/default/: git ignores it, so a fresh run leaves the checkout
    clean; the committed copy of the demo's report is docs/demo/."""
    import subprocess

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("results/default/report.md", "results/default/plots/reward.png", "site/x.html"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert r.returncode == 0, f"{path} is not ignored"
    assert (ROOT / "docs" / "demo" / "report.md").exists()


def test_fields_task_options_lists_every_task_sources_options():
    r = CliRunner().invoke(app, ["fields", "task_options"])  # piped: tab-separated lines
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in r.output.splitlines()]
    assert all(len(row) == 3 for row in rows) and "{}" not in [row[1] for row in rows]
    got = {(row[0], row[1], row[2].split("]")[0] + "]") for row in rows}
    for expected in [
        ("task_options.min_len", "3", "[reverse]"),
        ("task_options.add_scale", "10.0", "[mixed-scale]"),
        ("task_options.reward", "'numeric'", "[jsonl:PATH]"),
        ("task_options.prompt_field", "'prompt'", "[hf:PATH]"),
        ("task_options.eval_fraction", "0.1", "[python:MODULE:FUNCTION]"),
        ("task_options.answer_format", "'tag'", "[rg:NAME]"),
        ("task_options.eval_size", "128", "[rg:NAME]"),
    ]:
        assert expected in got, expected
