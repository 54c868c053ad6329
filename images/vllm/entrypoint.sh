#!/bin/sh
# Starts vLLM's OpenAI server with the arguments the Spillway operator planned:
#   MODEL [engine flags: --tensor-parallel-size, --kv-transfer-config, --port, ...]
# A leading "vllm serve" is accepted and dropped, so the planned command works either way.
set -eu
if [ "$#" -ge 2 ] && [ "$1" = "vllm" ] && [ "$2" = "serve" ]; then
  shift 2
fi
if [ "$#" -eq 0 ]; then
  echo "spillway-vllm: no arguments; expected MODEL and vLLM engine flags (the operator supplies them)" >&2
  exit 2
fi
exec vllm serve "$@"
