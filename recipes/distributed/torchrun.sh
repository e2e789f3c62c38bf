#!/usr/bin/env bash
# Several nodes with torchrun: run this on every node, with the same HEAD_NODE and a different NODE_RANK
# (0 on the head node). NPROC_PER_NODE processes per node (one per GPU); the trainer gets
# --trainer.num_nodes NNODES --trainer.devices NPROC_PER_NODE, so Lightning and torchrun agree.
#   NNODES=4 NODE_RANK=0 HEAD_NODE=node001 bash recipes/distributed/torchrun.sh \
#       --config recipes/pretrain/llama-1b.yaml --config recipes/norms/bhyt.yaml \
#       --config recipes/distributed/ddp-8gpu.yaml --config recipes/distributed/multinode.yaml
# FSDP2 (ModelParallelStrategy) also needs --trainer.strategy.init_args.data_parallel_size NNODES x NPROC_PER_NODE.
# Settings (environment): NNODES (4), NPROC_PER_NODE (8), NODE_RANK (required), HEAD_NODE (required),
# HEAD_PORT (29500), PYTHON (the quick start's .venv/bin/python where it exists, else python).
set -euo pipefail

: "${NNODES:=4}" "${NPROC_PER_NODE:=8}" "${HEAD_PORT:=29500}"
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
fi
: "${NODE_RANK:?set NODE_RANK: 0 on the head node, 1 .. NNODES-1 on the others}"
: "${HEAD_NODE:?set HEAD_NODE: the address of node 0, the same on every node}"

exec "$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" \
  --node_rank "$NODE_RANK" --master_addr "$HEAD_NODE" --master_port "$HEAD_PORT" \
  -m bhyt_pl fit "$@" --trainer.num_nodes "$NNODES" --trainer.devices "$NPROC_PER_NODE"
