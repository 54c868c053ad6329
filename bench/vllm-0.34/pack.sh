#!/bin/bash
# Packs a Hopper-only slim vLLM 0.34.0 for the GPU node without network (stage.sh beside this unpacks it), in
# pieces that each fit one 64 MiB device transfer together with the repository:
#   OUTDIR/a34.part0, a34.part1  vLLM 0.34.0's main extension (vllm/_C_stable_libtorch.abi3.so), stripped, xz, split
#   OUTDIR/b34.tar.xz            its Python tree without its large extensions, plus the cp312 wheels (unpacked) of
#                                the dependencies that `vllm serve` imports and the machine lacks or has too old
# The machine's image: python 3.12, torch 2.11.0+cu130, transformers 5.17, huggingface_hub 1.33, tokenizers 0.23.2.
# 0.34.0's METADATA asks torch==2.14.0; its extensions are built on torch's stable C ABI (abi3, `aoti_torch_*` /
# `torch_*` symbols only, no C++ `at::`/`c10::` ones: `nm -D --undefined-only`), the way 0.33's ran on 2.11, so the
# machine's torch is kept and stage.sh checks every such symbol against it before anything starts.
# Usage (repository root; keep both folders git-ignored; about 8 minutes on two cores):
#   bash bench/vllm-0.34/pack.sh .gpu/chunks34
set -euo pipefail
W=/tmp/vllm34_h200; OUTDIR=${1:-$PWD/.gpu/chunks34}; PYV=${PYV:-3.12}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
WHEEL=vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
PIP_PLATFORM="--only-binary=:all: --python-version $PYV --implementation cp --platform manylinux_2_28_x86_64
 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64"
# What an engine start of a dense Llama (`vllm serve`, dummy weights) imports beyond the machine's image, at versions
# inside 0.34.0's METADATA (vllm-0.34.0.dist-info/METADATA): the 0.33 set (bench/gpu/pack_v033.sh) still satisfies
# every bound 0.34 sets (fastapi>=0.133,<0.137; openai>=2.25; orjson>=3.11.6; pydantic>=2.12; starlette>=1.0.1;
# model-hosting-container-standards>=0.1.14,<1; depyf, compressed-tensors, xgrammar, apache-tvm-ffi pinned alike).
# New: tokenizers>=0.23.3 (the image has 0.23.2; transformers 5.17 accepts <0.24). Not carried, on purpose:
#   huggingface_hub>=2.0.0  transformers 5.17 requires huggingface-hub<2.0 and checks it at import
#                           (transformers/dependency_versions_check.py), so hub 2 would stop the model config load;
#                           the image's 1.33 stays (weights are dummy, the model directory is local)
#   torch==2.14.0 and its torchvision/torchaudio/flashinfer/cutlass-dsl/tilelang/... kernels: see above; dense bf16
#                           Llama on Hopper imports none of the kernel packages (each import is lazy or guarded)
#   opentelemetry-*         vllm/tracing/otel.py: guarded by `except ImportError`
PKGS="pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
 msgspec==0.23.0 pyzmq==27.3.0 pybase64==1.5.1 cachetools==8.0.2 cbor2==6.3.0 openai==3.57.0
 jiter==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 sniffio==1.3.1 truststore==0.10.5 llguidance==1.7.6 xgrammar==0.2.8
 apache-tvm-ffi==0.1.11 fastapi==0.136.3 starlette==1.10.0 partial-json-parser==0.2.1.1.post7 depyf==0.20.0
 astor==0.8.1 dill==0.4.1 setproctitle==1.3.8
 uvicorn==0.54.0 watchfiles==1.3.0 jmespath==1.1.0 model-hosting-container-standards==0.1.16
 prometheus-fastapi-instrumentator==8.1.0 python-multipart==0.0.34
 oss-harmony==0.0.11 orjson==3.13.0 compressed-tensors==0.17.0 loguru==0.7.3 tokenizers==0.23.3"
mkdir -p $W && cd $W
[ -f $WHEEL ] || { [ -f /tmp/v34w/$WHEEL ] && cp /tmp/v34w/$WHEEL . ; } || true
[ -f $WHEEL ] || python3 -m pip download --no-deps vllm==0.34.0 -d .
unzip -p $WHEEL vllm-0.34.0.dist-info/METADATA > "$OUTDIR/METADATA-0.34.0"   # stage.sh reports each bound there
# blake3 (0.34's METADATA asks it; the connector's chunk integrity imports it) travels as a wheel beside the pieces,
# stage.sh installs OUTDIR/*.whl into the staged tree: it was found missing after b34.tar.xz was first packed
python3 -m pip download -q --no-deps $PIP_PLATFORM -d "$OUTDIR" blake3==1.0.11
rm -rf whl34-$PYV && mkdir whl34-$PYV
python3 -m pip download -q --no-deps $PIP_PLATFORM -d whl34-$PYV $PKGS
# the main extension: its symbol tables stripped (its dynamic symbols and CUDA code stay), split for two transfers
rm -rf v34 v34raw && mkdir -p v34/vllm && unzip -q -o $WHEEL 'vllm/_C_stable_libtorch.abi3.so' -d v34raw
strip --strip-unneeded -o v34/vllm/_C_stable_libtorch.abi3.so v34raw/vllm/_C_stable_libtorch.abi3.so
(cd v34 && tar -cf - vllm/_C_stable_libtorch.abi3.so | xz -6 -T2 > "$W/a34.tar.xz")
# part0 large (it travels with the repository alone), part1 small (it travels beside b34.tar.xz)
rm -f "$OUTDIR"/a34.part*; split -b 50000000 -d -a 1 "$W/a34.tar.xz" "$OUTDIR/a34.part"
rm -rf stage34-$PYV && mkdir stage34-$PYV && cd stage34-$PYV
unzip -q ../$WHEEL -x 'vllm/_C_stable_libtorch.abi3.so'   # the main extension travels as a34.part*
# Drop what Hopper + a dense bf16 model does not need (0.34.0's guards, as in 0.33):
rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so  # FA2: Hopper runs FA3, which stays (vllm/vllm_flash_attn/__init__.py
#                                                 raises ImportError only when neither is there)
rm -f vllm/_moe_C_stable_libtorch.abi3.so       # MoE kernels; vllm/platforms/cuda.py: contextlib.suppress(ImportError)
rm -f vllm/_flashmla_C.abi3.so vllm/_flashmla_extension_C.abi3.so   # MLA models
rm -f vllm/_deepselect_C.abi3.so vllm/_flashkda_C.abi3.so            # DSA / KDA models
rm -f vllm/vllm-rs                                                   # Rust frontend binary
rm -rf vllm/third_party/deep_gemm/_C_extension.abi3.so vllm/third_party/deep_gemm/include \
  vllm/third_party/fmha_sm100/cutlass                               # DeepGEMM (FP8) and SM100 JIT headers
# every torch symbol the kept extensions import, for stage.sh's check against the machine's torch
(nm -D --undefined-only ../v34raw/vllm/_C_stable_libtorch.abi3.so; find vllm -name '*.so' -exec nm -D --undefined-only {} +) \
  | awk '{print $2}' | grep -E '^(aoti_|torch_)' | sort -u > "$OUTDIR/torch-symbols.txt"
for w in ../whl34-$PYV/*.whl; do unzip -q -o $w; done
rm -rf *.data/scripts; rmdir *.data 2>/dev/null || true; ls -d *.data 2>/dev/null && { echo "wheel .data dirs need handling"; exit 1; } || true
find . -name __pycache__ -prune -exec rm -rf {} +
echo "largest files left:"; find . -type f -size +1M -printf '%s %p\n' | sort -n | tail -8
du -sh .
tar -cf - . | xz -9e -T2 > "$OUTDIR/b34.tar.xz"
ls -la "$OUTDIR"
