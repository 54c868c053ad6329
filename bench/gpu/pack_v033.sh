#!/bin/bash
# Packs a Hopper-only slim vLLM 0.33.0 for a GPU node without network (bench/gpu/stage_v033.sh unpacks it), in
# pieces that each fit one 64 MiB device transfer together with the repository:
#   OUTDIR/a33.part0/1  vLLM 0.33.0's main extension (vllm/_C_stable_libtorch.abi3.so), stripped, split in two
#   OUTDIR/b33.tar.xz   its Python tree without its large extensions, plus the cp312 wheels (unpacked) of the
#                       dependencies that `vllm serve` imports and the machine lacks or has too old
#                       (its image: python 3.12, torch 2.11.0+cu130, transformers 5.17)
#   WHL/py_spy-*.whl    py-spy, for the engine-core profiles (run_engines.sh installs it to /tmp/pyspy)
# Usage (repository root; keep both folders git-ignored, about 8 minutes on two cores):
#   bash bench/gpu/pack_v033.sh .gpu/chunks .whl
#   PYV=3.11 bash bench/gpu/pack_v033.sh /tmp/b33-py311   # the same tree for a python 3.11 import check
set -euo pipefail
W=/tmp/vllm_h200; OUTDIR=${1:-$PWD/.gpu/chunks}; WHL=${2:-$PWD/.whl}; PYV=${PYV:-3.12}
mkdir -p "$OUTDIR" "$WHL" && OUTDIR=$(cd "$OUTDIR" && pwd) && WHL=$(cd "$WHL" && pwd)
WHEEL=vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
PIP_PLATFORM="--only-binary=:all: --python-version $PYV --implementation cp --platform manylinux_2_28_x86_64
 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64"
# What an engine start of a dense Llama (`vllm serve`, dummy weights, token-id prompts) imports beyond the
# machine's image, at the versions 0.33.0's metadata asks for (vllm-0.33.0.dist-info/METADATA).
PKGS="pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
 msgspec==0.23.0 pyzmq==27.3.0 pybase64==1.5.1 cachetools==8.0.2 cbor2==6.3.0 openai==3.57.0
 jiter==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 sniffio==1.3.1 truststore==0.10.5 llguidance==1.7.6 xgrammar==0.2.8
 apache-tvm-ffi==0.1.11 fastapi==0.136.3 starlette==1.10.0 partial-json-parser==0.2.1.1.post7 depyf==0.20.0
 astor==0.8.1 dill==0.4.1 setproctitle==1.3.8
 uvicorn==0.54.0 watchfiles==1.3.0 jmespath==1.1.0 model-hosting-container-standards==0.1.16
 prometheus-fastapi-instrumentator==8.1.0 python-multipart==0.0.34
 oss-harmony==0.0.11 orjson==3.13.0 compressed-tensors==0.17.0 loguru==0.7.3"
# 0.33: openai_harmony now comes from oss-harmony; orjson in the API server; the engine core imports
# compressed_tensors (and it loguru) while building the model config, which the H200 try of 2026-12-01 round 5
# met one at a time (bench/block-size/results/r5-v33-call3.json, r5-v33-call5.json)
mkdir -p $W && cd $W
[ -f $WHEEL ] || { [ -f /tmp/v33w/$WHEEL ] && cp /tmp/v33w/$WHEEL . ; } || true
[ -f $WHEEL ] || python3 -m pip download --no-deps vllm==0.33.0 -d .
rm -rf whl33-$PYV && mkdir whl33-$PYV
python3 -m pip download -q --no-deps $PIP_PLATFORM -d whl33-$PYV $PKGS
python3 -m pip download -q --no-deps $PIP_PLATFORM -d "$WHL" py-spy==0.4.1
# the main extension: its symbol tables stripped (its dynamic symbols and CUDA code stay), split for two transfers
rm -rf v33 v33raw && mkdir -p v33/vllm && unzip -q -o $WHEEL 'vllm/_C_stable_libtorch.abi3.so' -d v33raw
strip --strip-unneeded -o v33/vllm/_C_stable_libtorch.abi3.so v33raw/vllm/_C_stable_libtorch.abi3.so
(cd v33 && tar -cf - vllm/_C_stable_libtorch.abi3.so | xz -6 -T2 > "$W/a33.tar.xz")
rm -f "$OUTDIR"/a33.part*; split -b 33000000 -d -a 1 "$W/a33.tar.xz" "$OUTDIR/a33.part"
rm -rf stage33-$PYV && mkdir stage33-$PYV && cd stage33-$PYV
unzip -q ../$WHEEL -x 'vllm/_C_stable_libtorch.abi3.so'   # the main extension travels as a33.part*
# Drop what Hopper + a dense bf16 model does not need (each import is guarded or lazy; see the paths named):
rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so  # FA2 (300 MB): Hopper runs FA3. FA3 (172 MB, 8 MB in xz) stays:
#   0.33's vllm/vllm_flash_attn/__init__.py raises ImportError when neither is there, and the GPU worker imports
#   it unguarded (gpu_worker -> model_loader -> layers/attention/mm_encoder_attention -> backends/fa_utils), so
#   the H200 try of 2026-12-01 without both stopped there (bench/block-size/results/r4-v33.json)
rm -f vllm/_moe_C_stable_libtorch.abi3.so   # MoE kernels; vllm/platforms/cuda.py: suppress(ImportError)
rm -f vllm/_qutlass_C.abi3.so               # FP4 kernels; vllm/platforms/cuda.py: suppress(ImportError)
rm -f vllm/_flashmla_C.abi3.so vllm/_flashmla_extension_C.abi3.so   # MLA models; vllm/v1/attention/ops/flashmla.py
rm -f vllm/_deepselect_C.abi3.so vllm/_flashkda_C.abi3.so            # DSA / KDA models only
rm -f vllm/vllm-rs                                                   # Rust frontend binary
rm -rf vllm/third_party/deep_gemm/_C_extension.abi3.so vllm/third_party/deep_gemm/include \
  vllm/third_party/fmha_sm100/cutlass                               # DeepGEMM (FP8) and SM100 JIT headers
for w in ../whl33-$PYV/*.whl; do unzip -q -o $w; done
rm -rf *.data/scripts; rmdir *.data 2>/dev/null || true; ls -d *.data 2>/dev/null && { echo "wheel .data dirs need handling"; exit 1; } || true
find . -name __pycache__ -prune -exec rm -rf {} +
echo "largest files left:"; find . -type f -size +1M -printf '%s %p\n' | sort -n | tail -8
du -sh .
tar -cf - . | xz -9e -T2 > "$OUTDIR/b33.tar.xz"
ls -la "$OUTDIR"/b33.tar.xz "$OUTDIR"/a33.part* 2>/dev/null || ls -la "$OUTDIR"/b33.tar.xz
