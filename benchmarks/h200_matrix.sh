#!/usr/bin/env bash
# The whole default matrix on one H200, timed, within one call of at most 10 minutes each: the cold run (a fresh
# machine, empty caches) and the warm run (the same machine right after, caches kept). Run from the repository
# root with a staged vLLM; everything that must come back is written to $OUT.
#
#   bash benchmarks/h200_matrix.sh cold /tmp/vllm-0.34.0   # a second call with the same words resumes a cold run
#                                                          # its time limit stopped, on the same caches
#   bash benchmarks/h200_matrix.sh warm /tmp/vllm-0.34.0   # the next call, the same machine
#
# LIMIT_S (default 560) bounds the run inside the call; EXTRA_PYTHONPATH adds folders (lm-eval's, where carried);
# GPU (default H200), RUN_ARGS (e.g. "--case ct-llama"), ROOT and PYTHON try the script elsewhere (another class,
# a few cells, another folder, another interpreter).
# $OUT receives: RUN.log (the run's output and how long it took), RUN.tar.xz (its run folder: records and cell
# logs), phases.txt (benchmarks/h200_phases.py over the runs so far, with their verdicts against the cold run's),
# RUN-scaling.txt (benchmarks/h200_scaling.py over this run).
set -u
run=${1:?cold or warm}
vllm=${2:?the staged vLLM folder}
case $run in cold|warm) ;; *) echo "cold or warm, not $run" >&2; exit 2 ;; esac
root=${ROOT:-/tmp/kvm-h200-matrix}
py=${PYTHON:-python3}
runs=$root/runs
cache=$root/cache
export PYTHONPATH=$vllm:$vllm/nvidia_cutlass_dsl/dsl_packages:$PWD${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p "$runs" "$OUT"
if [ "$run" = cold ] && [ ! -e "$runs/cold" ]; then
  rm -rf "$cache"  # a cold run starts on empty caches; a resumed one keeps what its first call compiled
fi
if [ "$run" = warm ] && [ ! -e "$runs/cold" ]; then
  echo "no cold run in $runs on this machine: the warm run needs its caches" >&2
  exit 2
fi
nproc > "$OUT/$run.log"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/$run.log" 2>&1
started=$(date +%s)
# SIGTERM at the limit: the harness kills its cells and keeps every finished record, so the same command resumes.
# shellcheck disable=SC2086  # RUN_ARGS is words
timeout "${LIMIT_S:-560}" "$py" -m kvmatrix run --gpu "${GPU:-H200}" --run-id "$run" --runs-dir "$runs" \
  --cache-dir "$cache" --db "$root/no-history.sqlite" ${RUN_ARGS:-} >> "$OUT/$run.log" 2>&1
echo "kvmatrix run exited $? after $(( $(date +%s) - started )) s" >> "$OUT/$run.log"
done_runs=$(for r in cold warm; do [ -e "$runs/$r" ] && printf '%s ' "$runs/$r"; done)
"$py" benchmarks/h200_phases.py $done_runs --same-as "$runs/cold" > "$OUT/phases.txt" 2>&1
"$py" benchmarks/h200_scaling.py "$runs/$run" > "$OUT/$run-scaling.txt" 2>&1
tar -cJf "$OUT/$run.tar.xz" -C "$runs" "$run"
tail -n 3 "$OUT/$run.log"
