"""A fault injected into every Python process of a test's sweep (this folder is put first on
PYTHONPATH): when ``HARNESS_TEST_HOLD_LOCK`` names a marker file, the first process to take the
journal lock after a trial has completed writes its pid there and then hangs *holding the lock*,
so that the test can kill it at exactly that state."""

import os

_MARKER = os.environ.get("HARNESS_TEST_HOLD_LOCK")

if _MARKER:
    import time

    import harness.sweep.stores.journal_lock as _jl

    _real_claim = _jl.JournalLock._claim

    def _claim(self, fd):  # type: ignore[no-untyped-def]
        _real_claim(self, fd)
        try:
            with open(self.journal_path, "rb") as f:
                completed = b'"state":1' in f.read()
        except OSError:
            completed = False
        if not completed:
            return
        try:
            marker = os.open(_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return  # another process is the one that hangs
        os.write(marker, str(os.getpid()).encode())
        os.close(marker)
        while True:  # hold the lock until killed
            time.sleep(3600)

    _jl.JournalLock._claim = _claim  # type: ignore[method-assign]

_REPORT_MARKER = os.environ.get("HARNESS_TEST_HANG_IN_REPORT")

if _REPORT_MARKER:
    import time

    import harness.core.fsutil as _fs

    _real_atomic_write = _fs.atomic_write

    def _atomic_write(path, data):  # type: ignore[no-untyped-def]
        """Half of ``report.md`` reaches its temp file, then the writer hangs there until killed:
        the state a power cut mid-report leaves."""
        if path.name != "report.md":
            return _real_atomic_write(path, data)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        with open(_fs.temp_path(path), "wb") as f:
            f.write(raw[: len(raw) // 2])
        with open(_REPORT_MARKER, "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(3600)

    _fs.atomic_write = _atomic_write
