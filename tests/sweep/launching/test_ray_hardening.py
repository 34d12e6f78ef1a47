"""`--launcher ray` hardening: the Ray it starts (and the tests' private head) listens on loopback
only; SIGTERM stops a Ray-launched coordinator as gracefully as the local launcher (exit 130,
trial interrupted, resumed exactly once); an unreachable `--ray-address` is one line, exit 2,
nothing written."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.core.configtools import ConfigError

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"
LINUX_PROC = Path("/proc/net/tcp").exists()
needs_proc = pytest.mark.skipif(not LINUX_PROC, reason="reads listening sockets from /proc/net")


# ------------------------------------------------------------------ listening sockets, from /proc


def _hex_ip(field: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(field)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_by_inode() -> dict[int, tuple[str, int]]:
    """Every listening TCP socket of this network namespace: inode → (address, port)."""
    out: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            ip, port = f[1].split(":")
            out[int(f[9])] = (_hex_ip(ip), int(port, 16))
    return out


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone, or not ours
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def descendants(root: int) -> set[int]:
    """``root``'s descendants (children of children, ...) from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    table = listening_by_inode()
    return sorted((pid, *table[i]) for pid in pids for i in socket_inodes(pid) if i in table)


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return bool((mapped or addr).is_loopback)


def _one_task(ray: Any) -> int:
    """Run a task, so that a worker process (and its gRPC server) exists; its pid.  A lambda:
    pickled by value, as the workers cannot import this test module."""
    return int(ray.get(ray.remote(num_cpus=1)(lambda: os.getpid()).remote(), timeout=120))


# ------------------------------------------------------------------ 1. loopback only


def test_loopback_check_reads_proc_correctly() -> None:
    """The /proc reader itself: a socket bound to every interface is seen as such."""
    if not LINUX_PROC:
        pytest.skip("no /proc/net/tcp")
    with socket.socket() as wild, socket.socket() as local:
        wild.bind(("0.0.0.0", 0))
        wild.listen()
        local.bind(("127.0.0.1", 0))
        local.listen()
        mine = {(ip, port) for _, ip, port in listening({os.getpid()})}
        assert ("0.0.0.0", wild.getsockname()[1]) in mine
        assert ("127.0.0.1", local.getsockname()[1]) in mine
    assert not is_loopback("0.0.0.0") and not is_loopback("::")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")


@needs_proc
def test_the_ray_started_here_listens_on_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--launcher ray` without `--ray-address`: every TCP listener of every Ray process (GCS,
    raylet, object manager, runtime-env agent, driver and worker gRPC servers) is on 127.0.0.1,
    even with RAY_ADDRESS pointing elsewhere; the coordinator's SIGTERM handler survives
    ray.init; a stop asked before the workers start starts none."""
    ray = pytest.importorskip("ray")
    from harness.sweep.launching.launch import Resources
    from harness.sweep.launching.launchers.ray_launcher import RayLauncher
    from harness.sweep.launching.worker import WorkerOptions

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no per-user token file shared with others
    monkeypatch.setenv("RAY_ADDRESS", "10.255.255.1:6379")  # never joined without --ray-address
    if ray.is_initialized():
        ray.shutdown()
    before_children = descendants(os.getpid())
    before_mine = set(listening({os.getpid()}))

    def coordinator_handler(signum: int, frame: Any) -> None:
        raise AssertionError("not called in this test")

    old = signal.signal(signal.SIGTERM, coordinator_handler)
    launcher = RayLauncher(None)
    try:
        launcher.connect()
        assert signal.getsignal(signal.SIGTERM) is coordinator_handler
        worker_pid = _one_task(ray)
        ray_pids = descendants(os.getpid()) - before_children
        assert worker_pid in ray_pids
        found = [s for s in listening(ray_pids | {os.getpid()}) if s not in before_mine]
        gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
        assert gcs_port in {port for _, _, port in found}, found
        assert worker_pid in {pid for pid, _, _ in found}, found
        assert len({pid for pid, _, _ in found}) >= 4, found  # driver, GCS, raylet, worker, ...
        exposed = [s for s in found if not is_loopback(s[1])]
        assert not exposed, f"listening beyond loopback: {exposed}"
        assert ray.util.get_node_ip_address() == "127.0.0.1"

        launcher.request_stop()
        launcher.start(2, WorkerOptions(study="none", storage=None, results_dir=Path(".")),
                       Resources())  # fmt: skip
        assert launcher.refs == [] and launcher.running() == 0 and launcher.events(0.1) == []
    finally:
        launcher.close()
        signal.signal(signal.SIGTERM, old)
    assert not ray.is_initialized()


@needs_proc
def test_the_tests_private_ray_head_listens_on_loopback_only(ray_private_head: Any) -> None:
    ray = pytest.importorskip("ray")
    from harness.sweep.launching.launchers.ray_launcher import RayLauncher

    assert ray_private_head.proc is not None
    if ray.is_initialized():
        ray.shutdown()
    launcher = RayLauncher(ray_private_head.address)
    try:
        launcher.connect()
        worker_pid = _one_task(ray)
        pids = descendants(ray_private_head.proc.pid) | {ray_private_head.proc.pid}
        assert worker_pid in pids
        found = listening(pids)
        assert ray_private_head.port in {port for _, _, port in found}, found
        assert len({pid for pid, _, _ in found}) >= 3, found  # GCS, raylet, worker, ...
        exposed = [s for s in found if not is_loopback(s[1])]
        assert not exposed, f"listening beyond loopback: {exposed}"
    finally:
        launcher.close()


# ------------------------------------------------------------------ 2. SIGTERM


def _trials(results: Path, name: str) -> list[Any]:
    import optuna

    from harness.sweep.stores.storage import make_storage

    return optuna.load_study(study_name=name, storage=make_storage(None, results)).get_trials()


def _session_processes(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (the Ray session's temp dir)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


@needs_proc
@pytest.mark.slow  # a Ray sweep started, stopped and resumed: minutes on 2 cores
def test_sigterm_stops_a_ray_coordinator_gracefully_and_a_rerun_resumes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    doc = yaml.safe_load(SMOKE.read_text())
    doc.update(name="raysigterm", steps=200, seeds=1)  # long enough for SIGTERM to land mid-trial
    exp = tmp_path / "raysigterm.yaml"
    exp.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    ray_tmp = tempfile.mkdtemp(prefix="hrs", dir="/tmp")  # short: Ray's AF_UNIX socket paths
    env = {
        **os.environ,
        "RAY_TMPDIR": ray_tmp,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "harness", "ablate", str(exp), "--launcher", "ray",
            "--workers", "1", "--results-dir", str(results), "--no-report"]  # fmt: skip
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.time() + 240
        while not any(t.state.name == "RUNNING" for t in _safe_trials(results, "raysigterm")):
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.time() < deadline, "no trial started"
            time.sleep(0.2)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        stop_time = time.time() - t0
        log = out.decode(errors="replace")[-3000:]
        assert proc.returncode == 130, log
        assert stop_time < 15, (stop_time, log)
        assert "interrupted: run the same command again to resume" in log

        ts = _trials(results, "raysigterm")
        assert not any(t.state.name == "RUNNING" for t in ts), [t.state.name for t in ts]
        assert [t.user_attrs.get("outcome") for t in ts if t.state.name == "FAIL"] == [
            "interrupted"
        ]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
        exp_id = client.get_experiment_by_name("raysigterm").experiment_id
        statuses = [r.info.status for r in client.search_runs([exp_id])]
        assert "RUNNING" not in statuses, statuses  # children KILLED, the parent KILLED
        # No Ray process of that session outlives the coordinator (they are stopped with it).
        deadline = time.time() + 15
        while _session_processes(ray_tmp) and time.time() < deadline:
            time.sleep(0.2)
        assert not _session_processes(ray_tmp)
        done_before = {t.user_attrs["cell"] for t in ts if t.state.name == "COMPLETE"}

        r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        ts = _trials(results, "raysigterm")
        complete = Counter(t.user_attrs["cell"] for t in ts if t.state.name == "COMPLETE")
        assert complete == Counter({"c_clip=none": 1, "c_clip=3": 1}), complete
        assert done_before <= set(complete)
        assert not any(t.state.name == "RUNNING" for t in ts)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _session_processes(ray_tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _safe_trials(results: Path, name: str) -> list[Any]:
    try:
        return _trials(results, name)
    except Exception:  # the study does not exist yet
        return []


# ------------------------------------------------------------------ 3. --ray-address probe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_ray_address_where_nothing_listens_is_one_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray")
    results = tmp_path / "results"
    address = f"127.0.0.1:{_free_port()}"
    argv = ["ablate", str(SMOKE), "--launcher", "ray", "--ray-address", address, "--shared-fs",
            "--results-dir", str(results)]  # fmt: skip
    # The first refusal in a process imports what the command needs (seconds idle, a minute on
    # a loaded machine); the second shows the refusal itself is prompt, where ray.init would
    # retry the address for minutes.
    for timed in (False, True):
        t0 = time.monotonic()
        r = CliRunner().invoke(app, argv)
        assert not timed or time.monotonic() - t0 < 30
        assert r.exit_code == 2, r.output
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert lines == [f"error: --ray-address: cannot connect to {address} (Connection "
                         "refused); is the Ray head running (ray start --head --port PORT)?"], lines  # fmt: skip
        assert "Traceback" not in r.output
        assert not results.exists()  # no study, no journal, no mlflow.db


def test_ray_address_forms_and_a_bounded_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.sweep.launching.launchers.ray_checks import probe_address, split_address

    assert split_address("head:6379") == ("head", 6379)
    assert split_address("ray://10.0.0.1:10001") == ("10.0.0.1", 10001)
    assert split_address("[::1]:6379") == ("::1", 6379)
    assert split_address("auto") is None
    for bad in ("head", "head:", ":6379", "head:port", "head:70000", "head:0"):
        with pytest.raises(ConfigError, match=r"^--ray-address: must be HOST:PORT"):
            split_address(bad)
    asked: list[float | None] = []

    def silent(address: Any, timeout: float | None = None, **kw: Any) -> Any:
        asked.append(timeout)  # a host that never answers: the connect times out
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", silent)
    with pytest.raises(ConfigError) as info:
        probe_address("head.example:6379", timeout=0.5)
    assert asked == [0.5]
    assert str(info.value).startswith(
        "--ray-address: cannot connect to head.example:6379 (no answer within 0.5 s)"
    )
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="cannot connect to no-such-host.invalid:6379"):
        probe_address("no-such-host.invalid:6379", timeout=0.5)


# ------------------------------------------------------------------ 4. the stop flag, late


def _stop_answers(monkeypatch: pytest.MonkeyPatch, replies: list[Any]) -> list[bool]:
    """What a Ray worker's ``should_stop`` says while the channel gives ``replies`` in turn (a
    value, or an exception that ``ray.get`` raises), one ask per call."""
    ray = pytest.importorskip("ray")
    from harness.sweep.launching.launchers import ray_launcher

    pending = list(replies)

    def get(ref: Any, timeout: float | None = None) -> Any:
        assert timeout == ray_launcher.STOP_ASK_TIMEOUT_S
        reply = pending.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    class Channel:
        class stopped:  # noqa: N801 - the actor method's name
            @staticmethod
            def remote() -> str:
                return "ref"

    said: list[bool] = []

    def loop(opts: Any, emit: Any, should_stop: Any) -> dict[str, int]:
        said.extend(should_stop() for _ in replies)
        return {}

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray_launcher, "STOP_POLL_S", 0.0)  # ask on every call
    monkeypatch.setattr(ray_launcher, "worker_loop", loop)
    ray_launcher._ray_worker(None, Channel())  # type: ignore[arg-type]
    assert not pending
    return said


def test_a_late_stop_answer_keeps_a_ray_worker_going_and_a_dead_channel_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine the channel actor can answer after the ask's timeout: that is no
    stop (it was one, and the trial ended interrupted); a channel that died with its
    coordinator is, and so is one silent for longer than CHANNEL_SILENCE_S."""
    ray = pytest.importorskip("ray")
    from harness.sweep.launching.launchers import ray_launcher

    late = ray.exceptions.GetTimeoutError("late")
    dead = ray.exceptions.RayActorError()
    assert _stop_answers(monkeypatch, [False, late, late, False, True]) == [
        False, False, False, False, True,
    ]  # fmt: skip
    assert _stop_answers(monkeypatch, [False, dead]) == [False, True]
    monkeypatch.setattr(ray_launcher, "CHANNEL_SILENCE_S", -1.0)  # any silence is too long
    assert _stop_answers(monkeypatch, [late]) == [True]
