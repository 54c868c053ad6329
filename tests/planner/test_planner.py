"""Pool sizing: invariants over random nodes, models and requests, and the errors that name the numbers."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from spillway.adapters.model_config import catalog_ids, geometry_of, resolve_geometry
from spillway.core import footprint as fp
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec, ModelGeometryUnknown, NoEligibleNodes, PoolDoesNotFit, SpillwayError
from spillway.core.geometry import DEFAULT_BLOCK_SIZE, ModelGeometry, geometry_from_config
from spillway.core.planner import (
    ENGINE_START_SECONDS,
    SHM_EXTRA_BYTES,
    NodeFacts,
    OffloadRequest,
    ServingRequest,
    is_multimodal,
    plan,
    process_reserve,
)
from spillway.core.quantity import parse_size

GiB = 2**30
MiB = 2**20
LLAMA_8B = resolve_geometry("meta-llama/Llama-3.1-8B-Instruct")
H100_NODE = NodeFacts(2 * 2**40, 8, "gpu-node-1")


def request(size="auto", tp=1, block_size=DEFAULT_BLOCK_SIZE, **offload):
    return ServingRequest(tensor_parallel_size=tp, block_size=block_size, offload=OffloadRequest(size=size, **offload))


standard_geometry = st.builds(
    lambda layers, kv, head_dim, dtype: ModelGeometry("random", "LlamaForCausalLM", layers, "standard", kv, 64,
                                                       head_dim, dtype),
    st.integers(1, 160), st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from([64, 96, 128, 256]),
    st.sampled_from(["bfloat16", "float16"]),
)
mla_geometry = st.builds(
    lambda layers, latent: ModelGeometry("random-mla", "DeepseekV3ForCausalLM", layers, "mla", 1, 128, latent,
                                         "bfloat16"),
    st.integers(1, 128), st.sampled_from([576, 1088]),
)
sliding_geometry = st.builds(
    lambda layers, period, window, kv, head_dim: geometry_from_config({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": layers,
        "num_attention_heads": 64, "num_key_value_heads": kv, "head_dim": head_dim, "sliding_window": window,
        "layer_types": ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)],
        "max_position_embeddings": 131072}),
    st.integers(2, 96), st.integers(2, 8), st.sampled_from([128, 512, 1024, 4096]), st.sampled_from([1, 2, 8, 16]),
    st.sampled_from([64, 128, 256]),
)
mamba_geometry = st.builds(
    lambda groups, interval, v_heads, dim: geometry_of({  # transformers derives layer_types from the interval
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_hidden_layers": groups * interval,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": interval,
        "linear_num_key_heads": 16, "linear_num_value_heads": v_heads, "linear_key_head_dim": dim,
        "linear_value_head_dim": dim, "linear_conv_kernel_dim": 4, "max_position_embeddings": 262144}),
    st.integers(1, 16), st.integers(2, 6), st.sampled_from([16, 32, 64]), st.sampled_from([64, 128]),
)
geometries = st.one_of(standard_geometry, mla_geometry, sliding_geometry, mamba_geometry,
                       st.sampled_from(catalog_ids()).map(resolve_geometry))
nodes = st.builds(NodeFacts, st.integers(8 * GiB, 8 * 2**40), st.sampled_from([1, 2, 4, 8, 16]))
sizes = st.one_of(
    st.just("auto"),
    st.floats(0.01, 1.0).map(lambda f: f"{f:.3f}"),
    st.integers(1, 4 * 2**40).map(str),
    st.integers(1, 4096).map(lambda n: f"{n}Gi"),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(geometries, nodes, sizes, st.sampled_from([1, 2, 4, 8]), st.sampled_from([16, 32, 64]),
       st.sampled_from(["auto", "fp8"]), st.sampled_from(["0.26.0", "0.32.0", "0.33.0"]),
       st.sampled_from(["contiguous", "default"]), st.data())
def test_plan_invariants(geometry, node, size, tp, block_size, cache_dtype, version, layout, data):
    assume(geometry.num_attention_heads % tp == 0 and tp <= node.gpus)
    assume(geometry.attention == "mla" or geometry.num_kv_heads % tp == 0 or tp % geometry.num_kv_heads == 0)
    replicas = data.draw(st.one_of(st.none(), st.integers(1, node.gpus // tp)))
    req = ServingRequest(tp, block_size, cache_dtype, replicas, OffloadRequest(size=size, layout=layout),
                         vllm_version=version)
    try:
        result = plan(geometry, req, node)
    except (InvalidSpec, ModelGeometryUnknown) as exc:
        # a release that cannot offload the family, or heads/state that do not split over TP: said in one line
        assert "\n" not in str(exc) and geometry.config is not None
        return
    except PoolDoesNotFit as exc:
        # Refusals only ever come with numbers in them.
        assert any(ch.isdigit() for ch in str(exc))
        return
    pool, pod, node_plan = result.pool, result.pod, result.node
    # the pod's limit holds the pool's measured footprint and the vLLM process
    assert pool.footprint_bytes >= pool.bytes
    assert pod.memory_limit_bytes >= pool.footprint_bytes + SHM_EXTRA_BYTES + process_reserve(tp)
    assert pod.memory_request_bytes == pod.memory_limit_bytes
    # /dev/shm holds what the pool occupies there (0.32+: the whole mmap region; 0.26: nothing)
    assert pod.shm_bytes >= pool.shm_pool_bytes + SHM_EXTRA_BYTES
    assert pod.memory_limit_bytes >= pod.shm_bytes  # /dev/shm pages are charged to the pod
    # all replicas on the node fit in allocatable memory
    assert node_plan.replicas_per_node * pod.memory_limit_bytes <= node.allocatable_memory
    # the pool is whole chunks and never exceeds what was asked for
    assert pool.chunks >= 1 and pool.bytes == pool.chunks * pool.chunk_bytes
    # with a full-attention group a chunk row never holds more than its chunk of prefix (a uniform model's rows
    # all do); windowed groups alone keep only the window's rows of each request
    held = pool.blocks * result.groups.block_size
    unbounded = any(result.groups.window_chunks(g) is None for g in result.groups.groups)
    if not result.groups.is_hybrid:
        assert pool.tokens == held
    else:
        assert 0 <= pool.tokens <= (held if unbounded else pool.chunks * (geometry.max_model_len or 131072))
    if size.endswith("Gi") or size.isdigit():
        asked = int(size[:-2]) * GiB if size.endswith("Gi") else int(size)
        assert asked - pool.chunk_bytes < pool.bytes <= asked  # rounded down by less than one chunk, never shrunk
    # the vLLM args carry exactly the planned pool
    config = json.loads(result.args[result.args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1])
    assert config["kv_connector_extra_config"][api.EXTRA_CPU_BYTES] == pool.bytes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(geometries, nodes, sizes, st.sampled_from([1, 2, 4, 8]), st.sampled_from(["0.33.0", "0.34.0"]),
       st.floats(0, 1.5), st.data())
def test_plan_invariants_with_huge_pages(geometry, node, size, tp, version, fraction, data):
    """The pool on hugepages-2Mi (footprint.pool_pages): whole 2 MiB pages of rows within the replica's share, out
    of the memory limit and /dev/shm; else the pod planned without them. `auto` fills the share, a fraction that
    fraction of it, where it holds at least the memory share's pool (footprint.place_pool)."""
    assume(geometry.num_attention_heads % tp == 0 and tp <= node.gpus)
    assume(geometry.attention == "mla" or geometry.num_kv_heads % tp == 0 or tp % geometry.num_kv_heads == 0)
    replicas = data.draw(st.one_of(st.none(), st.integers(1, node.gpus // tp)))
    req = ServingRequest(tp, DEFAULT_BLOCK_SIZE, "auto", replicas, OffloadRequest(size=size), vllm_version=version)
    hugepages = int(fraction * node.allocatable_memory)  # beside the memory, a share of it at most 1.5x
    huge_node = NodeFacts(node.allocatable_memory, node.gpus, hugepages_2mi=hugepages)
    try:
        plain = plan(geometry, req, node)
    except PoolDoesNotFit:
        _only_huge_pages_hold_it(geometry, req, huge_node, size)
        return
    except SpillwayError:
        return
    result = plan(geometry, req, huge_node)
    pool, pod, pages = result.pool, result.pod, result.pages
    event(f"huge pages: {pages.huge_pages}")
    if not pages.huge_pages:
        assert pod == plain.pod and pool == plain.pool and pod.hugepages_bytes == 0
        return
    step = 2 * MiB // math.gcd(pool.chunk_bytes, 2 * MiB)
    assert pool.bytes % (2 * MiB) == 0 and pool.bytes == pool.chunks * pool.chunk_bytes
    kind, value = parse_size(size, "size")
    if kind != "bytes" and pool.chunks >= plain.pool.chunks:
        event(f"{kind} on the huge pages' share")
        more = fp.huge_page_footprint(result.groups.release, pool.bytes + step * pool.chunk_bytes, tp).charged_bytes
        # as large as the share (auto) or the fraction of it allows, unless the memory share cannot hold a step more
        # of page tables
        target = int((value or 1.0) * pages.share_bytes) // (2 * MiB) * (2 * MiB)
        assert pool.bytes + step * pool.chunk_bytes > target or \
            more > result.node.share_bytes - result.node.fixed_bytes
    else:
        assert plain.pool.chunks - step < pool.chunks <= plain.pool.chunks  # whole pages, at most a step of rows less
    assert pod.hugepages_bytes == pool.bytes <= pages.share_bytes <= hugepages // result.node.replicas_per_node
    assert result.node.replicas_per_node * pod.memory_limit_bytes <= node.allocatable_memory
    assert pool.shm_pool_bytes == 0 and pod.shm_bytes == SHM_EXTRA_BYTES
    assert pod.memory_limit_bytes >= pool.footprint_bytes + SHM_EXTRA_BYTES + pod.process_reserve_bytes
    assert pod.memory_limit_bytes < plain.pod.memory_limit_bytes
    assert result.env[api.ENV_POOL_HUGEPAGES_DIR]
    config = json.loads(result.args[result.args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1])
    assert config["kv_connector_extra_config"][api.EXTRA_CPU_BYTES] == pool.bytes


def _only_huge_pages_hold_it(geometry, req, node, size):
    """A request the memory share refuses: refused on huge pages too, or on them within their share, its page tables
    in the memory limit, and a quantity kept to whole pages of its rows."""
    try:
        result = plan(geometry, req, node)
    except SpillwayError:
        return
    event("only huge pages hold it")
    pool, pod, pages = result.pool, result.pod, result.pages
    assert pages.huge_pages and pod.hugepages_bytes == pool.bytes <= pages.share_bytes
    assert result.node.replicas_per_node * pod.memory_limit_bytes <= node.allocatable_memory
    assert pod.memory_limit_bytes >= pool.footprint_bytes + SHM_EXTRA_BYTES + pod.process_reserve_bytes
    figures = result.node
    assert figures.max_pool_bytes == max(figures.max_memory_pool_bytes, figures.max_hugepage_pool_bytes)
    assert figures.max_hugepage_pool_bytes >= pool.bytes
    kind, value = parse_size(size, "size")
    if kind == "bytes":
        step = 2 * MiB // math.gcd(pool.chunk_bytes, 2 * MiB)
        asked = int(value) // pool.chunk_bytes
        assert asked - step < pool.chunks <= asked


def test_llama_8b_on_an_8_gpu_node():
    result = plan(LLAMA_8B, request(), H100_NODE)
    assert result.layout.block_size == 64 and result.layout.block_bytes == 8 * 2**20  # the planner's default block
    assert result.node.replicas_per_node == 8
    assert result.pool.blocks == result.pool.bytes // (8 * 2**20)
    assert result.pool.tokens == result.pool.blocks * 64
    assert plan(LLAMA_8B, request(block_size=16), H100_NODE).layout.block_bytes == 2 * 2**20  # the source's figure
    assert result.env == {api.ENV_KV_CACHE_LAYOUT: api.CONTIGUOUS_LAYOUT}
    assert 8 * result.pod.memory_limit_bytes <= H100_NODE.allocatable_memory


def test_explicit_request_that_cannot_fit_names_the_numbers():
    with pytest.raises(PoolDoesNotFit) as exc:
        plan(LLAMA_8B, request("240Gi"), H100_NODE)  # 8 replicas share 2 TiB: 243 GiB each, 15 GiB of it the process
    message = str(exc.value)
    assert "240Gi" in message and "largest pool that fits is 227.7 GiB" in message and "/dev/shm" in message


def test_explicit_request_that_fits_is_kept_exactly():
    result = plan(LLAMA_8B, request("100Gi"), H100_NODE)
    assert result.pool.bytes == 100 * GiB  # 2 MiB chunks divide 100 GiB
    assert result.pool.gib == 100.0
    native = plan(LLAMA_8B, request("100Gi", connector="native"), H100_NODE)
    assert native.args[-4:] == [api.FLAG_KV_OFFLOADING_BACKEND, "native", api.FLAG_KV_OFFLOADING_SIZE, "100.0"]


def test_fraction_is_of_the_replica_share():
    half = plan(LLAMA_8B, request("0.5"), H100_NODE)
    full = plan(LLAMA_8B, request("auto"), H100_NODE)
    assert half.pod.memory_limit_bytes == pytest.approx(0.5 * half.node.share_bytes, rel=0.01)
    assert full.pool.bytes > 2 * half.pool.bytes > 0
    with pytest.raises(PoolDoesNotFit, match="smallest fraction"):
        plan(LLAMA_8B, request("0.01"), H100_NODE)


def test_pool_smaller_than_one_block_is_an_error():
    with pytest.raises(PoolDoesNotFit, match="smaller than one offload block"):
        plan(LLAMA_8B, request("1Mi"), H100_NODE)


def test_mla_pool_is_deduplicated_across_ranks():
    geometry = resolve_geometry("deepseek-ai/DeepSeek-V3")
    result = plan(geometry, request("100Gi", tp=8), H100_NODE)
    assert result.pool.copies == 1
    llama70 = plan(resolve_geometry("meta-llama/Llama-3.1-70B-Instruct"), request("100Gi", tp=4), H100_NODE)
    assert llama70.pool.copies == 4 and llama70.pool.chunk_bytes == 4 * llama70.layout.block_bytes


def test_offload_block_size_sets_chunks():
    result = plan(LLAMA_8B, request("10Gi", offload_block_size=256), H100_NODE)
    assert result.pool.chunk_bytes == 4 * 8 * 2**20  # four 64-token blocks of 8 MiB
    assert result.pool.blocks == result.pool.chunks * 4
    with pytest.raises(InvalidSpec, match="multiple of the block size"):
        plan(LLAMA_8B, request(offload_block_size=40), H100_NODE)
    # a chunk written for vLLM's 16-token block says how to keep it
    with pytest.raises(InvalidSpec, match="16-token chunk needs a block size that divides it"):
        plan(LLAMA_8B, request(offload_block_size=16), H100_NODE)
    assert plan(LLAMA_8B, request("10Gi", block_size=16, offload_block_size=16), H100_NODE).pool.chunk_bytes == 2 * 2**20


@pytest.mark.parametrize("node,req,error,message", [
    (NodeFacts(512 * GiB, 0), request(), NoEligibleNodes, "0 GPUs"),
    (NodeFacts(512 * GiB, 4), request(tp=8), NoEligibleNodes, "needs 8 GPUs"),
    (NodeFacts(16 * GiB, 8), request(), PoolDoesNotFit, "vLLM process alone needs"),
    (H100_NODE, ServingRequest(replicas_per_node=9), InvalidSpec, "replicas per node must be 1..8"),
    (H100_NODE, request("1.5"), InvalidSpec, "offload size"),
    (H100_NODE, request("lots"), InvalidSpec, "expected a quantity"),
    (H100_NODE, request("-5Gi"), InvalidSpec, "expected a quantity"),
    (H100_NODE, request(eviction_policy="fifo"), InvalidSpec, "eviction policy"),
    (H100_NODE, request(layout="zigzag"), InvalidSpec, "layout"),
])
def test_bad_input_is_a_clear_error(node, req, error, message):
    with pytest.raises(error, match=message) as exc:
        plan(LLAMA_8B, req, node)
    assert isinstance(exc.value, SpillwayError)


def test_offload_disabled_plans_the_process_only():
    result = plan(LLAMA_8B, ServingRequest(offload=OffloadRequest(enabled=False)), H100_NODE)
    assert result.pool is None and api.FLAG_KV_TRANSFER_CONFIG not in result.args
    assert result.pod.memory_limit_bytes >= process_reserve(1)
    assert result.env == {}


def test_the_startup_budget_grows_with_the_pool_the_engine_sets_up_before_it_serves():
    without = plan(LLAMA_8B, ServingRequest(offload=OffloadRequest(enabled=False)), H100_NODE).pod
    assert without.startup_seconds == ENGINE_START_SECONDS
    small = plan(LLAMA_8B, request(size="64Gi"), H100_NODE).pod
    assert 60 <= small.startup_seconds - ENGINE_START_SECONDS <= 180  # measured at most 76 s for 64 GiB
    one_gpu = NodeFacts(2 * 2**40, 1, "one-gpu-2ti")  # nearly the whole node is one replica's pool
    big = plan(LLAMA_8B, request(), one_gpu)
    assert big.pool.footprint_bytes > 1.8 * 2**40
    assert big.pod.startup_seconds > ENGINE_START_SECONDS + 3600  # not the restart of a fixed 30 min


def test_a_pool_pre_faulted_by_more_threads_gets_a_shorter_startup_allowance():
    """16 threads set a 64 GiB pool up in 16 s at the slowest, one thread in 76 s (bench/pool-setup)."""
    def allowance(cpu, size="64Gi"):
        node = NodeFacts(2 * 2**40, 8, "h200", cpu_millis=cpu)
        return plan(LLAMA_8B, request(size=size), node).pod.startup_seconds - ENGINE_START_SECONDS
    one, four, sixteen = allowance(None), allowance(32_000), allowance(128_000)  # 1 / 4 / 16 cores per replica
    assert 60 <= one <= 180 and 16 <= sixteen <= 60, (one, sixteen)
    assert one > four > sixteen
    assert allowance(1_024_000) == sixteen  # no faster than the 16 threads measured


def test_geometry_only_without_node():
    result = plan(LLAMA_8B)
    assert result.pool is None and result.pod is None
    assert result.to_dict()["geometry"]["block_bytes"] == 8 * 2**20


def test_warnings():
    small = plan(resolve_geometry("Qwen/Qwen2.5-1.5B-Instruct"), request(block_size=16), H100_NODE)
    assert any("DMA" in w for w in small.warnings)  # 448 KiB blocks
    assert not any("DMA" in w for w in plan(resolve_geometry("Qwen/Qwen2.5-1.5B-Instruct"), request(), H100_NODE).warnings)
    idle = plan(LLAMA_8B, ServingRequest(replicas_per_node=2), H100_NODE)
    assert any("6 of 8 GPUs" in w for w in idle.warnings)


def test_qualified_node_gets_transfer_estimates_and_slow_link_warning():
    fast = plan(LLAMA_8B, request(block_size=16), NodeFacts(2 * 2**40, 8, "qualified", dma_gbps=52.4))
    # 2 MiB per 16-token block at 52.4 GB/s: 40 us per block, ~400k tokens/s of reloaded KV
    assert fast.transfer.block_reload_us == pytest.approx(2 * 2**20 / 52.4e9 * 1e6)
    assert fast.transfer.reload_tokens_per_s == pytest.approx(52.4e9 / (128 * 1024))
    assert not any("qualified at" in w for w in fast.warnings)
    slow = plan(LLAMA_8B, request(), NodeFacts(2 * 2**40, 8, "slow", dma_gbps=3.0))
    assert any("qualified at 3.0 GB/s" in w for w in slow.warnings)
    assert plan(LLAMA_8B, request(), H100_NODE).transfer is None


H200_TABLE = ((64 * 2**10, 16.4), (1 * 2**20, 47.5), (2 * 2**20, 51.3), (4 * 2**20, 53.3))  # anchor C2G figures


def test_transfer_rate_is_read_at_the_size_of_each_copy():
    node = NodeFacts(2 * 2**40, 8, "h200", dma_gbps=51.3, dma_table=H200_TABLE)
    contiguous = plan(LLAMA_8B, request(block_size=16), node)
    assert contiguous.transfer.copy_bytes == 2 * 2**20 and contiguous.transfer.qualified_gbps == 51.3
    assert plan(LLAMA_8B, request(), node).transfer.qualified_gbps == 53.3  # 8 MiB: past the table's largest size
    small = plan(resolve_geometry("meta-llama/Llama-3.2-1B-Instruct"), request(block_size=16), node)
    assert small.transfer.copy_bytes == 2**19  # 0.5 MiB block: halfway (log2) between 64 KiB and 1 MiB
    assert small.transfer.qualified_gbps == pytest.approx(16.4 + (47.5 - 16.4) * 3 / 4)
    per_layer = plan(LLAMA_8B, request(layout="default", block_size=16), node)
    assert per_layer.transfer.copy_bytes == 64 * 2**10 and per_layer.transfer.qualified_gbps == 16.4
    assert any("32 copies of 64.00 KiB (16.4 GB/s on this node)" in w for w in per_layer.warnings)


def test_engine_env_follows_the_vllm_version():
    modern = plan(LLAMA_8B, ServingRequest(vllm_version="0.33.0"), H100_NODE)
    assert modern.env == {api.ENV_KV_CACHE_LAYOUT: api.CONTIGUOUS_LAYOUT}
    # 0.26 accepts only NHD/HND layouts; its V1 model runner gives the offloading connector whole-block copies.
    old = plan(LLAMA_8B, ServingRequest(vllm_version="0.26.0"), H100_NODE)
    assert old.env == {api.ENV_USE_V2_MODEL_RUNNER: "0"}
    with pytest.raises(InvalidSpec, match="supports vLLM 0.26, 0.32, 0.33"):
        plan(LLAMA_8B, ServingRequest(vllm_version="0.29.1"), H100_NODE)


def api_servers_on(cpu, replicas_per_node=1, offload=True):
    node = NodeFacts(2 * 2**40, 8, "h200", cpu_millis=cpu)
    return plan(LLAMA_8B, ServingRequest(replicas_per_node=replicas_per_node,
                                         offload=OffloadRequest(enabled=offload)), node)


def _flag(result):
    args = result.args
    return args[args.index(api.FLAG_API_SERVER_COUNT) + 1] if api.FLAG_API_SERVER_COUNT in args else None


@pytest.mark.parametrize("cpu, replicas, servers", [
    (16_000, 1, 4),  # the measured best (bench/api-servers)
    (15_500, 1, 4),  # a 16-core node less the kubelet's reserve
    (64_000, 1, 4),  # never more than measured
    (8_000, 1, 2),
    (4_000, 1, 1),
    (3_000, 1, 1),
    (128_000, 8, 4),  # 16 cores each
    (64_000, 8, 2),  # 8 cores each
    (16_000, 4, 1),  # 4 cores each
    (None, 1, 1),  # unknown CPU: vLLM's default
])
def test_api_servers_follow_the_cores_of_a_replicas_share(cpu, replicas, servers):
    result = api_servers_on(cpu, replicas)
    assert result.engine.api_servers == servers
    assert _flag(result) == (str(servers) if servers > 1 else None)
    assert result.to_dict()["engine"] == {"api_servers": servers, "why": result.engine.why,
                                          "cores": None if cpu is None else max((cpu // replicas + 500) // 1000, 1)}


@pytest.mark.parametrize("cpu, replicas, threads", [
    (16_000, 1, "16"),
    (128_000, 8, "16"),  # 16 cores each
    (64_000, 1, "16"),  # never more threads than measured
    (16_000, 4, "4"),
    (3_000, 1, "3"),
    (None, 1, None),  # unknown CPU: the patched vLLM takes the CPUs it may run on
])
def test_the_pool_is_pre_faulted_by_the_replicas_cores(cpu, replicas, threads):
    assert api_servers_on(cpu, replicas).env.get(api.ENV_PREFAULT_THREADS) == threads
    assert api.ENV_PREFAULT_THREADS not in api_servers_on(cpu, replicas, offload=False).env  # no pool
    older = plan(LLAMA_8B, ServingRequest(replicas_per_node=replicas, vllm_version="0.32.0"),
                 NodeFacts(2 * 2**40, 8, "h200", cpu_millis=cpu))
    assert api.ENV_PREFAULT_THREADS not in older.env  # only the image's 0.33 carries the patch


def test_api_servers_are_planned_without_offload_too_and_say_why():
    result = api_servers_on(16_000, offload=False)
    assert result.pool is None and _flag(result) == "4"
    assert "16 CPU cores per replica" in result.engine.why and "h200" in result.engine.why
    assert "unknown" in api_servers_on(None).engine.why
    assert plan(LLAMA_8B).to_dict()["engine"]["api_servers"] == 1


def test_each_extra_api_server_is_reserved_in_the_pods_memory():
    one, four = api_servers_on(None), api_servers_on(16_000)
    extra = four.pod.process_reserve_bytes - one.pod.process_reserve_bytes
    assert extra == 3 * 2**30  # three processes beyond vLLM's first, 1 GiB each
    assert four.pod.memory_limit_bytes >= four.pool.footprint_bytes + SHM_EXTRA_BYTES + process_reserve(1, 4)
    assert four.pod.memory_limit_bytes <= four.node.share_bytes  # the pool made room for them
    assert four.pool.bytes < one.pool.bytes


def test_a_multimodal_model_reserves_its_processor_cache_in_every_extra_api_server():
    gemma = resolve_geometry("google/gemma-3-27b-it")
    assert gemma.architecture == "Gemma3ForConditionalGeneration"
    assert not is_multimodal(LLAMA_8B)
    node = lambda cpu: NodeFacts(2 * 2**40, 8, "h200", cpu_millis=cpu)
    one, four = (plan(gemma, ServingRequest(replicas_per_node=1), node(cpu)) for cpu in (None, 16_000))
    assert four.engine.api_servers == 4
    assert four.pod.process_reserve_bytes - one.pod.process_reserve_bytes == 3 * (1 + 4) * 2**30
