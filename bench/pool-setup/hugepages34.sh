#!/bin/bash
# The 64 GiB pool on 2 MiB huge pages in real vLLM 0.34 engines on the GPU node (engines34-hugepages.json), beside the
# same plan on 4 KiB pages, over back-to-back calls after vLLM 0.34's staging (bench/vllm-0.34/stage.sh, call 1):
#   HUGE=spillway-2m-first,spillway-2m-restart bash bench/pool-setup/hugepages34.sh
#   HUGE=spillway-2m-restart-2 PLAIN=spillway-4k bash bench/pool-setup/hugepages34.sh
# What the kubelet does for a pod with a hugepages-2Mi limit and a HugePages-2Mi emptyDir, done here by hand: the node's
# pages reserved (vm.nr_hugepages: PAGES, 64 GiB and 1 GiB over) and a hugetlbfs mount (pagesize=2M) where the plan's
# SPILLWAY_POOL_HUGEPAGES_DIR points. The HUGE engines run with the pages reserved; before the PLAIN ones (the plan
# without huge pages, stock) the mount is emptied and the pages handed back, since both pools at once exceed the
# node's memory. The reservation is kept between calls (the next call's HUGE engines need it; a warm node keeps it).
# Every step's output, /proc/meminfo's huge-page lines and the hugetlb cgroup's limit go to $OUT/hugepages.txt.
set -uo pipefail
T0=$(date +%s); LIMIT=${LIMIT:-585}; OUT=${OUT:-/tmp/outhp}; mkdir -p "$OUT"
MNT=$(PYTHONPATH=operator python3 -c 'from spillway.core import k8s_names as n; print(n.POOL_HUGEPAGES_MOUNT)')
PAGES=${PAGES:-33280}
SPEC=${SPEC:-bench/pool-setup/engines34-hugepages.json}
NOTE=$OUT/hugepages.txt
note() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$NOTE"; }
pages() { grep -E '^HugePages_(Total|Free|Rsvd)|^Hugepagesize|^MemFree|^Shmem:' /proc/meminfo | tr -s ' ' | tr '\n' ';'; }
reserve() {
  if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt "$PAGES" ]; then
    local t=$(date +%s%N); echo "$PAGES" > /proc/sys/vm/nr_hugepages
    note "nr_hugepages=$(cat /proc/sys/vm/nr_hugepages) of $PAGES asked, in $(( ($(date +%s%N) - t) / 1000000 )) ms"
  fi
  mkdir -p "$MNT"
  mountpoint -q "$MNT" || mount -t hugetlbfs -o pagesize=2M none "$MNT"
  note "mount: $(grep " $MNT " /proc/mounts)"
  note "cgroup: $(cat /sys/fs/cgroup/hugetlb.2MB.max 2>/dev/null || echo 'no hugetlb.2MB.max') / $(pages)"
}
release() {
  rm -f "$MNT"/vllm_offload_* /dev/shm/vllm_offload_spillway-hugepages-*
  mountpoint -q "$MNT" && umount "$MNT"
  echo 0 > /proc/sys/vm/nr_hugepages
  note "released: $(pages)"
}
stage() {  # stage.sh with its own OUT and the time this call has left
  local out=$OUT/$1 left=$(( LIMIT - ($(date +%s) - T0) - ${2:-0} ))
  note "engines $3 with $left s"
  OUT=$out LIMIT=$left SPEC=$SPEC ENGINES=$3 bash bench/vllm-0.34/stage.sh; local r=$?
  note "stage.sh rc $r: $(pages)"; return $r
}
rc=0
if [ -n "${HUGE:-}" ]; then
  reserve
  # the PLAIN engines' share of the call is kept for them: PLAIN_RESERVE_S each (a start and its load test)
  stage huge $(( $(echo "${PLAIN:-}" | tr ',' '\n' | grep -c .) * ${PLAIN_RESERVE_S:-180} )) "$HUGE" || rc=1
fi
if [ -n "${PLAIN:-}" ]; then
  release
  stage plain 0 "$PLAIN" || rc=1
fi
note "done, rc $rc"
exit $rc
