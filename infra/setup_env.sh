#!/usr/bin/env bash
# One run sets up a pileworks environment on this machine; rerunning it skips what is already done.
#
#   infra/setup_env.sh             # venv in ./.venv (or a conda env where conda is installed), torch, DeepSpeed, pileworks
#   infra/setup_env.sh --dry-run   # print the plan, change nothing
#
# torch matches the machine: the CPU wheel where there is no nvidia-smi; on a GPU host the CUDA build for the
# newest CUDA the driver supports (nvidia-smi's "CUDA Version"). Then DeepSpeed (no ops prebuilt: they JIT or
# are not needed), then `pip install -e .[dev]`, then the versions of torch, CUDA, NCCL and DeepSpeed and a
# short `pileworks doctor`. Options (or the PILEWORKS_* variables):
#   --env-dir DIR        environment folder (PILEWORKS_ENV_DIR, default <repo>/.venv)
#   --venv | --conda     force the environment kind (default: conda when `conda` is on PATH, else venv)
#   --python PY          interpreter for a new venv (PILEWORKS_PYTHON, default python3.11, else python3)
#   --torch-version V    (PILEWORKS_TORCH_VERSION, default 2.13.0)
#   --torch-index URL    wheel index for torch; "pypi" = pip's configured index (PILEWORKS_TORCH_INDEX;
#                        default: PyTorch's cpu/cuXXX index, or pip's own when it already has the +cpu wheel)
#   --cuda-tags "T ..."  CUDA builds to choose from, newest first (PILEWORKS_CUDA_TAGS)
#   --driver-cuda X.Y    plan for a driver supporting CUDA X.Y without asking nvidia-smi (PILEWORKS_DRIVER_CUDA)
#   --extras LIST        pileworks extras to install (PILEWORKS_EXTRAS, default dev; "" for none)
#   --no-project         stop after torch and DeepSpeed
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="${PILEWORKS_ENV_DIR:-$REPO/.venv}"
ENV_KIND="${PILEWORKS_ENV_KIND:-auto}"
PYTHON_BIN="${PILEWORKS_PYTHON:-}"
TORCH_VERSION="${PILEWORKS_TORCH_VERSION:-2.13.0}"
TORCH_INDEX="${PILEWORKS_TORCH_INDEX:-auto}"
CUDA_TAGS="${PILEWORKS_CUDA_TAGS:-cu130 cu129 cu128 cu126 cu124 cu121 cu118}"
DRIVER_CUDA="${PILEWORKS_DRIVER_CUDA:-}"  # set it where nvidia-smi cannot run (docker build for a GPU host)
EXTRAS="${PILEWORKS_EXTRAS-dev}"
DRY_RUN=0
WITH_PROJECT=1

say() { echo "setup_env: $*"; }
die() { echo "setup_env: error: $*" >&2; exit 1; }
run() {
  if ((DRY_RUN)); then
    echo "plan: $*"
  else
    echo "+ $*"
    "$@"
  fi
}

parse_args() {
  while (($#)); do
    case "$1" in
      --dry-run) DRY_RUN=1 ;;
      --env-dir) ENV_DIR="$2"; shift ;;
      --venv) ENV_KIND=venv ;;
      --conda) ENV_KIND=conda ;;
      --python) PYTHON_BIN="$2"; shift ;;
      --torch-version) TORCH_VERSION="$2"; shift ;;
      --torch-index) TORCH_INDEX="$2"; shift ;;
      --cuda-tags) CUDA_TAGS="$2"; shift ;;
      --driver-cuda) DRIVER_CUDA="$2"; shift ;;
      --extras) EXTRAS="$2"; shift ;;
      --no-project) WITH_PROJECT=0 ;;
      -h | --help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) die "unknown option $1 (see --help)" ;;
    esac
    shift
  done
}

# ---------------------------------------------------------------- the machine
GPU_DRIVER=""
detect_gpu() {
  if [[ -n $DRIVER_CUDA ]]; then
    GPU_DRIVER="(given)"
    return 0
  fi
  command -v nvidia-smi >/dev/null || return 0
  local header
  header="$(nvidia-smi 2>&1)" || die "nvidia-smi is installed but fails: ${header%%$'\n'*} (is the driver loaded?)"
  GPU_DRIVER="$(sed -n 's/.*Driver Version: *\([0-9.]*\).*/\1/p' <<<"$header" | head -n1)"
  DRIVER_CUDA="$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' <<<"$header" | head -n1)"
  [[ -n $DRIVER_CUDA ]] || die "cannot read the CUDA version from nvidia-smi's header"
}

# cu128 -> 1208; 12.8 -> 1208: comparable integers
tag_number() { local v="${1#cu}"; echo $((10#${v:0:${#v}-1} * 100 + 10#${v: -1})); }
cuda_number() { local major="${1%%.*}" minor="${1#*.}"; echo $((10#$major * 100 + 10#${minor%%.*})); }

pick_cuda_tag() {
  local want tag
  want="$(cuda_number "$DRIVER_CUDA")"
  for tag in $CUDA_TAGS; do
    if (($(tag_number "$tag") <= want)); then echo "$tag"; return 0; fi
  done
  return 1
}

pip_has_local_cpu_wheel() {
  # An offline mirror (pip's find-links) holding torch-V+cpu makes the plain install the CPU wheel.
  local dirs d
  dirs="${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true)"
  for d in $dirs; do
    d="${d#file://}"
    compgen -G "$d/torch-${TORCH_VERSION}+cpu-*.whl" >/dev/null && return 0
  done
  return 1
}

TORCH_FLAVOR=""
TORCH_PIP_ARGS=()
plan_torch() {
  if [[ -z $DRIVER_CUDA ]]; then
    TORCH_FLAVOR="cpu"
    say "no nvidia-smi: CPU machine, torch $TORCH_VERSION CPU wheel (gloo backend)"
  else
    TORCH_FLAVOR="$(pick_cuda_tag)" || die "driver $GPU_DRIVER supports CUDA $DRIVER_CUDA, older than every build in" \
      "'$CUDA_TAGS': upgrade the NVIDIA driver, or pass --torch-index for an older torch"
    say "GPU driver $GPU_DRIVER supports CUDA $DRIVER_CUDA: torch $TORCH_VERSION built for $TORCH_FLAVOR"
  fi
  local index="$TORCH_INDEX" spec="torch==$TORCH_VERSION+$TORCH_FLAVOR"
  if [[ $index == auto ]]; then
    if [[ $TORCH_FLAVOR == cpu ]] && pip_has_local_cpu_wheel; then index=pypi; else
      index="https://download.pytorch.org/whl/$TORCH_FLAVOR"; fi
  elif [[ $index == pypi ]]; then
    spec="torch==$TORCH_VERSION"  # whatever build pip's index serves under that version
  fi
  TORCH_PIP_ARGS=("$spec")
  [[ $index == pypi ]] || TORCH_PIP_ARGS+=(--index-url "$index")
}

# ---------------------------------------------------------------- the environment
PY=""
make_env() {
  if [[ $ENV_KIND == auto ]]; then
    if command -v conda >/dev/null; then ENV_KIND=conda; else ENV_KIND=venv; fi
  fi
  PY="$ENV_DIR/bin/python"
  if [[ -x $PY ]]; then
    say "environment $ENV_DIR exists: reusing it"
  elif [[ $ENV_KIND == conda ]]; then
    run conda create -y -p "$ENV_DIR" python=3.11 pip
  else
    if [[ -z $PYTHON_BIN ]]; then
      PYTHON_BIN="$(command -v python3.11 || command -v python3 || true)"
    fi
    [[ -n $PYTHON_BIN ]] || die "no python3 found: install Python >= 3.10 or pass --python"
    [[ "$("$PYTHON_BIN" -c 'import sys; print(sys.version_info >= (3, 10))' 2>&1)" == True ]] ||
      die "$PYTHON_BIN does not run or is older than 3.10: pass --python /path/to/python3.10+"
    run "$PYTHON_BIN" -m venv "$ENV_DIR"
  fi
}

# Versions from the package metadata: importing torch/deepspeed takes seconds, reading METADATA does not.
installed() {
  if [[ -x $PY ]]; then
    "$PY" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1" 2>/dev/null || true
  fi
}

install_torch() {
  local have want_local
  have="$(installed torch)"
  want_local="$TORCH_FLAVOR"
  if [[ $have == "$TORCH_VERSION+$want_local" ]] || { [[ $have == "$TORCH_VERSION" ]] && [[ $want_local != cpu ]] &&
    "$PY" -c 'import torch, sys; sys.exit(torch.version.cuda is None)' 2>/dev/null; }; then
    say "torch $have already installed: skipping"
    return 0
  fi
  if [[ -n $have ]]; then
    # pip treats 2.13.0+cpu as satisfying torch==2.13.0, so a wrong build must go first
    say "torch $have installed, want $TORCH_VERSION+$want_local: replacing it"
    run "$PY" -m pip uninstall -y torch
  fi
  run "$PY" -m pip install "${TORCH_PIP_ARGS[@]}"
}

install_deepspeed() {
  local have
  have="$(installed deepspeed)"
  if [[ -n $have ]]; then
    say "deepspeed $have already installed: skipping"
    return 0
  fi
  # DS_BUILD_OPS=0: no C++/CUDA ops compiled at install; the trainer uses torch's AdamW.
  run env DS_BUILD_OPS=0 "$PY" -m pip install "deepspeed>=0.15"
}

install_project() {
  ((WITH_PROJECT)) || return 0
  local stamp="$ENV_DIR/.pileworks-setup" digest
  digest="$(cat "$REPO/pyproject.toml" <(echo "extras=$EXTRAS") | sha256sum | cut -d' ' -f1)"
  if [[ -f $stamp && "$(cat "$stamp")" == "$digest" && -n "$(installed pileworks)" ]]; then
    say "pileworks installed and pyproject.toml unchanged: skipping"
    return 0
  fi
  run "$PY" -m pip install -e "${REPO}${EXTRAS:+[$EXTRAS]}"
  ((DRY_RUN)) || echo "$digest" >"$stamp"
}

report() {
  if ((DRY_RUN)); then
    echo "plan: print torch/CUDA/NCCL/DeepSpeed versions, source infra/launch/env.sh, pileworks doctor (short)"
    return 0
  fi
  "$PY" - <<'EOF'
import torch
cuda = torch.version.cuda or "none (CPU build)"
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "n/a"
try:
    import deepspeed
    ds = deepspeed.__version__
except Exception as exc:  # report, do not hide: the doctor below says how to fix it
    ds = f"not importable ({exc})"
print(f"torch {torch.__version__} | CUDA {cuda} | GPUs {torch.cuda.device_count()} | NCCL {nccl} | DeepSpeed {ds}")
EOF
  # shellcheck source=infra/launch/env.sh
  source "$REPO/infra/launch/env.sh" || say "fix the variables above before a multi-node launch"
  if ((WITH_PROJECT)); then
    "$PY" -m flows.cli doctor --only versions,gpu,network,master,disk || say "doctor found problems (above)"
  fi
}

main() {
  parse_args "$@"
  cd "$REPO"
  detect_gpu
  plan_torch
  make_env
  install_torch
  install_deepspeed
  install_project
  report
  say "done: activate with 'source $ENV_DIR/bin/activate'"
}

main "$@"
