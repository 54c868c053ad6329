#!/bin/bash
# Builds what the GPU machine lacks, in pieces that fit one device transfer (64 MiB each, with the tree):
#   OUTDIR/a.tar.xz     vLLM 0.26.0's main extension (53 MiB)
#   OUTDIR/b.tar.xz     the rest of a Hopper-only slim vLLM 0.26.0 + the 27 cp312 wheels it needs (25 MiB)
#   WHL/*.whl           the OpenAI server's wheels (uvicorn, ...) and py-spy (3.4 MiB)
# Usage (repository root; keep both folders git-ignored):
#   echo /.gpu/ >> .git/info/exclude; echo /.whl/ >> .git/info/exclude; bash bench/gpu/pack_v026.sh .gpu/chunks .whl
# The machine has python 3.12, torch 2.11.0+cu130 and no network; vLLM 0.26.0 is the newest release pinned to torch 2.11.
set -euo pipefail
W=/tmp/vllm_h200; OUTDIR=${1:-$PWD/.gpu/chunks}; WHL=${2:-$PWD/.whl}; mkdir -p "$OUTDIR" "$WHL"
OUTDIR=$(cd "$OUTDIR" && pwd); WHL=$(cd "$WHL" && pwd)
PIP_PLATFORM="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64"
mkdir -p $W && cd $W
[ -f vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl ] || python3 -m pip download --no-deps vllm==0.26.0 -d .
PKGS="pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
 msgspec==0.23.0 pyzmq==27.3.0 pybase64==1.5.1 cachetools==8.0.2 cbor2==6.3.0 openai-harmony==0.0.8 openai==3.57.0
 jiter==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 sniffio==1.3.1 truststore==0.10.5 llguidance==1.7.6 xgrammar==0.2.9
 apache-tvm-ffi==0.1.15.post2 fastapi==0.136.3 starlette==1.10.0 partial-json-parser==0.2.1.1.post7 depyf==0.20.0
 astor==0.8.1 dill==0.4.1 setproctitle==1.3.8"
SERVER="uvicorn==0.54.0 watchfiles==1.3.0 jmespath==1.1.0 model-hosting-container-standards==0.1.16
 prometheus-fastapi-instrumentator==8.1.0 python-multipart==0.0.34 py-spy==0.4.1"  # py-spy: engine profiles
mkdir -p whl312
python3 -m pip download -q --no-deps $PIP_PLATFORM -d whl312 $PKGS
python3 -m pip download -q --no-deps $PIP_PLATFORM -d "$WHL" $SERVER
rm -rf stage && mkdir stage && cd stage
unzip -q ../vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
# Drop what Hopper + a dense bf16 model does not need (all imports are guarded / lazy):
rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so      # FA2 (300 MB); Hopper uses FA3 (_vllm_fa3_C)
rm -f vllm/_moe_C_stable_libtorch.abi3.so            # MoE kernels; import wrapped in suppress(ImportError)
rm -f vllm/vllm-rs                                   # Rust frontend binary (VLLM_RUST_FRONTEND_PATH only)
rm -f vllm/third_party/deep_gemm/_C.cpython-31{0,1,3,4}-x86_64-linux-gnu.so
rm -rf vllm/third_party/deep_gemm/include vllm/third_party/fmha_sm100/cutlass   # JIT headers for DeepGEMM / SM100
for w in ../whl312/*.whl; do unzip -q -o $w; done
rm -rf *.data/scripts; rmdir *.data 2>/dev/null || true; ls -d *.data 2>/dev/null && { echo "wheel .data dirs need handling"; exit 1; } || true
tar -cf - vllm/_C_stable_libtorch.abi3.so | xz -9e -T2 > "$OUTDIR/a.tar.xz"
tar -cf - --exclude=vllm/_C_stable_libtorch.abi3.so . | xz -9e -T2 > "$OUTDIR/b.tar.xz"
ls -la "$OUTDIR" "$WHL"
