"""Faults injected into every Python process of a test's sweep (this folder is put first on
PYTHONPATH), each when its variable names a marker file:

* ``HARNESS_TEST_HOLD_LOCK``: the first process to take the journal lock after a trial has
  completed writes its pid there and then hangs *holding the lock*, so that the test can kill it
  at exactly that state;
* ``HARNESS_TEST_HANG_IN_REPORT``: the report's writer hangs with half of ``report.md`` written;
* ``HARNESS_TEST_HOLD_SECOND_RUN``: a process holds once its second run recorded its first step
  (until ``HARNESS_TEST_HOLD_RELEASE`` names a file that exists, or until killed)."""

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

_HOLD_MARKER = os.environ.get("HARNESS_TEST_HOLD_SECOND_RUN")

if _HOLD_MARKER:
    # Patched when harness.run.scaffold is first imported, so that a process that never trains
    # (the coordinator's helpers) does not import torch for it.
    import importlib.abc
    import importlib.util
    import sys
    import time

    _HOLD_RELEASE = os.environ.get("HARNESS_TEST_HOLD_RELEASE")

    def _hold_at_second_run(scaffold):  # type: ignore[no-untyped-def]
        """Hold the process once its second run recorded its first step (in a pack of two: both
        trials running, each with a step recorded; unpacked: the second trial mid-run), after
        writing its pid to the marker ``HARNESS_TEST_HOLD_SECOND_RUN`` names; until the file
        ``HARNESS_TEST_HOLD_RELEASE`` names exists, or until killed without one."""
        record = scaffold.Run.record
        runs = []

        def holding_record(self, step, metrics, **kw):  # type: ignore[no-untyped-def]
            record(self, step, metrics, **kw)  # handed to the tracker: the step is recorded
            if step != 0:
                return
            runs.append(id(self))
            if len(runs) != 2:
                return
            try:
                fd = os.open(_HOLD_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return  # a rerun: the marker is from the first sweep
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            while not (_HOLD_RELEASE and os.path.exists(_HOLD_RELEASE)):
                time.sleep(0.05)

        scaffold.Run.record = holding_record

    class _PatchScaffoldOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != "harness.run.scaffold":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            execute = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                execute(module)
                _hold_at_second_run(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchScaffoldOnImport())
