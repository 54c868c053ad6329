#!/bin/bash
# First call of a device session (carry .gpu/chunks/a.tar.xz): unpack vLLM's main extension
# into /tmp/site, record the machine, and qualify the transfer path with the methods that need no vLLM.
set -uo pipefail
T0=$(date +%s)
mkdir -p /tmp/site && python3 bench/gpu/extract.py .gpu/chunks/a.tar.xz || exit 1
export PYTHONPATH=$PWD/operator PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ; uname -r; nproc; free -g
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,memory.total --format=csv
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__)"
  python3 -c "import aiohttp; print('aiohttp', aiohttp.__version__)"
  python3 -c "import httpx; print('httpx', httpx.__version__)"
  df -h /dev/shm | tail -1
} > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
if [ "${QUALIFY:-1}" = 1 ]; then
  python3 -m spillway.qualify --methods dma,kernel --json $OUT/qualify_dma_kernel.json 2>$OUT/qualify_dma_kernel.log
fi
echo "stage_v026 seconds: $(( $(date +%s) - T0 ))"
