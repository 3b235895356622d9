#!/usr/bin/env bash
# Re-runs every benchmark command recorded in BENCHMARKS.md.
#
# The commands are read from BENCHMARKS.md itself (every line in a ``` block
# that starts with "python experiments/benchmarks/", backslash continuations
# joined, each distinct command once, in file order), so this script and the
# recorded results cannot drift apart. Run it from anywhere, with the
# project's virtual environment active, on an otherwise idle machine.
#
#   experiments/benchmarks/run_all.sh              # everything (hours on CPU)
#   experiments/benchmarks/run_all.sh --dry_run    # list the commands
#   experiments/benchmarks/run_all.sh --only train_step --out /tmp/bench
#   experiments/benchmarks/run_all.sh --tables     # only the "Results" tables
#
# --tables keeps the commands of the ```results blocks: those whose output
# is a "Results" table still to be filled in (train-step and compile-time
# time on CPU: about 15 minutes on 2 cores).
#
# Each command's output goes to the terminal and to a log file in --out
# (default: $TMPDIR/albert_jax_benchmarks/<date-time>), with the machine
# description (CPU model, cores, load, date) at the top of summary.txt. A
# command whose script or input file is missing (a .py that does not exist:
# a script since folded into another, whose entry gives the command that
# replaces it, or an old masking.py to compare with) is skipped with a note.
# The exit status is 1 if any command failed.

set -euo pipefail

usage() {
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

dry_run=0
tables=0
only=""
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry_run) dry_run=1; shift ;;
    --tables) tables=1; shift ;;
    --only) only="${2:?--only needs a pattern}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "Unknown argument: $1 (see --help)." >&2; usage 2 >&2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [[ ! -f BENCHMARKS.md ]]; then
  echo "No BENCHMARKS.md in $root." >&2
  exit 2
fi

# The recorded commands, one per line.
mapfile -t commands < <(awk -v tables="$tables" '
  /^```/ {
    if (!fence) { fence = 1; take = !tables || $0 ~ /^```results/ }
    else fence = 0
    next
  }
  fence && !take { next }
  fence && pending != "" {
    line = $0; sub(/^[ \t]+/, "", line); pending = pending " " line
    if (pending ~ /\\$/) { sub(/[ \t]*\\$/, "", pending); next }
    print pending; pending = ""; next
  }
  fence && /^python experiments\/benchmarks\// {
    pending = $0
    if (pending ~ /\\$/) { sub(/[ \t]*\\$/, "", pending); next }
    print pending; pending = ""
  }' BENCHMARKS.md | awk '!seen[$0]++')

if [[ -n "$only" ]]; then
  mapfile -t commands < <(printf '%s\n' "${commands[@]}" | grep -E -- "$only" || true)
fi
if [[ ${#commands[@]} -eq 0 ]]; then
  echo "No benchmark commands found in BENCHMARKS.md${only:+ matching '$only'}." >&2
  exit 2
fi

if [[ $dry_run -eq 1 ]]; then
  printf '%s\n' "${commands[@]}"
  exit 0
fi

out="${out:-${TMPDIR:-/tmp}/albert_jax_benchmarks/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
summary="$out/summary.txt"
{
  echo "date: $(date -Iseconds)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "cores: $(nproc)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
} > "$summary"

failed=0
index=0
for command in "${commands[@]}"; do
  index=$((index + 1))
  read -r -a words <<< "$command"
  missing=""
  for word in "${words[@]:1}"; do
    if [[ "$word" == *.py && ! -e "$word" ]]; then
      missing="$word"
    fi
  done
  script="$(basename "${words[1]}" .py)"
  log="$out/$(printf '%02d' "$index")_$script.log"
  if [[ -n "$missing" ]]; then
    echo "skipped (no $missing): $command" | tee -a "$summary"
    continue
  fi
  echo "==> $command"
  start=$(date +%s)
  if bash -c "$command" 2>&1 | tee "$log"; then
    status="ok"
  else
    status="FAILED"
    failed=1
  fi
  echo "$status ($(( $(date +%s) - start )) s, log $log): $command" >> "$summary"
done

echo
cat "$summary"
exit "$failed"
