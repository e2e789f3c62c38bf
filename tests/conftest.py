"""Shared test set-up: offline Hugging Face, a private HF cache, deterministic seeds; one Ctrl-C stops the suite."""

from __future__ import annotations

import signal

import pytest
import torch

from bhyt_pl.callbacks.checkpointing import StoppedByCtrlC


@pytest.fixture(autouse=True)
def _offline_and_seeded(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)


def _stopped_by_ctrl_c(err: BaseException) -> bool:
    """A Ctrl-C that an in-process fit turned into something else: the CLI's ``StoppedByCtrlC`` (or its exit
    status 130 on the command line), or Lightning's ``sys.exit(1)`` after it caught ``KeyboardInterrupt``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, (StoppedByCtrlC, KeyboardInterrupt)):
            return True
        todo += [exc.__cause__, exc.__context__]
    return False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A Ctrl-C during a test that trains in-process ends the session, as it does in any other test: the
    fit caught it (bhyt_pl saves and raises ``StoppedByCtrlC``; Lightning ignores SIGINT from then on and exits
    with 1), so pytest alone would record one failed test and carry on with the next."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        return (yield)
    except BaseException as err:
        if _stopped_by_ctrl_c(err):
            signal.signal(signal.SIGINT, handler)  # Lightning leaves SIGINT ignored
            pytest.exit(f"Ctrl-C stopped an in-process fit in {item.nodeid}", returncode=pytest.ExitCode.INTERRUPTED)
        raise
    finally:
        if signal.getsignal(signal.SIGINT) != handler:
            signal.signal(signal.SIGINT, handler)
