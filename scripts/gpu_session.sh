#!/usr/bin/env bash
# Every GPU check of this project in one command, results and one report in OUTDIR.
#
#   scripts/gpu_session.sh OUTDIR                       # random weights where they do not matter
#   scripts/gpu_session.sh --gguf MODEL.gguf --meta META OUTDIR   # real weights too
#   scripts/gpu_session.sh --carry CARRY OUTDIR         # what scripts/gpu_carry.py prepared
#   scripts/gpu_session.sh --device cpu --quick OUTDIR  # the same code at tiny sizes on a CPU
#
# Parts, in order (scripts/gpu_session.py says what each measures): env; tests (the tests
# marked gpu: exactness on CUDA, device acceptance, compiled static engine, host syncs);
# static (the compiled fixed-shape step, 7-8B shapes, stopped by a deadline so the whole
# run stays under ten minutes); smoke and compiled with --meta (the default model's config
# and tokenizer files); bench with --gguf (the packaged model's weights); then report
# (OUTDIR/report.md and report.json). PYTHON picks the interpreter (default python3).
# Not in the default parts: --only serving (with --gguf) runs bench-serve's local methods;
# --only quantized (with --gguf) runs bench --quantize int8 and int4, fp32 then bf16.
#
# --carry CARRY: a host with no network and no copy of the shared data. CARRY/wheels are
# installed into $STAGE/site, CARRY/meta and CARRY/data are used, and each CARRY/part-K
# is kept in $STAGE (default ~/.cache/ngram-trie-rag-gpu) until every part has come;
# then the parts are joined, checked against their sha256 and used as --gguf. Until then
# the run does what needs no real weights. --only PARTS runs just those parts (e.g. bench);
# --tests-k EXPR runs only the gpu tests that pytest's -k expression selects.
set -euo pipefail
DEVICE=cuda QUICK="" GGUF="" META="" CARRY="" ONLY="" TESTS_K="" DEADLINE=${DEADLINE:-}
while [ $# -gt 1 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --gguf) GGUF=$2; shift 2 ;;
    --meta) META=$2; shift 2 ;;
    --carry) CARRY=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --tests-k) TESTS_K=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: $0 [--device D] [--quick] [--gguf F] [--meta DIR] [--carry DIR] [--only PARTS] [--tests-k EXPR] OUTDIR" >&2; exit 2; }
OUT=$1
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DATA=()
if [ -n "$CARRY" ]; then
  STAGE=${STAGE:-$HOME/.cache/ngram-trie-rag-gpu}
  mkdir -p "$STAGE/site"
  if compgen -G "$CARRY/wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$STAGE/site" \
      "$CARRY"/wheels/*.whl
  fi
  export PYTHONPATH="$STAGE/site${PYTHONPATH:+:$PYTHONPATH}"
  export NGRAM_TRIE_RAG_CACHE=${NGRAM_TRIE_RAG_CACHE:-$STAGE/cache}
  export NGRAM_TRIE_RAG_DATA=$CARRY/data
  META=${META:-$CARRY/meta}
  DATA=(--data "$CARRY/data/spec_bench/rag.jsonl")
  for part in "$CARRY"/part-*; do
    [ -d "$part" ] || continue
    cp "$part"/model.gguf.* "$part/model.parts" "$STAGE/"
  done
  if [ -z "$GGUF" ] && [ -f "$STAGE/model.parts" ]; then
    read -r COUNT SHA < "$STAGE/model.parts"
    HAVE=$(find "$STAGE" -maxdepth 1 -name 'model.gguf.*' | wc -l)
    if [ "$HAVE" -eq "$COUNT" ]; then
      for k in $(seq 1 "$COUNT"); do cat "$STAGE/model.gguf.$k"; done > "$STAGE/model.gguf"
      echo "$SHA  $STAGE/model.gguf" | sha256sum -c --quiet - \
        || { echo "the joined GGUF does not match its sha256" >&2; exit 3; }
      GGUF=$STAGE/model.gguf
    else
      echo "model weights: $HAVE of $COUNT parts here; the real-weight parts wait for the rest"
    fi
  fi
fi
# the static part starts nothing new after DEADLINE s, leaving smoke and compiled their time
DEADLINE=${DEADLINE:-$([ -n "$META" ] && echo 330 || echo 420)}
PARTS=env,tests,static
EXTRA=()
if [ -n "$META" ]; then PARTS=$PARTS,smoke,compiled; EXTRA+=(--meta "$META"); fi
if [ -n "$GGUF" ]; then PARTS=$PARTS,bench; EXTRA+=(--gguf "$GGUF"); fi
if [ -n "$ONLY" ]; then PARTS=$ONLY; fi
# at tiny sizes one compiled shape is enough to run the code (each costs ~20 s on a CPU)
if [ -n "$QUICK" ]; then EXTRA+=(--static-runs "tiny-llama:32:4;tiny-llama+int8:32:4"); fi
"$PY" "$HERE/scripts/gpu_session.py" --out "$OUT" --device "$DEVICE" $QUICK \
  --parts "$PARTS,report" --deadline "$DEADLINE" --tests-k "$TESTS_K" ${EXTRA[@]+"${EXTRA[@]}"} \
  ${DATA[@]+"${DATA[@]}"}
echo "report: $OUT/report.md"
