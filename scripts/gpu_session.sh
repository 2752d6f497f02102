#!/usr/bin/env bash
# Every GPU check of this project in one command, results and one report in OUTDIR.
#
#   scripts/gpu_session.sh OUTDIR                       # random weights where they do not matter
#   scripts/gpu_session.sh --gguf MODEL.gguf --meta META OUTDIR   # real weights too
#   scripts/gpu_session.sh --device cpu --quick OUTDIR  # the same code at tiny sizes on a CPU
#
# Parts, in order (scripts/gpu_session.py says what each measures): env; tests (the tests
# marked gpu: exactness on CUDA, device acceptance, compiled static engine, host syncs);
# static (the compiled fixed-shape step, 7-8B shapes, stopped by a deadline so the whole
# run stays under ten minutes); smoke and compiled with --meta (the default model's config
# and tokenizer files); bench with --gguf (the packaged model's weights); then report
# (OUTDIR/report.md and report.json). PYTHON picks the interpreter (default python3).
set -euo pipefail
DEVICE=cuda QUICK="" GGUF="" META="" DEADLINE=${DEADLINE:-420}
while [ $# -gt 1 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --gguf) GGUF=$2; shift 2 ;;
    --meta) META=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: $0 [--device D] [--quick] [--gguf F] [--meta DIR] OUTDIR" >&2; exit 2; }
OUT=$1
HERE=$(cd "$(dirname "$0")/.." && pwd)
PARTS=env,tests,static
EXTRA=()
if [ -n "$META" ]; then PARTS=$PARTS,smoke,compiled; EXTRA+=(--meta "$META"); fi
if [ -n "$GGUF" ]; then PARTS=$PARTS,bench; EXTRA+=(--gguf "$GGUF"); fi
# at tiny sizes one compiled shape is enough to run the code (each costs ~20 s on a CPU)
if [ -n "$QUICK" ]; then EXTRA+=(--static-runs "tiny-llama:32:4"); fi
"${PYTHON:-python3}" "$HERE/scripts/gpu_session.py" --out "$OUT" --device "$DEVICE" $QUICK \
  --parts "$PARTS,report" --deadline "$DEADLINE" ${EXTRA[@]+"${EXTRA[@]}"}
echo "report: $OUT/report.md"
