"""Multi-node launches: two torchrun "nodes" of one process each on 127.0.0.1 (gloo, CPU), started with the
shipped ``recipes/distributed/torchrun.sh`` and ``recipes/distributed/multinode.yaml``, train and validate exactly as a
2-process single-node DDP run of the same recipe; the SLURM batch script agrees with the recipe."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from distributed_jobs.launch import ROOT, clean_env, records, run, val_records, write_yaml

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DISTRIBUTED = ROOT / "recipes" / "distributed"
SMALL = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "mlp_dim": 48, "max_seq_len": 64}


def _job(tmp: Path, name: str) -> list[str]:
    """The recipe stack: tiny + multinode.yaml + a small CPU model, token data and the step recorder."""
    job = {
        "trainer": {
            "accelerator": "cpu",
            "strategy": "ddp",
            "max_steps": 5,
            "limit_val_batches": 2,  # 2 x 4 windows of the whole validation set, 4 on each rank
            "val_check_interval": 2,  # after steps 2 and 4, and the last one
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "use_distributed_sampler": False,  # TokenDataModule splits windows by rank itself
            "callbacks+": [{"class_path": "recorder.StepRecorder", "init_args": {"out_dir": str(tmp / name)}}],
        },
        "model": {"norm": "bhyt", "overrides": SMALL, "warmup_steps": 2},
        "data": {
            "class_path": "lm_fixtures.TokenDataModule",
            "init_args": {"seq_len": 32, "batch_size": 4, "vocab": 64, "n": 256},
        },
    }
    return [
        "--config", str(ROOT / "recipes" / "tiny.yaml"),
        "--config", str(DISTRIBUTED / "multinode.yaml"),
        "--config", write_yaml(tmp / f"{name}.yaml", job),
        "--runs_dir", str(tmp / "runs"), "--run_name", name,
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_match_one_node_with_two_processes(tmp_path: Path) -> None:
    env = clean_env() | {"NNODES": "2", "NPROC_PER_NODE": "1", "HEAD_NODE": "127.0.0.1"}
    env |= {"HEAD_PORT": str(_free_port()), "PYTHON": sys.executable}
    nodes = [
        subprocess.Popen(
            ["bash", str(DISTRIBUTED / "torchrun.sh"), *_job(tmp_path, "nodes")],
            cwd=ROOT,
            env=env | {"NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    for node in nodes:
        try:
            outputs.append(node.communicate(timeout=600)[0])
        finally:
            node.kill()
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[-4000:] for o in outputs)

    # the reference: the same recipe on one node with two devices (Lightning starts the second process)
    run(["-m", "bhyt_pl", "fit", *_job(tmp_path, "single"), "--trainer.num_nodes", "1", "--trainer.devices", "2"])

    two_nodes, one_node = records(tmp_path / "nodes"), records(tmp_path / "single")
    assert sorted(two_nodes) == sorted(one_node) == [0, 1]
    for rank in (0, 1):
        assert {(r["num_nodes"], r["node_rank"], r["world_size"]) for r in two_nodes[rank]} == {(2, rank, 2)}
        assert {(r["num_nodes"], r["node_rank"], r["world_size"]) for r in one_node[rank]} == {(1, 0, 2)}
        assert [r["step"] for r in two_nodes[rank]] == [1, 2, 3, 4, 5]
        assert [r["rows"] for r in two_nodes[rank]] == [r["rows"] for r in one_node[rank]]  # the same data
        # the same losses: gloo sums the two ranks' gradients in the same order on one node or two
        assert [r["loss"] for r in two_nodes[rank]] == pytest.approx([r["loss"] for r in one_node[rank]], abs=1e-6)
    assert not set(two_nodes[0][0]["rows"]) & set(two_nodes[1][0]["rows"])  # each rank its own windows
    two_nodes_val, one_node_val = val_records(tmp_path / "nodes"), val_records(tmp_path / "single")
    for val in (two_nodes_val, one_node_val):
        assert sorted(val) == [0, 1] and val[0] == val[1]  # the synced val/loss, on every rank
        assert [r["step"] for r in val[0]] == [2, 4, 5]
    expected = [r["val_loss"] for r in one_node_val[0]]
    assert [r["val_loss"] for r in two_nodes_val[0]] == pytest.approx(expected, abs=1e-6)


def _sbatch(name: str) -> int:
    text = (DISTRIBUTED / "slurm.sbatch").read_text()
    return int(re.search(rf"^#SBATCH --{name}=(\d+)", text, re.MULTILINE).group(1))


def test_slurm_script_asks_for_the_recipes_nodes_and_devices() -> None:
    trainer = yaml.safe_load((DISTRIBUTED / "multinode.yaml").read_text())["trainer"]
    assert _sbatch("nodes") == trainer["num_nodes"]
    assert _sbatch("ntasks-per-node") == trainer["devices"] == _sbatch("gpus-per-node")
    text = (DISTRIBUTED / "slurm.sbatch").read_text()
    assert '--trainer.num_nodes "$SLURM_JOB_NUM_NODES" --trainer.devices "$SLURM_NTASKS_PER_NODE"' in text
    for script in ("slurm.sbatch", "torchrun.sh"):
        subprocess.run(["bash", "-n", str(DISTRIBUTED / script)], check=True)  # parses
