#!/usr/bin/env bash
# `kvmatrix recheck` on a GPU machine (an H100 or an H200: the class is detected) where a vLLM release is staged as
# a folder (/tmp/vllm-$VERSION): every finding's script for the classes this machine runs or emulates, written for
# that release and run there, $JOBS at a time. What must come back is written to $OUT:
#   board.md        the status board as written (what README.md's board becomes), to read at once;
#   recheck.tar.xz  status.json and README.md (reports/findings/'s, updated: copy them back), scripts/ (each
#                   finding's script and issue draft as of its newest run: reports/findings/scripts/), runs/ (each
#                   script run here with its log).
# From the repository root:
#   VERSION=0.34.0 [JOBS=14] [SCRIPT_TIMEOUT=420] [PYTHON=python3] bash benchmarks/recheck_on_gpu.sh
set -uo pipefail

: "${VERSION:?the staged release, e.g. 0.34.0}" "${OUT:?the folder to fill}"
STAGED=/tmp/vllm-$VERSION
ENV_PATH=$STAGED
# cutlass reaches sys.path through a .pth file, which Python reads in site directories only
[ -d "$STAGED/nvidia_cutlass_dsl/dsl_packages" ] && ENV_PATH=$STAGED:$STAGED/nvidia_cutlass_dsl/dsl_packages
WORK=${WORK:-/tmp/kvmatrix-recheck-$VERSION}
mkdir -p "$WORK" "$OUT"
cp reports/findings/status.json reports/findings/README.md "$WORK/"

PYTHONPATH=$ENV_PATH "${PYTHON:-python3}" -m kvmatrix recheck --env "$VERSION=$ENV_PATH" --jobs "${JOBS:-14}" \
  --timeout "${SCRIPT_TIMEOUT:-420}" --out "$WORK/runs" --status "$WORK/status.json" --readme "$WORK/README.md" \
  --drafts "$WORK/scripts" --cache-dir "$WORK/cache" > "$WORK/recheck.log" 2>&1
status=$?

sed -n '/<!-- status board/,/<!-- end of board/p' "$WORK/README.md" > "$OUT/board.md"
tar cJf "$OUT/recheck.tar.xz" -C "$WORK" status.json README.md scripts runs recheck.log
echo "kvmatrix recheck exited $status; $OUT: $(ls "$OUT" | tr '\n' ' ')"
grep -E "^(bad|good|no verdict) " "$WORK/recheck.log"
exit "$status"
