"""torchrun job (2 ranks, gloo, CPU): every registered norm scheme (plus Mix-LN with per-head QK-norm, OLMo 2's
reordered norm with full-width QK-norm and HybridNorm*) sharded
with FSDP2 (fully_shard per block, then the root) trains three steps on a global batch split over the
ranks, and must match the same model trained in one process on the whole batch: losses, and BHyT's
refreshed constant c on every rank.

Usage: python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp2_schemes.py OUT_DIR
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

from bhyt_pl import Llama, LlamaConfig, parameter_groups, registered_norms
from bhyt_pl.norms import build_norm_scheme

QK_NORM = "mix_ln+qk_norm"
QK_FULL = "reordered+qk_full"
STAR = "hybridnorm+star"
SCHEMES = [*registered_norms(), QK_NORM, QK_FULL, STAR]
NORM_ARGS = {"bhyt": {"seq_len": 16}, "mix_ln": {"alpha": 0.5}, STAR: {"star": True}}


def train(model, batches, steps=3):
    opt = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-2)
    losses = []
    for ids in batches[:steps]:
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.constrain_weights()  # what LlamaLM.optimizer_step does (nGPT: unit norms, columns across ranks)
        model.refresh_norm_constants()  # what NormConstantRefresh does every N steps
        losses.append(loss.detach())
    return torch.stack(losses)


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 64, (4, 17), generator=g) for _ in range(3)]
    results = {}
    for label in SCHEMES:
        norm = label.split("+")[0]
        torch.manual_seed(1)
        config = LlamaConfig(
            vocab_size=64,
            dim=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            mlp_dim=48,
            norm=norm,
            norm_args=NORM_ARGS.get(label, NORM_ARGS.get(norm, {})),
            qk_norm="head" if label == QK_NORM else "full" if label == QK_FULL else False,
            **build_norm_scheme(norm).model_settings,  # nGPT: untied embeddings
        )
        single = Llama(config)
        sharded = copy.deepcopy(single)
        for layer in sharded.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        single_losses = train(single, batches)
        half = [b.chunk(world)[rank] for b in batches]  # this rank's share of the global batch
        sharded_losses = train(sharded, half)
        dist.all_reduce(sharded_losses)  # mean of per-rank means = global mean (equal token counts)
        sharded_losses /= world
        c = torch.stack([layer.norms.c.detach().clone() for layer in sharded.layers]) if norm == "bhyt" else None
        # nGPT: after the hook every gathered matrix has unit norm along d, columns of o_proj/down spanning ranks
        unit = (
            [float((w.full_tensor().norm(dim=dim) - 1).abs().max()) for w, dim in sharded.width_matrices()]
            if norm == "ngpt"
            else []
        )
        gathered = [None] * world
        dist.all_gather_object(gathered, c)
        results[label] = {
            "single_losses": single_losses,
            "sharded_losses": sharded_losses,
            "single_c": torch.stack([layer.norms.c for layer in single.layers]) if norm == "bhyt" else None,
            "sharded_c": gathered if norm == "bhyt" else [],
            "unit_norm_error": unit,
        }
    if rank == 0:
        torch.save(results, Path(out_dir) / "fsdp2_schemes.pt")
    dist.barrier()  # both ranks leave together: a rank exiting while gloo still serves the other aborted (SIGABRT)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
