#!/usr/bin/env bash
# Multi-node training with torchrun: run this on EVERY node (same MASTER_ADDR/MASTER_PORT everywhere).
#
#   NNODES=2 NODE_RANK=0 NPROC_PER_NODE=8 MASTER_ADDR=10.0.0.1 infra/launch/torchrun_node.sh MANIFEST_URI [TRAIN_CONFIG] [-- args]
#
# NODE_RANK=0 is the node at MASTER_ADDR. With RDZV_BACKEND=c10d, torchrun's elastic rendezvous is used instead
# (node ranks assigned on arrival, RDZV_ID names the job), and MAX_RESTARTS (default 3) restarts failed workers;
# the trainer resumes from its last complete checkpoint. Sources infra/launch/env.sh and runs a short
# `pileworks doctor` first (PILEWORKS_SKIP_DOCTOR=1 skips it); PILEWORKS_DRY_RUN=1 prints the command only.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

(($# >= 1)) || { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
MANIFEST="$1"
shift
CONFIG="${REPO}/training/configs/tiny.yaml"
if (($#)) && [[ $1 != -- ]]; then CONFIG="$1"; shift; fi
[[ ${1:-} == -- ]] && shift

NNODES="${NNODES:-1}"
NPROC_PER_NODE="${NPROC_PER_NODE:-$(nvidia-smi -L 2>/dev/null | grep -c ^GPU || true)}"
[[ ${NPROC_PER_NODE:-0} -ge 1 ]] || NPROC_PER_NODE=2  # CPU node: 2 gloo ranks
if ((NNODES > 1)) && [[ -z ${MASTER_ADDR:-} ]]; then
  echo "set MASTER_ADDR to the address of node 0 (the same value on every node)" >&2
  exit 2
fi
# shellcheck source=infra/launch/env.sh
source "$REPO/infra/launch/env.sh"

cmd=(torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --max-restarts "${MAX_RESTARTS:-3}")
if [[ ${RDZV_BACKEND:-static} == c10d ]]; then
  cmd+=(--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "${RDZV_ID:-pileworks}")
else
  [[ -n ${NODE_RANK:-} ]] || { echo "set NODE_RANK (0 on the MASTER_ADDR node, 1..NNODES-1 elsewhere)" >&2; exit 2; }
  cmd+=(--node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
fi
cmd+=(-m training.train --manifest "$MANIFEST" --config "$CONFIG" "$@")

if [[ ${PILEWORKS_DRY_RUN:-0} == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
if [[ ${PILEWORKS_SKIP_DOCTOR:-0} != 1 ]]; then
  # Workers start before the master's store may be up: a closed port is only a warning here.
  pileworks doctor --only versions,gpu,network,master ||
    { echo "doctor found problems: fix them or set PILEWORKS_SKIP_DOCTOR=1" >&2; exit 1; }
fi
cd "$REPO"
exec "${cmd[@]}"
