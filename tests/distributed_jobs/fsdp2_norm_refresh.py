"""2-process FSDP2 (gloo, CPU) job for tests/callbacks/test_norm_refresh.py; run with
``python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp2_norm_refresh.py OUT_DIR``.

Every rank builds the same bhyt Llama, shards it with ``fully_shard`` (per block, then the root),
perturbs the sharded value/output weights identically, refreshes ``c`` through ``NormConstantRefresh``
and writes ``c`` per layer, plus depth statistics of its own batch reduced over both ranks, to
``OUT_DIR/rank<r>.json``. The test compares them with single-process values.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from bhyt_pl import Llama, LlamaConfig
from bhyt_pl.callbacks import DepthStatsCollector, NormConstantRefresh

CONFIG = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48, max_seq_len=64)


def build() -> Llama:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_name("tiny", **CONFIG, norm="bhyt", norm_args={"seq_len": 32}))
    with torch.no_grad():  # move the weights away from init, the same way on every rank
        for i, layer in enumerate(model.layers):
            layer.attn.v_proj.weight.mul_(1.5 + i)
            layer.attn.o_proj.weight.add_(0.01 * (i + 1))
    return model


def batches() -> torch.Tensor:
    return torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(7))  # rank r gets rows 2r, 2r+1


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build()
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert type(model.layers[0].attn.v_proj.weight).__name__ == "DTensor"
    for layer in model.layers:
        layer.norms.c.zero_()  # a stale value the refresh must replace
    NormConstantRefresh().refresh(model)  # collective: gathers full V/O weights on every rank
    c = [float(layer.norms.c) for layer in model.layers]

    collector = DepthStatsCollector(model)
    with torch.no_grad(), collector:
        model(batches()[2 * rank : 2 * rank + 2])

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)
        return torch.stack(out)

    stats = collector.compute(all_gather)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"c": c, "stats": stats}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
