"""Where a study lives: the Optuna storages (journal file, SQLite, PostgreSQL), the journal's
lock, the adapter over Optuna's private API, and the checks a command runs before opening them."""
