"""The report's mismatch columns: present when a study measured the training–inference mismatch,
absent from studies (and the fixture) that did not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.report import summary_table

try:
    from tests.fixtures import synthetic
except ImportError:  # pragma: no cover - run from inside tests/
    from fixtures import synthetic  # type: ignore[no-redef]


def test_studies_without_mismatch_summaries_show_no_mismatch_columns() -> None:
    header, _ = summary_table(synthetic.three_cells())
    assert not [h for h in header if "mismatch" in h]


def test_mismatch_summaries_become_columns_with_per_cell_means() -> None:
    study = synthetic.three_cells()
    # Give each cell's runs a known mismatch level: 1e-3 × (cell index + 1) × (seed + 1).
    cells = list(study.cells)
    runs = []
    for r in study.runs:
        level = 1e-3 * (cells.index(r.cell) + 1) * (r.seed + 1)
        summary = {**r.summary, "stability/mismatch_kl_k3_mean": level}
        summary["stability/mismatch_kl_k3_max"] = 2 * level
        runs.append(replace(r, summary=summary))
    header, rows = summary_table(replace(study, runs=runs))
    col = {name: i for i, name in enumerate(header)}
    by = {row[0]: row for row in rows}
    for i, cell in enumerate(cells):
        seeds = [r.seed for r in study.runs_of(cell) if r.status in ("completed", "diverged")]
        want = 1e-3 * (i + 1) * sum(s + 1 for s in seeds) / len(seeds)
        assert float(by[cell][col["mismatch KL (mean)"]]) == pytest.approx(want, rel=1e-2)
        assert float(by[cell][col["mismatch KL (max)"]]) == pytest.approx(2 * want, rel=1e-2)


def test_a_cell_without_measurements_reads_nan_not_zero() -> None:
    study = synthetic.three_cells()
    cells = list(study.cells)
    first = cells[0]
    runs = [
        replace(r, summary={**r.summary, "stability/mismatch_kl_k3_mean": 0.5})
        if r.cell == first
        else r
        for r in study.runs
    ]
    header, rows = summary_table(replace(study, runs=runs))
    col = header.index("mismatch KL (mean)")
    values = {row[0]: row[col] for row in rows}
    assert float(values[first]) == pytest.approx(0.5)
    assert all(values[c] == "—" for c in cells[1:]), values  # fmt of NaN: no value
