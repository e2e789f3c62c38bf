"""tests/conftest.py: one Ctrl-C during a test that trains in-process stops the whole suite (pytest run as a
subprocess on tests/distributed_jobs/ctrl_c_suite.py, SIGINT sent to its process group as a terminal does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed_jobs.launch import clean_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cli", "lightning"])
def test_one_ctrl_c_during_an_in_process_fit_ends_the_session(tmp_path: Path, mode: str) -> None:
    """The fit caught the Ctrl-C (bhyt_pl: saved, raised StoppedByCtrlC; Lightning: ignored SIGINT, exit 1), so
    the test failed, the next one ran, and the suite carried on until SIGTERM."""
    env = clean_env() | {"CTRL_C_SUITE_DIR": str(tmp_path), "CTRL_C_SUITE_MODE": mode}
    suite = ROOT / "tests" / "distributed_jobs" / "ctrl_c_suite.py"
    # Ctrl-C reaches a terminal's foreground job with SIGINT at its default; a suite started in the background by a
    # non-interactive shell (nohup, `cmd &`) inherits SIGINT ignored, and the session would never see the key
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.time() + 300
    while not (tmp_path / "training").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # the terminal sends Ctrl-C to the foreground process group
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "Ctrl-C stopped an in-process fit in" in out and "test_first_fit_is_interrupted" in out, out[-3000:]
    assert not (tmp_path / "second").exists(), out[-3000:]  # the second test never ran
