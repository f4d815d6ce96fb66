# shellcheck shell=bash
# Source on every node before launching:   source infra/launch/env.sh
#
# Sets the rendezvous and NCCL/gloo variables, keeping any you already exported, and checks them, so a job
# does not hang for 30 minutes on a wrong address or interface. Variables:
#   MASTER_ADDR         rank 0's address, reachable from every node (default 127.0.0.1: one node)
#   MASTER_PORT         rendezvous port, the same on every node (default 29500)
#   NCCL_SOCKET_IFNAME  interface NCCL bootstraps over (default: the one that routes to MASTER_ADDR)
#   GLOO_SOCKET_IFNAME  the same for gloo (CPU runs, and torch's store handshake)
#   NCCL_IB_DISABLE     1 when this host has no InfiniBand device, else 0
#   NCCL_DEBUG          WARN (set INFO to see which interface/transport NCCL picked)
# Returns non-zero (without closing your shell) when a value is wrong.

_pw_env_err() { echo "env.sh: error: $*" >&2; }

_pw_iface_for() {
  # The interface that carries traffic to $1; for an address of this host, the interface holding it.
  local route dev
  route=$(ip -o route get "$1" 2>/dev/null) || return 1
  if [[ $route == local* ]]; then
    dev=$(ip -o addr show 2>/dev/null | awk -v a="$1" '{split($4, p, "/"); if (p[1] == a) {print $2; exit}}')
  else
    dev=$(awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}' <<<"$route")
  fi
  [[ -n $dev ]] && echo "$dev"
}

_pw_env_setup() {
  local ok=0 ip
  export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
  export MASTER_PORT="${MASTER_PORT:-29500}"
  if ! [[ $MASTER_PORT =~ ^[0-9]+$ ]] || ((MASTER_PORT < 1 || MASTER_PORT > 65535)); then
    _pw_env_err "MASTER_PORT=$MASTER_PORT is not a port number (1-65535)"
    ok=1
  fi
  ip=$(getent ahostsv4 "$MASTER_ADDR" 2>/dev/null | awk '{print $1; exit}') || true
  if [[ -z $ip ]]; then
    _pw_env_err "cannot resolve MASTER_ADDR=$MASTER_ADDR: use an IP, or add it to /etc/hosts on every node"
    ok=1
  elif [[ $ip != 127.* ]] && command -v ip >/dev/null; then
    local dev
    dev=$(_pw_iface_for "$ip") || dev=""
    if [[ -z $dev ]]; then
      _pw_env_err "no route from this host to MASTER_ADDR=$MASTER_ADDR ($ip)"
      ok=1
    fi
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$dev}"
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$dev}"
  fi
  local name
  for name in ${GLOO_SOCKET_IFNAME:+${GLOO_SOCKET_IFNAME//,/ }}; do
    if [[ ! -e /sys/class/net/$name ]]; then
      _pw_env_err "GLOO_SOCKET_IFNAME names $name, which this host does not have (see: ip -br addr)"
      ok=1
    fi
  done
  if compgen -G "/sys/class/infiniband/*" >/dev/null; then
    export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}"
  else
    export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
  fi
  export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
  echo "env.sh: MASTER_ADDR=$MASTER_ADDR (${ip:-unresolved}) MASTER_PORT=$MASTER_PORT" \
    "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-auto} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-auto}" \
    "NCCL_IB_DISABLE=$NCCL_IB_DISABLE NCCL_DEBUG=$NCCL_DEBUG" >&2
  return $ok
}

_pw_env_setup
