#!/usr/bin/env bash
# Create a Cloud TPU VM (single host or pod slice), install albert_jax on
# every worker, launch pre-training on all workers at once, delete the TPU.
# Run `bash tpu_setup.sh --help` for the commands and options.
set -euo pipefail

readonly LIBTPU_INDEX="https://storage.googleapis.com/jax-releases/libtpu_releases.html"
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
readonly SCRIPT_DIR

usage() {
  cat <<'EOF'
Usage: bash tpu_setup.sh [--dry_run] COMMAND [OPTIONS] [-- ARGS...]

Commands (each remote step runs on every worker at once, through
`gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all`):
  create    Create the TPU VM (a single host or a pod slice):
              gcloud compute tpus tpu-vm create NAME --zone --accelerator-type
              --version [--spot | --preemptible]
            ARGS: more gcloud flags, e.g. -- --network=NET.
  install   Ship the project to every worker (a tarball of --source via
            `gcloud compute tpus tpu-vm scp`, or a clone of --git_url), then
            on every worker create a venv (Python >= 3.11; apt-installed when
            missing) and `pip install -e . "jax[tpu]"` from the libtpu index.
  run       On every worker, in the venv, start
              python -m albert_jax.main --distributed ARGS...
            (jax.distributed.initialize() finds the other workers itself),
            with output in REMOTE_DIR/logs/LOG_NAME.<hostname>.log. Returns
            when the run has ended on all workers, so the lines printed by
            `python -m albert_jax.tools.sweep ... --print_commands
            --launcher=tpu` run one after another; with --detach it returns
            at once.
  ssh       Run the shell command ARGS on every worker (tail a log, stop a
            detached run, ...).
  delete    Delete the TPU VM (its disks go with it: keep workdirs in gs://).

Options (environment variable in brackets):
  --name=NAME          TPU VM name [TPU_NAME]; every command needs it.
  --zone=ZONE          e.g. us-central2-b [ZONE]; every command needs it.
  --project=PROJECT    Google Cloud project [PROJECT]; default: gcloud's.
  --accelerator=TYPE   create: e.g. v4-8, v4-64, v5p-128 [ACCELERATOR].
  --version=RUNTIME    create: TPU software version [RUNTIME_VERSION];
                       default tpu-ubuntu2204-base.
  --spot, --preemptible  create: a Spot / preemptible TPU.
  --source=DIR         install: project to ship [SOURCE]; default the folder
                       of this script.
  --git_url=URL        install: clone URL instead of a tarball [GIT_URL].
  --git_ref=REF        install: commit or branch [GIT_REF]; default origin/HEAD.
  --remote_dir=DIR     project folder on the workers, relative to the home
                       folder [REMOTE_DIR]; default albert_jax.
  --python=EXE         install: Python for the venv [PYTHON]; default
                       python3.11.
  --jax=SPEC           install: pip requirement for JAX [JAX_SPEC]; default
                       jax[tpu].
  --log_name=NAME      run: log file stem; default the basename of the
                       --workdir in ARGS, else run-<date>-<time>.
  --detach             run: start in the background and return at once.
  --dry_run            Print the commands instead of running them.
  -h, --help           This message.

Examples:
  export TPU_NAME=albert-v4-64 ZONE=us-central2-b
  bash tpu_setup.sh create --accelerator=v4-64 --spot
  bash tpu_setup.sh install
  bash tpu_setup.sh run -- --config=configs/albert_base.py \
      --workdir=gs://my-bucket/albert_base --config.batch_size=4096
  bash tpu_setup.sh ssh -- 'tail -n 5 albert_jax/logs/*.log'
  bash tpu_setup.sh delete
EOF
}

die() {
  echo "tpu_setup.sh: $*" >&2
  echo "Run 'bash tpu_setup.sh --help' for usage." >&2
  exit 2
}

# Prints one argument so that bash reads it back unchanged: bare when safe,
# else in double quotes when nothing in it expands, else in single quotes;
# an option's `--name=` stays outside the quotes.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then
    printf '%s' "$1"
  elif [[ $1 =~ ^(--[A-Za-z0-9_.-]+=)(.+)$ ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote "${BASH_REMATCH[2]}"
  elif [[ $1 != *[\"\$\`\\!]* ]]; then
    printf '"%s"' "$1"
  else
    local q="'\\''"
    printf "'%s'" "${1//\'/$q}"
  fi
}

quote_all() {
  local out="" arg
  for arg in "$@"; do
    out+="${out:+ }$(quote "${arg}")"
  done
  printf '%s' "${out}"
}

# Runs a command, or with --dry_run prints it (quoted, one per line).
execute() {
  if ((DRY_RUN)); then
    quote_all "$@"
    echo
  else
    "$@"
  fi
}

require() {  # require VALUE FLAG ENV_VAR
  [[ -n $1 ]] || die "${COMMAND}: $2 (or \$$3) is required."
}

COMMAND=""
DRY_RUN=0
SPOT=0
PREEMPTIBLE=0
DETACH=0
ARGS=()
TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
ACCELERATOR="${ACCELERATOR:-}"
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
SOURCE="${SOURCE:-${SCRIPT_DIR}}"
GIT_URL="${GIT_URL:-}"
GIT_REF="${GIT_REF:-origin/HEAD}"
REMOTE_DIR="${REMOTE_DIR:-albert_jax}"
PYTHON="${PYTHON:-python3.11}"
JAX_SPEC="${JAX_SPEC:-jax[tpu]}"
LOG_NAME=""

set_option() {  # set_option FLAG VALUE
  case $1 in
    --name) TPU_NAME=$2 ;;
    --zone) ZONE=$2 ;;
    --project) PROJECT=$2 ;;
    --accelerator) ACCELERATOR=$2 ;;
    --version) RUNTIME_VERSION=$2 ;;
    --source) SOURCE=$2 ;;
    --git_url) GIT_URL=$2 ;;
    --git_ref) GIT_REF=$2 ;;
    --remote_dir) REMOTE_DIR=$2 ;;
    --python) PYTHON=$2 ;;
    --jax) JAX_SPEC=$2 ;;
    --log_name) LOG_NAME=$2 ;;
    *) die "unknown option $1" ;;
  esac
}

while (($#)); do
  case $1 in
    --) shift; ARGS=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    --dry_run) DRY_RUN=1 ;;
    --spot) SPOT=1 ;;
    --preemptible) PREEMPTIBLE=1 ;;
    --detach) DETACH=1 ;;
    --*=*) set_option "${1%%=*}" "${1#*=}" ;;
    --*)
      (($# > 1)) || die "$1 needs a value."
      set_option "$1" "$2"
      shift ;;
    *)
      [[ -z ${COMMAND} ]] || die "unexpected argument '$1' (put program" \
        "arguments after --)."
      COMMAND=$1 ;;
  esac
  shift
done

[[ -n ${COMMAND} ]] || die "missing COMMAND (create, install, run, ssh or" \
  "delete)."
require "${TPU_NAME}" --name TPU_NAME
require "${ZONE}" --zone ZONE

WHERE=("${TPU_NAME}" "--zone=${ZONE}")
[[ -z ${PROJECT} ]] || WHERE+=("--project=${PROJECT}")

on_all_workers() {  # on_all_workers REMOTE_COMMAND
  execute gcloud compute tpus tpu-vm ssh "${WHERE[@]}" --worker=all \
    "--command=$1"
}

cmd_create() {
  require "${ACCELERATOR}" --accelerator ACCELERATOR
  local extra=()
  if ((SPOT && PREEMPTIBLE)); then
    die "create: --spot and --preemptible exclude each other."
  fi
  if ((SPOT)); then extra+=(--spot); fi
  if ((PREEMPTIBLE)); then extra+=(--preemptible); fi
  execute gcloud compute tpus tpu-vm create "${WHERE[@]}" \
    "--accelerator-type=${ACCELERATOR}" "--version=${RUNTIME_VERSION}" \
    "${extra[@]}" "${ARGS[@]}"
}

cmd_install() {
  ((${#ARGS[@]} == 0)) || die "install takes no arguments after --."
  local dir
  dir=$(quote "${REMOTE_DIR}")
  local fetch
  if [[ -n ${GIT_URL} ]]; then
    fetch="{ [ -d ${dir}/.git ] || git clone -q $(quote "${GIT_URL}") ${dir}; }"
    fetch+=" && git -C ${dir} fetch -q origin"
    fetch+=" && git -C ${dir} checkout -q --detach $(quote "${GIT_REF}")"
  else
    [[ -f ${SOURCE}/setup.cfg ]] || die "install: ${SOURCE} is not the" \
      "albert_jax project (no setup.cfg); pass --source or --git_url."
    local tarball="${TMPDIR:-/tmp}/albert_jax-src.tar.gz"
    execute tar -czf "${tarball}" --exclude=.git --exclude=.venv \
      --exclude=__pycache__ --exclude='*.egg-info' -C "${SOURCE}" .
    execute gcloud compute tpus tpu-vm scp "${tarball}" \
      "${TPU_NAME}:albert_jax-src.tar.gz" "${WHERE[@]:1}" --worker=all
    fetch="mkdir -p ${dir} && tar -xzf albert_jax-src.tar.gz -C ${dir}"
  fi
  local py
  py=$(quote "${PYTHON}")
  local script="set -e; "
  script+="command -v ${py} >/dev/null || { sudo apt-get update -qq"
  script+=" && sudo apt-get install -y -qq ${py} ${py}-venv; }; "
  script+="${fetch}; cd ${dir}; [ -d .venv ] || ${py} -m venv .venv; "
  script+=". .venv/bin/activate; pip install -q -U pip; "
  script+="pip install -q -e . $(quote "${JAX_SPEC}") -f ${LIBTPU_INDEX}; "
  script+='python -c "import jax; print(jax.process_index(), jax.devices())"'
  on_all_workers "${script}"
}

cmd_run() {
  ((${#ARGS[@]} > 0)) || die "run: give albert_jax.main's arguments after" \
    "--, e.g. -- --config=configs/demo.py --workdir=gs://bucket/run"
  local name=${LOG_NAME} arg workdir=""
  for arg in "${ARGS[@]}"; do
    if [[ ${arg} == --workdir=* ]]; then
      workdir=${arg#--workdir=}
    fi
  done
  if [[ -z ${name} && -n ${workdir} ]]; then
    name=$(basename "${workdir}")
  fi
  [[ -n ${name} ]] || name="run-$(date +%Y%m%d-%H%M%S)"
  local stem="logs/${name//[^A-Za-z0-9_.,=+-]/_}"
  local log="${stem}.\$(hostname).log"
  # Where things go, said before anything runs (also with --dry_run).
  echo "# log on each worker: ~/${REMOTE_DIR}/${stem}.<hostname>.log" >&2
  if [[ -n ${workdir} ]]; then
    workdir=${workdir%/}
    echo "# checkpoints: ${workdir}/checkpoints, TensorBoard:" \
      "${workdir}/tensorboard" >&2
    if [[ ${workdir} != gs://* ]]; then
      echo "tpu_setup.sh: warning: --workdir=${workdir} is on the workers'" \
        "own disks, which are not shared between a pod's workers and go" \
        "away with the VM; use --workdir=gs://BUCKET/..." >&2
    fi
  fi
  local script
  script="cd $(quote "${REMOTE_DIR}") && . .venv/bin/activate"
  script+=" && mkdir -p logs && nohup python -m albert_jax.main --distributed"
  script+=" $(quote_all "${ARGS[@]}") > ${log} 2>&1"
  if ((DETACH)); then
    script+=" < /dev/null &"
  else
    script+=" || { rc=\$?; echo \"\$(hostname): exit \$rc; end of ${log}:\";"
    script+=" tail -n 20 ${log}; exit \$rc; }"
  fi
  on_all_workers "${script}"
}

cmd_ssh() {
  ((${#ARGS[@]} > 0)) || die "ssh: give the command after --."
  on_all_workers "${ARGS[*]}"
}

cmd_delete() {
  execute gcloud compute tpus tpu-vm delete "${WHERE[@]}" --quiet "${ARGS[@]}"
}

case ${COMMAND} in
  create) cmd_create ;;
  install) cmd_install ;;
  run) cmd_run ;;
  ssh) cmd_ssh ;;
  delete) cmd_delete ;;
  *) die "unknown command '${COMMAND}' (create, install, run, ssh or delete)." ;;
esac
