#!/bin/bash
# One try of a vLLM 0.33.0 engine on the GPU machine, recorded step by step in $OUT/v33.json (+ $OUT/v33.tgz logs).
# Needs .gpu/chunks/{a33.part0,a33.part1,b33.tar.xz} (pack_v033.sh); a call carries at
# most 64 MiB, so the pieces come over two back-to-back calls (/tmp survives ~30 s between them):
#   call 1 (carry .gpu/chunks/a33.part0):                      bash bench/gpu/stage_v033.sh   -> keeps it in /tmp
#   call 2 (carry .gpu/chunks/a33.part1 .gpu/chunks/b33.tar.xz): bash bench/gpu/stage_v033.sh   -> unpacks and runs
# Steps, stopping at the first failure (each with its exit code and exception line):
#   import     `import vllm`, its version
#   modules    the platform, Triton attention backend, model runner, Llama, engine core, API server, our connector
#   serve      `vllm serve` (dummy weights, token ids, TRITON_ATTN), /health, one completion
#   connector  the same with `spillway plan --vllm-version 0.33.0`'s args and env: one store, one reload on /metrics
# Env: LIMIT (s, default 500), CONNECTOR_S (the connector step's budget, default 500), EAGER (1: --enforce-eager, default), BACKEND (default TRITON_ATTN), PLAN_FLAGS (more
# `spillway plan` flags), STEPS (default "serve connector"; a warm machine keeps /tmp/site33, so a third call with
# no carry can run STEPS=connector alone when the second ran out of time; STEPS=none stages, imports and checks the
# modules only, before `run_engines.sh` runs engines on the tree in the same call, as round 7 did).
set -uo pipefail
T0=$(date +%s); LIMIT=${LIMIT:-500}; OUT=${OUT:-/tmp/out33}; mkdir -p "$OUT"
IN=/tmp/v33in; SITE=/tmp/site33; WORK=/tmp/work33; mkdir -p $IN $WORK
RES=$WORK/steps.jsonl
kill_servers() {  # each server is its own process group (serve_bench.Server: start_new_session), engine core included
  for f in $WORK/*.pgid; do [ -f "$f" ] && kill -KILL -- -"$(cat "$f")" 2>/dev/null; rm -f "$f"; done; }
trap 'kill_servers; kill -KILL $(jobs -p) 2>/dev/null' EXIT
left() { echo $(( LIMIT - 20 - ($(date +%s) - T0) )); }
record() {  # name rc log [extra-json] [server-log]
  T0=$T0 python3 - "$@" >> $RES <<'EOF'
import json, os, re, sys, time
name, rc, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else {}


def exception_lines(p):
    try:
        lines = [l.rstrip() for l in open(p, errors="replace")]
    except OSError:
        return [], []
    # vLLM's lines: "(EngineCore pid=N) ERROR 12-01 11:19:50 [core.py:1584] AttributeError: ..."
    # a WARNING/INFO line is not the failure: round 5's "Expected one _C_extension*.so" was DeepGEMM's optional
    # import, logged as a warning by a server that went on to serve, and was reported as the connector's cause.
    # ERROR lines lose their prefix; traceback lines have none.
    lines_kept = [l for l in lines if not re.search(r"(?:^|\s)(?:WARNING|INFO|DEBUG) \S+ \S+ \[", l)]
    bare = [re.sub(r"^(?:\([^)]*pid=\d+\)\s*)?(?:ERROR \S+ \S+ \[[^\]]*\]\s*)?", "", l) for l in lines_kept]
    exc = [l for l in bare if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(:|$)", l)]
    return lines, list(dict.fromkeys(exc))


lines, exc = exception_lines(path)
out = {"step": name, "rc": rc, "seconds_since_start": int(time.time()) - int(os.environ["T0"]), **extra,
       "tail": lines[-25:]}
if rc != 0:
    out["error_line"] = exc[-1] if exc else (lines[-1] if lines else "no output")
    if rc in (124, 137):
        out["error_line"] = f"timed out (rc {rc}); last line: {lines[-1] if lines else ''}"
if len(sys.argv) > 5:
    _, engine_exc = exception_lines(sys.argv[5])
    generic = ("WorkerProc initialization failed", "Engine core initialization failed")
    out["engine_exception_lines"] = engine_exc[:8]
    root = [l for l in engine_exc if not any(g in l for g in generic)]
    if rc != 0 and root:
        out["error_line"] = root[0]  # the engine's root cause, not the "see above" line
print(json.dumps(out))
EOF
}
finish() {
  python3 - $RES "$OUT/v33.json" $(( $(date +%s) - T0 )) <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])] if open(sys.argv[1]).read().strip() else []
failed = next((s for s in steps if s["rc"] != 0), None)
if failed:
    outcome = f"failed at {failed['step']}: {failed.get('error_line')}"
elif steps and steps[-1].get("staged_only"):
    outcome = "staged only: " + steps[-1]["tail"][-1]
else:
    outcome = "ok: " + ", ".join(s["step"] for s in steps)
res = {"seconds": int(sys.argv[3]), "outcome": outcome, "steps": steps}
json.dump(res, open(sys.argv[2], "w"), indent=1)
print("V33", res["outcome"])
EOF
  tar czf $OUT/v33.tgz -C $WORK . 2>/dev/null
  echo "stage_v033 seconds: $(( $(date +%s) - T0 ))"
  exit 0
}
: > $RES

# -- stage: keep what this call carried in /tmp, unpack once all three pieces are there ---------------------
for f in a33.part0 a33.part1 b33.tar.xz; do [ -f .gpu/chunks/$f ] && cp .gpu/chunks/$f $IN/; done
[ -f /tmp/a33.part0 ] && [ ! -f $IN/a33.part0 ] && cp /tmp/a33.part0 $IN/  # where run_engines.sh keeps it
if [ ! -f $SITE/.complete ]; then
  missing=$(for f in a33.part0 a33.part1 b33.tar.xz; do [ -f $IN/$f ] || echo -n "$f "; done)
  if [ -n "$missing" ]; then
    echo "kept in $IN: $(ls $IN | tr '\n' ' '); still missing: $missing" | tee $WORK/stage.log
    record stage 0 $WORK/stage.log '{"staged_only": true}'; finish
  fi
  rm -rf $SITE && mkdir -p $SITE
  ( cat $IN/a33.part0 $IN/a33.part1 | tar -xJ -C $SITE && tar -xJf $IN/b33.tar.xz -C $SITE && touch $SITE/.complete ) \
    > $WORK/stage.log 2>&1
  rc=$?; du -sh $SITE >> $WORK/stage.log; record stage $rc $WORK/stage.log; [ $rc = 0 ] || finish
  rm -f $IN/*.part* $IN/b33.tar.xz
fi

export PYTHONPATH=$SITE:$PWD/operator:$PWD/connector VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
step() {  # name timeout-seconds command...
  local name=$1 t=$2; shift 2
  local l; l=$(left); [ "$t" -gt "$l" ] && t=$l
  if [ "$t" -lt 30 ]; then echo "no time left ($t s)" > $WORK/$name.log; record $name 124 $WORK/$name.log; finish; fi
  STEP_S=$t timeout -k 10 $t "$@" > $WORK/$name.log 2>&1; local rc=$?
  kill_servers
  record $name $rc $WORK/$name.log "$(grep -h '^V33JSON ' $WORK/$name.log | tail -1 | cut -c9-)" \
    $(ls $WORK/server-$name.log 2>/dev/null)
  [ $rc = 0 ] || finish
}

step import 90 python3 -c "
import json, sys, torch, vllm
print('V33JSON ' + json.dumps({'vllm': vllm.__version__, 'file': vllm.__file__, 'torch': torch.__version__,
                               'python': sys.version.split()[0]}))"

step modules 150 python3 -c "
import importlib, json, time
out = {}
for m in ['vllm.platforms', 'vllm._custom_ops', 'vllm.v1.attention.backends.triton_attn', 'vllm.v1.worker.gpu_worker',
          'vllm.v1.worker.gpu_model_runner', 'vllm.model_executor.models.llama', 'vllm.v1.engine.core',
          'vllm.entrypoints.openai.api_server', 'vllm.entrypoints.cli.main',
          'vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector', 'spillway_connector.connector']:
    t = time.time(); importlib.import_module(m); out[m] = round(time.time() - t, 2); print(m, out[m], flush=True)
from vllm.platforms import current_platform as p
out['platform'] = type(p).__name__; out['capability'] = str(p.get_device_capability())
print('V33JSON ' + json.dumps(out))"

# serve and connector: a server of serve_bench.py (its own process group, killed in stop()), a start budget, one
# completion by token ids; the connector run adds one store (first request) and one reload (the same prompt again).
cat > $WORK/engine.py <<'EOF'
import asyncio, json, os, signal, sys, time
from pathlib import Path
sys.path.insert(0, os.path.join(os.getcwd(), "bench", "gpu"))
import aiohttp
import serve_bench as sb
from spillway.core import vllm_api as api

mode, port = sys.argv[1], int(sys.argv[2])
budget = float(os.environ["STEP_S"]) - 15  # stop() and the record within the step's timeout
model_dir = "bench/gpu/llama-3.1-8b"
args = [api.FLAG_LOAD_FORMAT, "dummy", api.FLAG_SKIP_TOKENIZER_INIT, api.FLAG_NO_ENABLE_PREFIX_CACHING,
        api.FLAG_MAX_MODEL_LEN, "4096", "--attention-backend", os.environ.get("BACKEND", "TRITON_ATTN")]
if os.environ.get("EAGER", "1") == "1":
    args.append(api.FLAG_ENFORCE_EAGER)
env, out = {}, {"mode": mode}
if mode == "connector":
    planned = sb.spillway_plan("meta-llama/Llama-3.1-8B-Instruct", sb.node_memory(),
                               ["--vllm-version", "0.33.0", *os.environ.get("PLAN_FLAGS", "").split()])
    out["plan_command"] = planned["command"]
    args = [*planned["plan"]["vllm"]["args"], *args]
    env = dict(planned["plan"]["vllm"]["env"])
    env.setdefault(api.ENV_KV_CACHE_LAYOUT, api.CONTIGUOUS_LAYOUT)  # the plan sets it from 0.32 on; the try needs it
out.update(args=args, env=env)
server = sb.Server(model_dir, args, {**os.environ, **env}, port, Path(os.environ["WORK"]) / f"server-{mode}.log")
out["command"] = server.cmd[1:]


def on_term(*_):  # timeout(1) sends TERM, then KILL 10 s later: no time for the server's graceful stop
    if server.proc is not None:
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, on_term)


async def main() -> None:
    t_end = time.time() + budget
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        server.start()
        Path(os.environ["WORK"], f"{mode}.pgid").write_text(str(server.proc.pid))
        try:
            out["startup_s"] = round(await server.wait_ready(session, max(10.0, t_end - time.time() - 40)), 1)
            print(f"ready after {out['startup_s']} s", flush=True)
            prompt = list(range(1000, 1000 + 2048))
            m0 = await sb.scrape(session, server.url)
            async with session.post(server.url + "/v1/completions", data=sb.body(prompt, stream=False),
                                    headers={"Content-Type": "application/json"}) as r:
                text = await r.text()
                if r.status != 200:
                    raise RuntimeError(f"completion: HTTP {r.status}: {text[:300]}")
            out["completion"] = json.loads(text).get("choices", [{}])[0]
            if mode == "connector":
                settled = await sb.settle(session, server.url, list(range(5000, 5000 + sb.NUDGE)))  # store done
                out["after_store"] = sb.delta(settled, m0)
                await sb.batch(session, server.url, [prompt])                                   # the reload
                out["after_reload"] = sb.delta(await sb.scrape(session, server.url), settled)
                stored = out["after_store"].get("store_bytes", 0) > 0
                loaded = out["after_reload"].get("load_bytes", 0) > 0 or out["after_reload"].get("external_hits", 0) > 0
                out.update(stored=stored, reloaded=loaded)
                if not (stored and loaded):
                    raise RuntimeError(f"connector: stored={stored} reloaded={loaded} (see after_store/after_reload)")
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the exact error is the result
            out["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (step timeout)"
        finally:
            server.stop()
            out["engine_log"] = sb.engine_log_facts(server.log_path)


try:
    asyncio.run(main())
except KeyboardInterrupt:  # the step's timeout: say how far it got
    out.setdefault("error", f"step timeout after {budget + 15:.0f} s")
print("V33JSON " + json.dumps(out))
if "error" in out:
    print(out["error"])
    sys.exit(1)
EOF
export WORK
STEPS=${STEPS:-serve connector}
for s in $STEPS; do
  case $s in
    serve)     step serve 240 python3 $WORK/engine.py serve 8000 ;;
    connector) step connector ${CONNECTOR_S:-500} python3 $WORK/engine.py connector 8001 ;;  # a pool maps at ~1 GiB/s
  esac
done
finish
