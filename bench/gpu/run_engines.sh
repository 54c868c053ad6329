#!/bin/bash
# Runs measurement steps on a GPU node whose vLLM is staged (stage_v033.sh: /tmp/site33, the default when it is
# there; or stage_v026.sh and this script's own b.tar.xz step: /tmp/site), results under $OUT:
#   bash bench/gpu/run_engines.sh                           the default engine set (bench/headline/engines.json)
#   SPEC=bench/block-size/engines.json ENGINES=v33-b64,v33-b128 bash bench/gpu/run_engines.sh
#   STEPS="pool qualify sweep serve"                        pool: pool_setup.py (64 GiB, GIB=...), no vLLM needed
# For 0.26, within 30 s of stage_v026.sh carry .gpu/chunks/b.tar.xz .whl: the rest of 0.26 and its server wheels.
# A carried py-spy wheel in .whl goes to /tmp/pyspy (an engine's "profile" names /tmp/pyspy/bin/py-spy).
set -uo pipefail
T0=$(date +%s)
# Seconds this call may take. The device stops a command at 600 s, counted from before the carried tree is
# unpacked; 540 leaves a minute for that, the engines' stop and the archive below (a staging step before this
# script in the same call passes LIMIT=$((540 - its own seconds))).
LIMIT=${LIMIT:-540}
[ -f .gpu/chunks/a33.part0 ] && cp .gpu/chunks/a33.part0 /tmp/
if [ -f .gpu/chunks/b.tar.xz ]; then  # a warm machine keeps /tmp/site from the previous call
  python3 bench/gpu/extract.py .gpu/chunks/b.tar.xz || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING
fi
if ls .whl/py_spy-*.whl >/dev/null 2>&1 && [ ! -x /tmp/pyspy/bin/py-spy ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/pyspy .whl/py_spy-*.whl 2>&1 | grep -v WARNING
fi
[ -z "${SITE:-}" ] && { [ -f /tmp/site33/.complete ] && SITE=/tmp/site33 || SITE=/tmp/site; }
export PYTHONPATH=$SITE:$PWD/operator:$PWD/connector VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
STEPS=${STEPS:-serve}
case " $STEPS " in *" serve "*|*" qualify "*|*" sweep "*)
  python3 -c "import vllm, uvicorn, aiohttp; print('vllm', vllm.__version__)" || exit 1 ;; esac
mkdir -p /tmp/work
for step in $STEPS; do
  case $step in
    pool)
      python3 bench/pool-setup/pool_setup.py --gib ${GIB:-64} --json $OUT/pool_setup.json 2>&1 | tee /tmp/work/pool_setup.log ;;
    qualify)
      python3 -m spillway.qualify --methods vllm --json $OUT/qualify_vllm.json 2>/tmp/work/qualify_vllm.log ;;
    sweep)
      python3 bench/gpu/transfer_sweep.py --json $OUT/transfer_sweep.json 2>&1 | tee /tmp/work/transfer_sweep.log ;;
    serve)
      LEFT=$(( LIMIT - 25 - ($(date +%s) - T0) ))
      echo "serve_bench deadline: $LEFT s"
      python3 bench/gpu/serve_bench.py --spec ${SPEC:-bench/headline/engines.json} --out /tmp/work --deadline-s $LEFT \
        ${ENGINES:+--only $ENGINES} 2>&1 | tee /tmp/work/serve_bench.log | grep -v "^(\|^INFO\|^WARNING" ;;
  esac
done
cp /tmp/work/serve_bench.json $OUT/ 2>/dev/null
cat /tmp/work/transfers-*/transfers-*.jsonl > /tmp/work/transfers.jsonl 2>/dev/null
# every result file and log in one archive (the device returns at most 8 files)
tar czf $OUT/results.tgz -C /tmp/work --exclude='transfers-*' --exclude='model-words' . 2>/dev/null
ls -la $OUT
echo "run_engines seconds: $(( $(date +%s) - T0 ))"
