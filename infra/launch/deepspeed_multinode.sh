#!/usr/bin/env bash
# Multi-node training with DeepSpeed's launcher (pdsh over passwordless ssh). Run on the first node of the hostfile.
#
#   infra/launch/deepspeed_multinode.sh HOSTFILE MANIFEST_URI [TRAIN_CONFIG] [-- more trainer arguments]
#
# 1. sources infra/launch/env.sh (MASTER_ADDR/MASTER_PORT/NCCL_* set and checked; MASTER_ADDR defaults to this
#    node's address on the route to the first worker, never 127.0.0.1 when there are several nodes),
# 2. runs `pileworks doctor` on the hostfile (every node resolves and takes `ssh -o BatchMode=yes`; skip with
#    PILEWORKS_SKIP_DOCTOR=1),
# 3. execs `deepspeed --hostfile ... --module training.train ...`.
# PILEWORKS_DRY_RUN=1 prints the command instead of running it. DeepSpeed forwards NCCL_*/PYTHON* variables to
# the other nodes; put anything else they need (GLOO_SOCKET_IFNAME, AWS_*) in ~/.deepspeed_env as NAME=value lines.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

(($# >= 2)) || { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
HOSTFILE="$1" MANIFEST="$2"
shift 2
CONFIG="${REPO}/training/configs/tiny.yaml"
if (($#)) && [[ $1 != -- ]]; then CONFIG="$1"; shift; fi
[[ ${1:-} == -- ]] && shift
[[ -f $HOSTFILE ]] || { echo "no hostfile $HOSTFILE (see infra/hostfile.example)" >&2; exit 2; }

nodes=$(grep -cEv '^[[:space:]]*(#|$)' "$HOSTFILE" || true)
if [[ -z ${MASTER_ADDR:-} && $nodes -gt 1 ]]; then
  # The first node of the hostfile is this node (rank 0): take our address on the way to the second node.
  second=$(grep -Ev '^[[:space:]]*(#|$)' "$HOSTFILE" | sed -n 2p | awk '{print $1}')
  second_ip=$(getent ahostsv4 "$second" | awk '{print $1; exit}') || true
  MASTER_ADDR=$(ip -o route get "${second_ip:-$second}" 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')
  export MASTER_ADDR
fi
# shellcheck source=infra/launch/env.sh
source "$REPO/infra/launch/env.sh"

cmd=(deepspeed --hostfile "$HOSTFILE" --launcher "${PILEWORKS_DS_LAUNCHER:-pdsh}"
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
  --module training.train --manifest "$MANIFEST" --config "$CONFIG" "$@")

if [[ ${PILEWORKS_DRY_RUN:-0} == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
if [[ ${PILEWORKS_SKIP_DOCTOR:-0} != 1 ]]; then
  pileworks doctor --hostfile "$HOSTFILE" --only versions,gpu,network,master,hostfile ||
    { echo "doctor found problems: fix them or set PILEWORKS_SKIP_DOCTOR=1" >&2; exit 1; }
fi
cd "$REPO"
exec "${cmd[@]}"
