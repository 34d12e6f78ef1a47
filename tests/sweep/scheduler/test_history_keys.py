"""The step histories a study is read back with hold every per-step metric the report tabulates
(a table over a history the reader never loaded is empty in every real sweep)."""

from harness.metrics import STEP_METRICS
from harness.report.tables import CORRECTION_COLUMNS, MISMATCH_SPLIT_COLUMNS
from harness.sweep.scheduler.results import HISTORY_KEYS, _history
from harness.tracking import MemoryTracker


def test_every_tabulated_step_metric_is_read_back():
    tabulated = {k for k, _ in CORRECTION_COLUMNS + MISMATCH_SPLIT_COLUMNS}
    assert tabulated <= set(HISTORY_KEYS)
    assert len(HISTORY_KEYS) == len(set(HISTORY_KEYS))
    assert set(HISTORY_KEYS) <= set(STEP_METRICS)


def test_a_runs_correction_history_is_loaded_at_its_steps():
    tracker = MemoryTracker()
    rid = tracker.start_run(experiment="e", run_name="r")
    for step, v in enumerate([0.1, 0.3]):
        tracker.log_metrics(rid, {"policy/correction_masked_frac": v}, step=step)
    out = _history(tracker, rid, steps=3)
    assert out["policy/correction_masked_frac"][:2] == [0.1, 0.3]
