"""The tenants workload at 3, 1, 3, 1, 3 in flight through kv_aware (--router-temperature 0.1) over three replicas
with GPU prefix caching on (vLLM's default), so the router also hears of a prefix from the GPU BlockStored events
published in the step that computes it. Run from the repository root: .venv/bin/python <this file> OUT_DIR."""
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "connector"), str(REPO / "operator"), str(REPO / "tests")]
import routing.replicas as RP
from routing.replicas import BLOCK, DEBUG_LOG, TENANTS, kv_decisions, router, run_prefix_groups
from spillway.core import router_api as R
from spillway.core import routing
from spillway.core import vllm_api as V
from spillway_connector.host_backend import cpu_offload_args
from support import VllmServer
from support.vllm_server import free_port


def replica():
    port = free_port()
    s = VllmServer(model=RP.MODEL, num_gpu_blocks=RP.GPU_BLOCKS, block_size=BLOCK, max_model_len=RP.MAX_MODEL_LEN, max_num_seqs=2,
        prefix_caching=True, extra_args=[*cpu_offload_args(RP.POOL_CHUNKS * BLOCK * RP.MODEL.kv_bytes_per_token, extra={V.EXTRA_SELF_DESCRIBING_KV_EVENTS: True}),
        V.FLAG_KV_EVENTS_CONFIG, routing.kv_events_flag_value(port)], env={V.ENV_PYTHONHASHSEED: V.PYTHONHASHSEED_VALUE})
    s.kv_events_endpoint = f"tcp://127.0.0.1:{port}"
    return s
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
servers = [replica() for _ in range(3)]
try:
    for s in servers: s.launch()
    for s in servers: s.wait_started()
    print("up", flush=True)
    for i, conc in enumerate((3, 1, 3, 1, 3)):
        with router(servers, R.POLICY_KV_AWARE, (*R.KV_AWARE_SETTINGS, *DEBUG_LOG)) as kv:
            res = run_prefix_groups({f"g{i}c{conc}": kv}, servers, TENANTS, conc, out / f"{i}.json")
            d = kv_decisions(kv)
            shutil.copy(kv.log_path, out / f"{i}.log")
        r = res["routes"][0]
        c = {}
        for _, x in d[-r["ok"]:]: c[x] = c.get(x, 0) + 1
        print(i, conc, "cpu", round(r["cpu_hit_rate"], 3), "gpu", round(r["gpu_hit_rate"], 3), "total", round(r["cpu_hit_rate"] + r["gpu_hit_rate"], 3),
              [x["requests"] for x in r["replicas"]], dict(sorted(c.items())), flush=True)
finally:
    for s in servers: s.close()
