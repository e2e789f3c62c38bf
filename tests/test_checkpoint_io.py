"""Checkpoints on disk, in one process: the completeness check of sharded folders (a real distributed checkpoint
written without a process group), the switch that keeps the previous checkpoint until the new one is in place,
the names of leftovers, and the one-line refusal of an incomplete folder by ``consolidate``."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from bhyt_pl.checkpoint_io import (
    COMPLETE,
    AtomicCheckpointIO,
    checkpoint_problem,
    checkpoint_step,
    commit_sharded_checkpoint,
    complete_checkpoints,
    consolidate_checkpoint,
    human_size,
    kept_path,
    leftovers,
    remove_leftovers,
    sharded_checkpoint_problem,
    switch_into_place,
    temporary_path,
)
from bhyt_pl.errors import UsageError
from bhyt_pl.runs import find_last_checkpoint

# the folders below are written without a process group, as one rank
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def sharded(folder: Path, step: int, marker: bool = True) -> Path:
    """A sharded checkpoint as Lightning's strategies write it: the distributed checkpoint's shards and
    ``.metadata``, and ``meta.pt`` with the trainer state; with ``marker``, completed as RunCheckpoint does."""
    torch.manual_seed(step)
    state = {"state_dict": {"w": torch.randn(64, 32), "b": torch.randn(32)}, "optimizer_0": {"m": torch.randn(64)}}
    dcp.save(state, checkpoint_id=str(folder))  # no process group: one "rank" writes every shard
    torch.save({"global_step": step, "bhyt_pl": {"model_config": {}}}, folder / "meta.pt")
    if marker:
        files = {p.name: p.stat().st_size for p in folder.iterdir()}
        (folder / COMPLETE).write_text(json.dumps({"step": step, "files": files}))
    return folder


def shard_of(folder: Path) -> Path:
    (shard,) = folder.glob("*.distcp")
    return shard


def test_a_complete_sharded_folder_passes_with_or_without_its_marker(tmp_path: Path) -> None:
    assert sharded_checkpoint_problem(sharded(tmp_path / "a", 3)) is None
    assert sharded_checkpoint_problem(sharded(tmp_path / "b", 3, marker=False)) is None  # written before markers
    assert sharded_checkpoint_problem(tmp_path / "b", require_marker=True) == (
        "no completion marker .complete: the save did not finish"
    )
    assert checkpoint_step(tmp_path / "a") == checkpoint_step(tmp_path / "b") == 3


@pytest.mark.parametrize("marker", [True, False], ids=["marker", "no-marker"])
def test_a_truncated_shard_is_named_with_its_sizes(tmp_path: Path, marker: bool) -> None:
    """The kill during an in-place save left shards of 2.5 and 2.2 MB of 11 MB beside the old .metadata."""
    folder = sharded(tmp_path / "last.ckpt", 5, marker=marker)
    shard = shard_of(folder)
    full = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(full // 3)
    problem = sharded_checkpoint_problem(folder)
    if marker:  # the marker recorded every size
        assert problem == f"{shard.name} has {human_size(full // 3)}, its save wrote {human_size(full)}"
    else:
        sizes = f"{human_size(full // 3)} of the {human_size(full)} .metadata names"
        assert problem == f"shard {shard.name} is truncated ({sizes})"


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda f: (f / ".metadata").unlink(), "no .metadata: the save did not finish"),
        (lambda f: (f / ".metadata").write_bytes((f / ".metadata").read_bytes()[:50]),
         "its .metadata cannot be read ("),
        (lambda f: shard_of(f).unlink(), "shard __0_0.distcp is missing"),
        (lambda f: (f / "meta.pt").unlink(), "no meta.pt (the trainer state): the save did not finish"),
        (lambda f: (f / "meta.pt").write_bytes(b"half"), "its meta.pt cannot be read ("),
    ],
    ids=["no-metadata", "half-metadata", "no-shard", "no-meta-pt", "bad-meta-pt"],
)  # fmt: skip
def test_each_kind_of_incomplete_folder_is_named(tmp_path: Path, damage, expected: str) -> None:
    folder = sharded(tmp_path / "last.ckpt", 5, marker=False)
    damage(folder)
    problem = sharded_checkpoint_problem(folder)
    assert problem is not None and problem.startswith(expected) and "\n" not in problem, problem


def test_a_truncated_single_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 4, "w": torch.ones(1000)}, path)
    assert checkpoint_problem(path) is None and checkpoint_step(path) == 4
    path.write_bytes(path.read_bytes()[:-100])  # the zip directory is written last
    assert checkpoint_problem(path).startswith("the file is truncated or damaged (BadZipFile")


def test_the_switch_keeps_the_previous_checkpoint_until_the_new_one_is_in_place(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "run"
    checkpoints = run / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    target = checkpoints / "last.ckpt"
    sharded(target, 1)
    new = sharded(temporary_path(target, 2), 2)
    rename = os.rename

    def stops_after_the_first(src, dst):  # a kill between the two renames
        rename(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", stops_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        switch_into_place(new, target)
    monkeypatch.undo()
    assert not target.exists() and checkpoint_step(kept_path(target)) == 1
    # --ckpt_path last finds the kept copy, complete; the new folder is a leftover
    found = find_last_checkpoint(run)
    assert found == kept_path(target) and checkpoint_problem(found) is None
    assert leftovers(checkpoints) == [new]
    # the next switch completes: the new checkpoint in place, the kept copy gone
    switch_into_place(new, target)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt"]
    assert checkpoint_step(target) == 2 and find_last_checkpoint(run) == target


def test_a_folder_replaces_a_file_and_a_file_replaces_a_folder(tmp_path: Path) -> None:
    """A run resumed under another strategy: DDP's file, then FSDP2's folder, then a file again."""
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1}, target)
    switch_into_place(sharded(temporary_path(target, 2), 2), target)
    assert target.is_dir() and checkpoint_step(target) == 2
    io.save_checkpoint({"global_step": 3}, target)
    assert target.is_file() and checkpoint_step(target) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_commit_writes_the_marker_and_refuses_an_incomplete_folder(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    sharded(target, 1)
    folder = sharded(temporary_path(target, 2), 2, marker=False)
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    commit_sharded_checkpoint(folder, target, 2)
    assert json.loads((target / COMPLETE).read_text()) == {"step": 2, "files": dict(sorted(sizes.items()))}
    assert sharded_checkpoint_problem(target, require_marker=True) is None and not folder.exists()
    broken = sharded(temporary_path(target, 3), 3, marker=False)
    (broken / "meta.pt").unlink()
    with pytest.raises(OSError) as err:
        commit_sharded_checkpoint(broken, target, 3)
    assert err.value.errno == errno.EIO and "no meta.pt" in str(err.value)
    assert checkpoint_step(target) == 2  # untouched


def test_leftovers_are_only_this_packages_temporary_names(tmp_path: Path) -> None:
    sharded(tmp_path / "last.ckpt", 4)
    ours = [".last.ckpt.ab12cd_9.tmp", ".epoch=0-step=5.ckpt.zz99zz99.tmp"]
    for name in ours:
        (tmp_path / name).write_bytes(b"x" * 1000)
    sharded(tmp_path / ".last.ckpt.step7.tmp", 7, marker=False)
    sharded(tmp_path / ".last.ckpt.previous", 3)  # stale: last.ckpt is complete
    others = ["notes.tmp", ".last.ckpt.tmp", ".hidden.ab12cd34.tmp", "last.ckpt.ab12cd34.tmp", "keep.ckpt"]
    for name in others:
        (tmp_path / name).write_text("not ours")
    found = sorted(p.name for p in leftovers(tmp_path))
    assert found == sorted([*ours, ".last.ckpt.step7.tmp", ".last.ckpt.previous"])
    step7, kept = tmp_path / ".last.ckpt.step7.tmp", tmp_path / ".last.ckpt.previous"
    kept_bytes = sum(f.stat().st_size for f in kept.iterdir())
    removed, size = remove_leftovers(tmp_path, keep=[step7])  # e.g. the checkpoint a run resumes from
    assert sorted(p.name for p in removed) == sorted([*ours, kept.name]) and size == 2000 + kept_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.ckpt", step7.name, *others])


def test_a_kept_copy_without_its_checkpoint_is_not_a_leftover(tmp_path: Path) -> None:
    """Between the two renames the kept copy is the only complete checkpoint."""
    sharded(tmp_path / ".last.ckpt.previous", 3)
    assert leftovers(tmp_path) == []
    assert [(p.name, s) for p, s in complete_checkpoints(tmp_path)] == [(".last.ckpt.previous", 3)]


def test_consolidate_refuses_an_incomplete_folder_and_names_the_complete_one(tmp_path: Path, capsys) -> None:
    """It raised a bare EOFError naming no file."""
    from bhyt_pl import cli

    good = sharded(tmp_path / "epoch=0-step=4.ckpt", 4)
    broken = sharded(tmp_path / "last.ckpt", 5)
    with open(shard_of(broken), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(UsageError) as err:
        consolidate_checkpoint(broken, tmp_path / "out.ckpt")
    message = str(err.value)
    assert message.startswith(f"{str(broken)!r} is an incomplete checkpoint: {shard_of(broken).name} has 1.0 KB")
    assert message.endswith(f"the newest complete checkpoint beside it is {str(good)!r} (step 4)")
    assert not (tmp_path / "out.ckpt").exists()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["consolidate", str(broken), str(tmp_path / "out.ckpt")], handle_errors=True)
    assert exit_.value.code == 2
    err_text = capsys.readouterr().err
    assert err_text == f"error: {message}\n"
