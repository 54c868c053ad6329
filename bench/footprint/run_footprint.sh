#!/bin/bash
# Host footprint of the offload pool, two calls of one device session:
#   call 1 (carry .gpu/chunks/a.tar.xz):  bash bench/footprint/run_footprint.sh a
#   call 2 (carry .gpu/chunks/b.tar.xz):  CASES=llama:16:v1,... bash bench/footprint/run_footprint.sh b
set -uo pipefail
T0=$(date +%s)
export PYTHONUNBUFFERED=1
case "${1:-}" in
  a)
    mkdir -p /tmp/site && python3 bench/gpu/extract.py .gpu/chunks/a.tar.xz || exit 1
    { date -u +%FT%TZ; uname -r; nproc; free -g; cat /proc/self/cgroup; ls /sys/fs/cgroup
      cat /sys/fs/cgroup/cgroup.controllers /sys/fs/cgroup/cgroup.subtree_control 2>&1
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"
      df -h /dev/shm | tail -1; } > $OUT/machine.txt 2>&1
    cat $OUT/machine.txt
    python3 bench/footprint/pinned_alloc.py --sizes-mib ${SIZES_MIB:-3072,4096,6144} --json $OUT/pinned_alloc.json ;;
  b)
    [ -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] || { echo "run step a first (machine not warm)"; exit 1; }
    python3 bench/gpu/extract.py .gpu/chunks/b.tar.xz || exit 1
    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
    python3 -c "import vllm; print('vllm', vllm.__version__)" || exit 1
    LEFT=$(( ${LIMIT:-540} - 15 - ($(date +%s) - T0) ))
    python3 bench/footprint/pool_footprint.py --cases "$CASES" --json $OUT/footprint.json --logs /tmp/work --deadline-s $LEFT
    for f in /tmp/work/footprint-*.log; do echo "== $f"; grep -E "Allocating|pinned tensor|Error|error|offload|Offload|KV cache|runner|backend" $f | grep -v "^ *File" | tail -40; done > $OUT/footprint-excerpts.txt 2>/dev/null
    tar czf $OUT/footprint-logs.tgz -C /tmp/work . ;;
  *) echo "usage: $0 a|b"; exit 2 ;;
esac
echo "seconds: $(( $(date +%s) - T0 ))"
