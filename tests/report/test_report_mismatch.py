"""The report's mismatch columns: present when a study measured the training–inference mismatch
and some cell has a source of it, absent from studies (and the fixture) that did not, and from
float32 studies whose measured mismatch is rounding alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.report import summary_table
from tests.fixtures import synthetic


def _with_source(study):
    """The study with a bfloat16 sampler in its base config: a mismatch source."""
    rollout = {**study.base_config["rollout"], "sampler_dtype": "bfloat16"}
    return replace(study, base_config={**study.base_config, "rollout": rollout})


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
    header, rows = summary_table(_with_source(replace(study, runs=runs)))
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
    header, rows = summary_table(_with_source(replace(study, runs=runs)))
    col = header.index("mismatch KL (mean)")
    values = {row[0]: row[col] for row in rows}
    assert float(values[first]) == pytest.approx(0.5)
    assert all(values[c] == "—" for c in cells[1:]), values  # fmt of NaN: no value


def test_float32_rounding_alone_shows_no_mismatch_columns(tmp_path) -> None:
    """A float32 study measures ~1e-13 of mismatch: no source, so no column and no text."""
    from harness.report import build_report
    from harness.report.configview import mismatch_sources

    study = synthetic.three_cells()
    runs = [
        replace(r, summary={**r.summary, "stability/mismatch_kl_k3_mean": 3e-13})
        for r in study.runs
    ]
    header, _ = summary_table(replace(study, runs=runs))
    assert not [h for h in header if "mismatch" in h]
    md = build_report(replace(study, runs=runs), tmp_path, n_boot=50, fit=False)
    assert "mismatch KL" not in md.markdown.read_text()
    # Each source on its own is one.
    assert mismatch_sources({"rollout.sampler_logit_noise": 0.1}) == [
        "rollout.sampler_logit_noise=0.1"
    ]
    assert mismatch_sources({"model_options.dtype": "float32", "rollout.sampler_dtype": "float16"})
    assert mismatch_sources({"model_options.dtype": "bfloat16"}) == ["bfloat16 learner and sampler"]
    assert mismatch_sources({"rollout.staleness": 1}) == ["rollout.staleness=1"]
    assert mismatch_sources({"model_options.dtype": "float32", "rollout.sampler_dtype": None}) == []
    # The engine at the learner's own dtype is one too: its kernels are not the learner's.
    assert mismatch_sources({"rollout.sampler_backend": "vllm"}) == [
        "rollout.sampler_backend=vllm (the inference engine's kernels)"
    ]
    assert mismatch_sources({"rollout.sampler_backend": "fast"}) == []
    header, _ = summary_table(_with_source(replace(study, runs=runs)))
    assert "mismatch KL (mean)" in header
