#!/bin/sh
# Starts vLLM's OpenAI server with the arguments the Spillway operator planned:
#   MODEL [engine flags: --tensor-parallel-size, --kv-transfer-config, --port, ...]
# A leading "vllm serve" is accepted and dropped, so the planned command works either way.
#
# KV-cache layout preset: block-outermost (BLHNC), so one host-memory region holds a block's KV of all
# layers and the offloading connector copies a block with one DMA transfer. It applies when
# VLLM_KV_CACHE_LAYOUT is unset; VLLM_KV_CACHE_LAYOUT=auto leaves the choice to the attention backend.
# (It is not an image ENV: a pod cannot unset an image's variable, and `offload.layout: default` must
# get the backend's own layout.)
#
# Before vLLM starts, offload pool files that no process holds any more are removed from /dev/shm
# (stale_pools.py beside this script says why and how): a pod restarted in place keeps its /dev/shm.
# SPILLWAY_SHM_DIR names another directory to clean (tests). Where the plan put the pool on huge pages, its
# file is on the hugepages emptyDir SPILLWAY_POOL_HUGEPAGES_DIR names (spillway_connector/hugetlb_pool.py), which a
# restarted container keeps too: a stale file there holds huge pages the next pool needs.
#
# With SPILLWAY_COMPILE_CACHE_DIR (spec.compileCache: this pod's directory on a claim the replicas share),
# compile_cache.py beside this script seeds vLLM's cache root from the newest snapshot there before vLLM starts and,
# in the background, publishes the root as a snapshot once SPILLWAY_COMPILE_CACHE_READY_URL answers (the pod's
# preStop hook publishes once more), so a new pod skips torch.compile. Neither ever stops the start: a failure is
# logged and vLLM compiles as without the claim. The publisher is left to vLLM's process as parent once this shell
# becomes it; it exits after one copy, so at most one finished process waits there unreaped.
set -eu
case "${VLLM_KV_CACHE_LAYOUT:-}" in
  "") export VLLM_KV_CACHE_LAYOUT=BLHNC ;;
  auto) unset VLLM_KV_CACHE_LAYOUT ;;
esac
if [ "$#" -ge 2 ] && [ "$1" = "vllm" ] && [ "$2" = "serve" ]; then
  shift 2
fi
if [ "$#" -eq 0 ]; then
  echo "spillway-vllm: no arguments; expected MODEL and vLLM engine flags (the operator supplies them)" >&2
  exit 2
fi
here="$(dirname "$(readlink -f "$0")")"
if ! python3 "$here/stale_pools.py" "${SPILLWAY_SHM_DIR:-/dev/shm}"; then
  echo "spillway-vllm: stale pool cleanup failed (see above); starting vLLM anyway" >&2
fi
if [ -n "${SPILLWAY_POOL_HUGEPAGES_DIR:-}" ] && ! python3 "$here/stale_pools.py" "$SPILLWAY_POOL_HUGEPAGES_DIR"; then
  echo "spillway-vllm: stale pool cleanup of $SPILLWAY_POOL_HUGEPAGES_DIR failed (see above); starting vLLM anyway" >&2
fi
if [ -n "${SPILLWAY_COMPILE_CACHE_DIR:-}" ] && [ -n "${VLLM_CACHE_ROOT:-}" ]; then
  # A claim that hangs (an unreachable network volume) must not hold the start: vLLM compiles instead.
  timeout 300 python3 "$here/compile_cache.py" seed "$SPILLWAY_COMPILE_CACHE_DIR" "$VLLM_CACHE_ROOT" \
    || echo "spillway-vllm: compile cache: no seed (exit $?); vLLM compiles" >&2
  if [ -n "${SPILLWAY_COMPILE_CACHE_READY_URL:-}" ]; then
    python3 "$here/compile_cache.py" publish "$SPILLWAY_COMPILE_CACHE_DIR" "$VLLM_CACHE_ROOT" \
      --after-ready "$SPILLWAY_COMPILE_CACHE_READY_URL" &
  fi
fi
exec vllm serve "$@"
