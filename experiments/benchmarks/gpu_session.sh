#!/usr/bin/env bash
# One call on a lent Hopper GPU (the device tool's run): the measurements
# issue #30 asks for, each step under its own timeout and all of them under
# one deadline, results into $OUT.
#
#   run(command="GPU_SESSION_SECONDS=560 bash experiments/benchmarks/gpu_session.sh",
#       carry=[".whl"], timeout_s=600)
# GPU_SESSION_SECONDS caps the whole (default 520 s); a step that would run
# past it is cut short or skipped.
#
# Prepare here first (ml_collections is missing on the device image):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl ml_collections==1.1.0
#
# Steps, most needed first: the GPU tests (the two of right-padded rows
# first: no earlier call reached them); the albert_jax train step at
# large/512/b32 beside the same step without CUDA graphs and HF
# torch.compile; the Pallas kernels' tile sweep (backward at s2048, then
# both kernels at s512 with padded rows, cuDNN beside them); base/128/b128
# against torch.compile. Earlier calls' traces are the step breakdown's
# fixtures already; no profile is taken. It calls python3 directly (a shell
# wrapper once hung the first import) and puts the checkout on PYTHONPATH
# rather than installing it.
set -u
out=${OUT:-/tmp/gpu_session}
mkdir -p "$out"
deadline=$((SECONDS + ${GPU_SESSION_SECONDS:-520}))
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS=cuda \
  PYTHONUNBUFFERED=1
log="$out/session.log"

step() {  # step SECONDS NAME COMMAND...: run it, log it, never stop the rest
  local seconds=$1 name=$2 left=$((deadline - SECONDS))
  shift 2
  if [ "$left" -lt 20 ]; then
    echo "=== $name skipped: ${left}s left" | tee -a "$log"
    return
  fi
  [ "$seconds" -gt "$left" ] && seconds=$left
  echo "=== $name ($(date -u +%H:%M:%S), ${seconds}s)" | tee -a "$log"
  timeout "$seconds" "$@" >>"$log" 2>&1
  echo "=== $name exit $? ($(date -u +%H:%M:%S))" | tee -a "$log"
}

step 40 "jax sees the GPU" python3 -c \
  "import jax; print(jax.__version__, jax.devices()); import ml_collections"
tests="python3 -m pytest -v -p no:cacheprovider --timeout 60 tests/ops/test_flash_gpu.py"
step 70 "GPU tests: right-padded rows" $tests -k right_padded
step 70 "GPU tests: the rest" $tests -k "not right_padded"
# The step as the library compiles it, beside a row without CUDA graphs
# (an H100 trace of 2026-11-27 spent 5.7 ms updating and launching the
# step's graph before its first kernel) and torch.compile; both timings
# (blocking, pipelined).
step 200 "train step large/512/b32" python3 experiments/benchmarks/train_step.py \
  --device gpu --sizes large --seqs 512 --batch 32 --dtype bfloat16 \
  --impls jax_adamw,hf_compile --xla xla_gpu_enable_command_buffer= \
  --steps 10 --warmup 3 --json "$out/train_large.json"
step 75 "Pallas tiles: backward, s2048" python3 experiments/benchmarks/flash_gpu_blocks.py \
  --seqs 2048 --kinds bwd --seconds 60 --json "$out/blocks_2048.json"
step 100 "train step base/128/b128" python3 experiments/benchmarks/train_step.py \
  --device gpu --sizes base --seqs 128 --batch 128 --dtype bfloat16 \
  --impls jax_adamw,hf_compile --xla xla_gpu_enable_command_buffer= \
  --steps 10 --warmup 3 --json "$out/train_base.json"
step 60 "Pallas tiles: s512, padded rows" python3 experiments/benchmarks/flash_gpu_blocks.py \
  --seqs 512 --mask padded --seconds 45 --json "$out/blocks_512.json"
ls -la "$out" | tee -a "$log"
echo "done $(date -u +%H:%M:%S)" | tee -a "$log"
