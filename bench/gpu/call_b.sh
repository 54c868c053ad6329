#!/bin/bash
# Second call, within 30 s of call_a (carry .gpu/chunks/b.tar.xz .whl): the rest of vLLM 0.26,
# the server's missing wheels, then: qualify with vLLM's own copy op, the load-path sweep, and the engines.
#   ENGINES=offload-native,no-offload  STEPS="qualify sweep serve"  bash bench/gpu/call_b.sh
#   SITE=/tmp/site33 SPEC=bench/gpu/engines-h200-r6-v33.json STEPS=serve bash bench/gpu/call_b.sh  (no carry)
set -uo pipefail
T0=$(date +%s)
LIMIT=${LIMIT:-585}  # seconds this call may take (the device allows 600)
[ -f .gpu/chunks/a33.part0 ] && cp .gpu/chunks/a33.part0 /tmp/
if [ -f .gpu/chunks/b.tar.xz ]; then  # a warm machine keeps /tmp/site from the previous call
  python3 bench/gpu/extract.py .gpu/chunks/b.tar.xz || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING
fi
# SITE=/tmp/site33 runs the engines on the vLLM 0.33.0 tree call_v33.sh staged on this warm machine
export PYTHONPATH=${SITE:-/tmp/site}:$PWD/operator:$PWD/connector VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
python3 -c "import vllm, uvicorn, aiohttp; print('vllm', vllm.__version__)" || exit 1
STEPS=${STEPS:-qualify sweep serve}
mkdir -p /tmp/work
for step in $STEPS; do
  case $step in
    v033)  # vLLM 0.33.0's main extension (stripped), in two parts: a33.part0 carried by an earlier call of
      # this session (kept in /tmp), a33.part1 by this one. Does it load on this torch?
      mkdir -p /tmp/v33 && cat /tmp/a33.part0 .gpu/chunks/a33.part1 | tar -xJ -C /tmp/v33 && \
        python3 bench/gpu/vllm033_load.py /tmp/v33 2>&1 | tee /tmp/work/vllm033.log | tail -3 ;;
    qualify)
      python3 -m spillway.qualify --methods vllm --json $OUT/qualify_vllm.json 2>/tmp/work/qualify_vllm.log ;;
    sweep)
      python3 bench/gpu/transfer_sweep.py --json $OUT/transfer_sweep.json 2>&1 | tee /tmp/work/transfer_sweep.log ;;
    serve)
      LEFT=$(( LIMIT - 25 - ($(date +%s) - T0) ))
      echo "serve_bench deadline: $LEFT s"
      python3 bench/gpu/serve_bench.py --spec ${SPEC:-bench/gpu/engines.json} --out /tmp/work --deadline-s $LEFT \
        ${ENGINES:+--only $ENGINES} 2>&1 | tee /tmp/work/serve_bench.log | grep -v "^(\|^INFO\|^WARNING" ;;
  esac
done
cp /tmp/work/serve_bench.json $OUT/ 2>/dev/null
cat /tmp/work/transfers-*/transfers-*.jsonl > /tmp/work/transfers.jsonl 2>/dev/null
# every result file and log in one archive (the device returns at most 8 files)
tar czf $OUT/results.tgz -C /tmp/work --exclude='transfers-*' --exclude='model-words' . 2>/dev/null
ls -la $OUT
echo "call_b seconds: $(( $(date +%s) - T0 ))"
