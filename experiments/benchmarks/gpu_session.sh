#!/usr/bin/env bash
# One call on a lent Hopper GPU (the device tool's run): the measurements
# issue #30 asks for, each step under its own timeout, results into $OUT.
#
#   run(command="bash experiments/benchmarks/gpu_session.sh", carry=[".whl"],
#       timeout_s=590)
#
# Prepare here first (ml_collections is missing on the device image):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl ml_collections==1.1.0
#
# Steps: the albert_jax train step against HF torch.compile at the two
# shapes of BENCHMARKS.md (large/512/b32, base/128/b128), a profile of the
# large step (its trace and summary.md come back for a parser fixture), the
# attention benchmark with and without padding, and the GPU tests (the
# Mosaic GPU kernels, cuDNN's padding mask from row lengths). It calls
# python3 directly (a shell wrapper once hung the first import) and puts
# the checkout on PYTHONPATH rather than installing it.
set -u
out=${OUT:-/tmp/gpu_session}
mkdir -p "$out"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS=cuda \
  PYTHONUNBUFFERED=1
log="$out/session.log"

step() {  # step SECONDS NAME COMMAND...: run it, log it, never stop the rest
  local seconds=$1 name=$2
  shift 2
  echo "=== $name ($(date -u +%H:%M:%S))" | tee -a "$log"
  timeout "$seconds" "$@" >>"$log" 2>&1
  echo "=== $name exit $?" | tee -a "$log"
}

step 60 "jax sees the GPU" python3 -c \
  "import jax; print(jax.__version__, jax.devices())"
step 150 "train step large/512/b32" python3 experiments/benchmarks/train_step.py \
  --device gpu --sizes large --seqs 512 --batch 32 --dtype bfloat16 \
  --impls jax_adamw,hf_compile --steps 10 --warmup 3 \
  --json "$out/train_large.json"
step 120 "train step base/128/b128" python3 experiments/benchmarks/train_step.py \
  --device gpu --sizes base --seqs 128 --batch 128 --dtype bfloat16 \
  --impls jax_adamw,hf_compile --steps 10 --warmup 3 \
  --json "$out/train_base.json"
step 90 "profile large/512/b32" python3 experiments/benchmarks/train_step.py \
  --device gpu --sizes large --seqs 512 --batch 32 --dtype bfloat16 \
  --impls jax_adamw --steps 3 --warmup 2 --profile /tmp/profile
find /tmp/profile -name '*.xplane.pb' -exec cp {} "$out/large.xplane.pb" \; \
  2>/dev/null
find /tmp/profile -name 'summary.md' -exec cp {} "$out/profile_summary.md" \; \
  2>/dev/null
step 90 "attention" python3 experiments/benchmarks/attention.py \
  --json "$out/attention.json"
step 60 "attention, padded rows" python3 experiments/benchmarks/attention.py \
  --mask padded --json "$out/attention_padded.json"
step 90 "GPU tests" python3 -m pytest -q -p no:cacheprovider \
  tests/ops/test_flash_gpu.py tests/ops/test_attention.py -k "gpu or cudnn"
echo "done $(date -u +%H:%M:%S)" | tee -a "$log"
