"""What a study shows: the dry-run grid and ``harness status`` tables, the live progress bar,
finishing a study (ranking, report, MLflow tags), exporting a cell, and the dashboard UIs."""
