"""The docs stay in step with the code."""

from pathlib import Path

from harness.metrics import STEP_METRICS, markdown

ROOT = Path(__file__).resolve().parent.parent


def test_metrics_doc_is_generated_from_the_vocabulary():
    assert (ROOT / "docs" / "metrics.md").read_text() == markdown()
    assert len(STEP_METRICS) >= 40


def test_readme_names_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make test" in text and "make ablate" in text
