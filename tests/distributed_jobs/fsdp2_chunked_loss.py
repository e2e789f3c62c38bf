"""torchrun job (2 ranks, gloo, CPU): the chunked loss inside ``Llama.forward(idx, labels=...)`` under
FSDP2 (fully_shard per block, then the root, so the tied embedding is a root parameter unsharded only
during the root's forward). Each rank's loss and the reduced gradients must equal one process computing
the plain loss of full logits on the same half-batches.

Usage: python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp2_chunked_loss.py OUT_DIR
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from bhyt_pl import Llama, LlamaConfig


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=48, max_seq_len=32)
    single = Llama(config)
    sharded = copy.deepcopy(single)
    sharded.loss_impl, sharded.loss_chunk_tokens = "chunked", 5  # several chunks per rank
    for layer in sharded.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 97, (4, 9), generator=g)
    labels = ids.roll(-1, dims=1)
    labels[:, -1] = -100
    labels[1, :3] = -100
    halves = list(zip(ids.chunk(world), labels.chunk(world)))

    out = sharded(halves[rank][0], labels=halves[rank][1])
    out.loss.backward()  # FSDP2 averages gradients over ranks
    sharded_grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}

    single_losses = [F.cross_entropy(single(i).flatten(0, 1), y.flatten(), ignore_index=-100) for i, y in halves]
    (sum(single_losses) / world).backward()
    if rank == 0:
        losses = [torch.zeros(()) for _ in range(world)]
        dist.gather(out.loss.detach(), losses, dst=0)
    else:
        dist.gather(out.loss.detach(), dst=0)
    if rank == 0:
        torch.save(
            {
                "sharded_losses": torch.stack(losses),
                "single_losses": torch.stack([s.detach() for s in single_losses]),
                "sharded_grads": sharded_grads,
                "single_grads": {n: p.grad for n, p in single.named_parameters()},
            },
            Path(out_dir) / "fsdp2_chunked_loss.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
