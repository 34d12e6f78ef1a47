"""The report names the machine its scores came from, and says what carries to another one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.report import build_report
from tests.fixtures import synthetic

MACHINE = "AMD EPYC 7B13, AVX2, 2 cores, 1 torch thread, cpu"


def _header(md: str) -> str:
    return md.split("## What was varied")[0]


def test_the_header_names_the_machine_and_what_is_machine_specific(tmp_path: Path) -> None:
    study = synthetic.three_cells(seeds=3)
    study = replace(study, runs=[replace(r, machine=MACHINE) for r in study.runs])
    head = _header(build_report(study, tmp_path, n_boot=50, fit=False).markdown.read_text())
    assert f"| machine | {MACHINE} |" in head
    assert "direction of a difference and whether it is decided" in head


def test_several_machines_are_each_named_once(tmp_path: Path) -> None:
    study = synthetic.three_cells(seeds=3)
    other = MACHINE.replace("AVX2", "AVX512")
    runs = [replace(r, machine=MACHINE if i % 2 else other) for i, r in enumerate(study.runs)]
    head = _header(
        build_report(replace(study, runs=runs), tmp_path, n_boot=50, fit=False).markdown.read_text()
    )
    assert f"| machines | {other}; {MACHINE} |" in head


def test_a_study_stored_without_machines_has_no_such_row(tmp_path: Path) -> None:
    head = _header(
        build_report(
            synthetic.three_cells(seeds=3), tmp_path, n_boot=50, fit=False
        ).markdown.read_text()
    )
    assert "| machine" not in head and "kernels" not in head
