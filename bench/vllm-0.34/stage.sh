#!/bin/bash
# Stages pack.sh's slim vLLM 0.34.0 on the GPU node, checks it, then runs engines (run34.py) on it, all recorded in
# $OUT (stage34.json: each check; run34.json: the engines; logs34.tgz: every log). A call carries at most 64 MiB, so
# the pieces come over two back-to-back calls (/tmp there survives ~30 s between them):
#   call 1, carrying .gpu/chunks34/a34.part0:                     bash bench/vllm-0.34/stage.sh    (keeps it in /tmp)
#   call 2, carrying .gpu/chunks34/{a34.part1,b34.tar.xz,METADATA-0.34.0,torch-symbols.txt,blake3-*.whl}:
#           ENGINES=stock-native-a,no-offload-a bash bench/vllm-0.34/stage.sh
# Checks, stopping at the first failure:
#   abi      every torch symbol that the kept extensions import (torch-symbols.txt, from `nm -D --undefined-only` at
#            pack time) is exported by the machine's torch (2.11.0+cu130), through ctypes
#   import   `import vllm` and the modules a dense Llama serve reaches, the platform and its capability
#   require  each Requires-Dist of 0.34.0's METADATA (no extras, markers evaluated) against what is importable now:
#            reported, not enforced (torch==2.14.0 and huggingface_hub>=2 are expected to be unmet; pack.sh says why)
# Env: LIMIT (s this call may take, default 585), ENGINES (run34.py --only; none: checks only), SPEC (engine set,
# default bench/vllm-0.34/engines.json), CALIB_REF_S (run34.py --calib-ref-s), SMOKE=1 (run34.py --smoke).
set -uo pipefail
T0=$(date +%s); LIMIT=${LIMIT:-585}; OUT=${OUT:-/tmp/out34}; mkdir -p "$OUT"
C=.gpu/chunks34; IN=/tmp/v34in; SITE=/tmp/site34; WORK=/tmp/work34; mkdir -p $IN $WORK
for f in a34.part0 a34.part1 b34.tar.xz METADATA-0.34.0 torch-symbols.txt; do [ -f $C/$f ] && cp $C/$f $IN/; done
if [ ! -f $SITE/.complete ]; then
  missing=$(for f in a34.part0 a34.part1 b34.tar.xz; do [ -f $IN/$f ] || echo -n "$f "; done)
  if [ -n "$missing" ]; then echo "kept in $IN: $(ls $IN | tr '\n' ' '); still missing: $missing"; exit 0; fi
  rm -rf $SITE && mkdir -p $SITE
  if ! ( cat $IN/a34.part0 $IN/a34.part1 | tar -xJ -C $SITE && tar -xJf $IN/b34.tar.xz -C $SITE ); then
    echo "unpack failed"; exit 1; fi
  touch $SITE/.complete; rm -f $IN/a34.part* $IN/b34.tar.xz
  echo "staged in $(( $(date +%s) - T0 )) s: $(du -sh $SITE | cut -f1)"
fi
# Wheels carried beside the pieces (pack.sh's OUTDIR/*.whl) go into the tree, each call (a warm machine keeps them).
ls $C/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target $SITE $C/*.whl 2>&1 | grep -v WARNING
# vLLM 0.34's kernel_warmup (model_executor/warmup/kernel_warmup.py) imports minimax_m3_msa_warmup on every CUDA start,
# whose imports reach `import cutlass` (nvidia-cutlass-dsl 4.8.0: a 92 MB wheel, 430 MB unpacked, not carried).
# The function itself returns at once unless the model has MiniMaxM3SparseAttention and the GPU is of capability
# family 100 (minimax_m3_msa_warmup.py, lines 83-97): on an H200 (9.0) it is a no-op for every model, so the staged
# tree ships it as one. The only change to vLLM's Python here; recorded in stage34.json.
MSA=$SITE/vllm/model_executor/warmup/minimax_m3_msa_warmup.py
if [ -f $MSA ] && ! grep -q "spillway-bench stub" $MSA; then
  printf '%s\n' '# spillway-bench stub: on capability 9.x the original returns before any work (see bench/vllm-0.34/stage.sh)' \
    'def minimax_m3_msa_warmup(worker) -> None:' '    return None' > $MSA
fi
export PYTHONPATH=$SITE:$PWD/operator:$PWD/connector VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
python3 - "$IN" "$OUT/stage34.json" <<'EOF'
import ctypes, importlib, importlib.metadata as md, json, os, re, sys, time, traceback
IN, dest = sys.argv[1], sys.argv[2]
out = {"checks": {}}
def save():
    json.dump(out, open(dest, "w"), indent=1)
def check(name, fn):
    t = time.time()
    try:
        out["checks"][name] = {"ok": True, **fn()}
    except BaseException as exc:  # noqa: BLE001 - the exact error is the result
        out["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc()[-3000:]}
    out["checks"][name]["seconds"] = round(time.time() - t, 2)
    print("STAGE34", name, json.dumps(out["checks"][name])[:1500], flush=True)
    save()
    return out["checks"][name]["ok"]

def abi():
    import torch
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    libs = [ctypes.CDLL(os.path.join(lib, n)) for n in ("libtorch_cpu.so", "libtorch_cuda.so", "libc10_cuda.so")
            if os.path.exists(os.path.join(lib, n))]
    syms = [s.strip() for s in open(os.path.join(IN, "torch-symbols.txt")) if s.strip()]
    missing = [s for s in syms if not any(hasattr(l, s) for l in libs)]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(syms)} torch symbols missing in torch {torch.__version__}: {missing}")
    return {"torch": torch.__version__, "symbols_checked": len(syms)}

def imports():
    import torch, vllm
    res = {"vllm": vllm.__version__, "vllm_file": vllm.__file__, "torch": torch.__version__,
           "python": sys.version.split()[0], "seconds": {}}
    for m in ["vllm.platforms", "vllm._custom_ops", "vllm.vllm_flash_attn", "vllm.v1.worker.gpu_worker",
              "vllm.model_executor.models.llama", "vllm.v1.engine.core", "vllm.entrypoints.openai.api_server",
              "vllm.entrypoints.cli.main", "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
              "vllm.v1.kv_offload.cpu.spec", "spillway_connector.connector"]:
        t = time.time(); importlib.import_module(m); res["seconds"][m] = round(time.time() - t, 2)
    from vllm.platforms import current_platform as p
    res.update(platform=type(p).__name__, capability=str(p.get_device_capability()))
    return res

def require():
    from packaging.requirements import Requirement
    unmet, met = [], 0
    for line in open(os.path.join(IN, "METADATA-0.34.0")):
        if not line.startswith("Requires-Dist:"):
            continue
        r = Requirement(line.split(":", 1)[1].strip())
        if r.marker and not r.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(r.name)
        except md.PackageNotFoundError:
            have = None
        if have is not None and (not r.specifier or r.specifier.contains(have, prereleases=True)):
            met += 1
        else:
            unmet.append(f"{r.name}{r.specifier} (have {have})")
    return {"met": met, "unmet": unmet}

out["stubbed"] = ["vllm/model_executor/warmup/minimax_m3_msa_warmup.py (a no-op on capability 9.x)"]
ok = check("abi", abi) and check("import", imports)
check("require", require)
sys.exit(0 if ok else 1)
EOF
rc=$?
if [ $rc = 0 ] && [ -n "${ENGINES:-}" ] && [ "${ENGINES}" != none ]; then
  LEFT=$(( LIMIT - 30 - ($(date +%s) - T0) ))
  echo "run34 deadline: $LEFT s"
  python3 bench/vllm-0.34/run34.py --spec ${SPEC:-bench/vllm-0.34/engines.json} --out $WORK --json $OUT/run34.json \
    --deadline-s $LEFT --only $ENGINES ${CALIB_REF_S:+--calib-ref-s $CALIB_REF_S} ${SMOKE:+--smoke} 2>&1 | tee $WORK/run34.log \
    | grep -v "^(\|^INFO\|^WARNING\|^\[.*\]     "
  rc=${PIPESTATUS[0]}
fi
tar czf $OUT/logs34.tgz -C $WORK --exclude='model-words' . 2>/dev/null
echo "stage34 rc $rc, seconds: $(( $(date +%s) - T0 ))"
exit $rc
