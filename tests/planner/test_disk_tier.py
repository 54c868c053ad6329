"""The disk tier's plan: sized from the node's ephemeral storage or the named volume, refused with the numbers,
and vLLM's fs tier in --kv-transfer-config for each release that has it."""
from __future__ import annotations

import json

import pytest
from spillway.adapters.model_config import resolve_geometry
from spillway.core import disk_tier as dt
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec
from spillway.core.planner import NodeFacts, OffloadRequest, ServingRequest, plan
from spillway.core.quantity import GiB

TiB = 1024 * GiB

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
GEOMETRY = resolve_geometry(LLAMA)
NODE = NodeFacts(2 * TiB, 8, "gpu-a", ephemeral_storage=28 * TiB)


def request(version: str = api.IMAGE_VLLM_VERSION, **disk) -> ServingRequest:
    return ServingRequest(offload=OffloadRequest(disk=dt.DiskTierRequest(enabled=True, **disk)), vllm_version=version)


def transfer_config(p) -> dict:
    return json.loads(p.args[p.args.index(api.FLAG_KV_TRANSFER_CONFIG) + 1])


@pytest.mark.parametrize("version", ["0.33.0", "0.32.0"])
def test_auto_takes_the_replica_share_less_the_weights_allowance_and_configures_the_fs_tier(version):
    p = plan(GEOMETRY, request(version), NODE)
    disk, pool = p.disk, p.pool
    share = (28 * TiB - int(28 * TiB * dt.NODE_EPHEMERAL_RESERVE_FRACTION)) // 8
    assert disk.share_bytes == share == disk.ephemeral_request_bytes
    assert disk.tier_bytes == share - dt.OTHER_EPHEMERAL_BYTES
    assert disk.bound_bytes == disk.chunks * pool.chunk_bytes <= disk.tier_bytes - dt.TIER_SLACK_BYTES
    assert disk.tier_bytes - dt.TIER_SLACK_BYTES - disk.bound_bytes < pool.chunk_bytes  # whole chunks, no waste
    extra = transfer_config(p)[api.KV_CONNECTOR_EXTRA_CONFIG_KEY]
    # vLLM's TieringOffloadingSpec, as Spillway's subclass that carries the connector's probes
    assert extra[api.EXTRA_SPEC_NAME] == "SpillwayTieringOffloadingSpec"
    assert extra[api.EXTRA_SPEC_MODULE_PATH] == "spillway_connector.spec"
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": dt.MOUNT_PATH, "n_read_threads": dt.READ_THREADS,
                                         "n_write_threads": dt.WRITE_THREADS}]
    assert extra["spillway_disk_tier_bytes"] == disk.bound_bytes
    assert extra[api.EXTRA_CPU_BYTES] == pool.bytes
    assert p.env[api.ENV_PYTHONHASHSEED] == "0"
    assert disk.tokens == disk.chunks * (pool.tokens // pool.chunks)


def test_fractions_and_quantities_are_honoured_or_refused_with_the_numbers():
    half = plan(GEOMETRY, request(size="0.5"), NODE).disk
    assert half.tier_bytes == half.share_bytes // 2
    exact = plan(GEOMETRY, request(size="1Ti"), NODE).disk
    assert exact.tier_bytes == 1 * TiB
    with pytest.raises(dt.DiskTierDoesNotFit, match=r"offload.disk.size 4Ti \(4.00 TiB\) exceeds the replica's share "
                                                    r"of 3.32 TiB .*28.00 TiB allocatable .* at most 3.17 TiB"):
        plan(GEOMETRY, request(size="4Ti"), NODE)
    with pytest.raises(dt.DiskTierDoesNotFit, match="reports no allocatable ephemeral-storage"):
        plan(GEOMETRY, request(), NodeFacts(2 * TiB, 8, "bare"))
    with pytest.raises(dt.DiskTierDoesNotFit, match="holds 0 chunks"):
        plan(GEOMETRY, request(size="1Gi"), NODE)


def test_named_volumes_are_sized_from_their_capacity():
    host = plan(GEOMETRY, request(volume=dt.DiskVolume(dt.HOST_PATH, "8Ti", host_path="/mnt/nvme")), NODE)
    assert host.disk.tier_bytes == 1 * TiB and host.disk.ephemeral_request_bytes is None  # 8 Ti / 8 replicas
    shared = plan(GEOMETRY, request(volume=dt.DiskVolume(dt.PVC, "10Ti", claim_name="kv"), replicas=4),
                  NODE)
    assert shared.disk.share_bytes == 10 * TiB // 4  # every replica shares the claim
    with pytest.raises(InvalidSpec, match="hostPath.capacity is required"):
        plan(GEOMETRY, request(volume=dt.DiskVolume(dt.HOST_PATH, host_path="/mnt/nvme")), NODE)
    with pytest.raises(InvalidSpec, match="claimName is required"):
        plan(GEOMETRY, request(volume=dt.DiskVolume(dt.PVC, "1Ti")), NODE)


def test_what_cannot_carry_the_tier_is_refused_in_one_line():
    with pytest.raises(InvalidSpec, match=r"vLLM 0.32 or newer\), but the plan is for vLLM 0.26"):
        plan(GEOMETRY, request("0.26.0"), NODE)
    native = ServingRequest(offload=OffloadRequest(connector="native", disk=dt.DiskTierRequest(enabled=True)))
    with pytest.raises(InvalidSpec, match="offload.connector spillway: its evictor"):
        plan(GEOMETRY, native, NODE)
    off = ServingRequest(offload=OffloadRequest(enabled=False, disk=dt.DiskTierRequest(enabled=True)))
    with pytest.raises(InvalidSpec, match="offload.enabled is false"):
        plan(GEOMETRY, off, NODE)


def test_off_by_default_and_nothing_changes():
    plain = plan(GEOMETRY, ServingRequest(), NODE)
    assert plain.disk is None and "secondary_tiers" not in " ".join(plain.args)
    assert api.ENV_PYTHONHASHSEED not in plain.env
    assert plain.to_dict().get("disk") is None


def test_the_plan_reports_the_tier():
    out = plan(GEOMETRY, request(), NODE).to_dict()["disk"]
    assert out["bound_bytes"] > 3 * TiB - 200 * GiB and out["root_dir"] == dt.MOUNT_PATH
    assert "the evictor keeps" in out["why"]


def test_the_tier_is_enabled_only_where_a_disk_hit_beats_recompute_and_says_the_numbers():
    bytes_per_token = 131072  # Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 x K and V x 2 bytes
    slow = dt.disk_pays(3.0, bytes_per_token, 41_391.0, 400_000.0, 131072)
    fast = dt.disk_pays(12.0, bytes_per_token, 41_391.0, 400_000.0, 131072)
    # recompute 24.2 us/token, the pool's reload 2.5, the checksum 3.4 (128 KiB at 38.9 GB/s): the disk has
    # 18.3 us for 128 KiB, 7.17 GB/s; 6.05 GB/s if the checksum were free
    assert slow.break_even_gbps == fast.break_even_gbps == pytest.approx(7.17, abs=0.01)
    unchecked = dt.disk_pays(3.0, bytes_per_token, 41_391.0, 400_000.0, 131072, checksum_gbps=None)
    assert unchecked.break_even_gbps == pytest.approx(6.05, abs=0.01)
    assert (slow.pays, fast.pays) == (False, True)
    assert "32K tokens: 1,624 ms from disk vs 792 ms recompute" in slow.why
    assert "its checksum at 38.9 GB/s" in slow.why
    assert "does not pay" in slow.why and "the tier pays" in fast.why
    unknown = dt.disk_pays(None, bytes_per_token, 41_391.0, 400_000.0, 131072)
    assert unknown.pays is None and "not qualified" in unknown.why and "7.17 GB/s" in unknown.why
    assert dt.disk_pays(50.0, bytes_per_token, 41_391.0, 30_000.0, 8192).pays is False  # reload alone loses


def test_a_node_whose_disk_does_not_pay_gets_no_tier_but_the_numbers():
    slow = plan(GEOMETRY, request(), NodeFacts(2 * TiB, 8, "gpu-a", ephemeral_storage=28 * TiB, disk_read_gbps=1.5))
    assert slow.disk is not None and slow.disk.active is False and slow.disk.pays is False
    assert "secondary_tiers" not in " ".join(slow.args) and api.ENV_PYTHONHASHSEED not in slow.env
    assert any(w.startswith("disk tier left off: disk reads 1.50 GB/s") for w in slow.warnings)
    fast = plan(GEOMETRY, request(), NodeFacts(2 * TiB, 8, "gpu-a", ephemeral_storage=28 * TiB, disk_read_gbps=25.0))
    assert fast.disk.active and fast.disk.pays and "secondary_tiers" in " ".join(fast.args)
    assert not any(w.startswith("disk tier") for w in fast.warnings)
    unjudged = plan(GEOMETRY, request(), NODE)
    assert unjudged.disk.active and any(w.startswith("disk tier unjudged") for w in unjudged.warnings)


def test_vllm_names_the_tiering_metrics_as_we_do():
    from support.vllm_trees import vllm_tree

    tree = vllm_tree("0.33.0")
    if tree is None:
        pytest.skip("the vLLM 0.33.0 source tree is not unpacked (SPILLWAY_VLLM_TREES)")
    source = (tree / "vllm/v1/kv_offload/tiering/base.py").read_text()
    for name in (api.TieringMetric.CHUNK_QUERIES, api.TieringMetric.CHUNK_HITS, api.TieringMetric.READ_BYTES,
                 api.TieringMetric.READ_TIME, api.TieringMetric.WRITE_BYTES, api.TieringMetric.PROMOTION_JOB_FAILURES,
                 api.TieringMetric.CASCADE_JOB_FAILURES):
        assert f'"{name}"' in source, name


def test_the_break_even_counts_the_pools_reload_at_the_qualified_or_the_default_link_rate():
    # recompute 24.2 us a token of Llama-3.1-8B; its reload from the pool at 50 GB/s 2.6 us of it and its
    # checksum 3.4: 5.43 GB/s of disk reads would pay if both were free, 7.21 GB/s once they are counted
    unqualified = plan(GEOMETRY, request(), NODE).disk
    assert unqualified.break_even_gbps == pytest.approx(7.21, abs=0.005)
    assert (unqualified.reload_gbps, unqualified.reload_qualified) == (dt.DEFAULT_RELOAD_GBPS, False)
    assert "reload from the pool counted at 50.0 GB/s (the default" in unqualified.verdict
    slow_link = plan(GEOMETRY, request(), NodeFacts(2 * TiB, 8, "gpu-a", dma_gbps=25.0, ephemeral_storage=28 * TiB,
                                                   disk_read_gbps=8.0)).disk
    assert slow_link.break_even_gbps == pytest.approx(8.43, abs=0.005) and slow_link.reload_qualified
    assert slow_link.pays is False and "counted at 25.0 GB/s (qualified)" in slow_link.verdict
    # the same disk pays where the link is twice as fast
    fast_link = plan(GEOMETRY, request(), NodeFacts(2 * TiB, 8, "gpu-a", dma_gbps=50.0, ephemeral_storage=28 * TiB,
                                                   disk_read_gbps=8.0)).disk
    assert fast_link.pays is True


def _class(name: str, ephemeral: int, disk_gbps: float | None = None, memory: int = 2 * TiB):
    facts = NodeFacts(memory, 8, name, ephemeral_storage=ephemeral, disk_read_gbps=disk_gbps)
    return plan(GEOMETRY, request(), facts).disk, [name]


def test_one_tier_for_many_node_classes_is_the_smallest_share_under_the_most_doubtful_verdict():
    big, small = _class("a-big", 28 * TiB, 25.0), _class("b-small", 4 * TiB, 25.0)
    for order in ([big, small], [small, big]):
        tier = dt.across_classes(order)
        assert (tier.tier_bytes, tier.share_bytes, tier.ephemeral_request_bytes) == \
            (small[0].tier_bytes, small[0].share_bytes, small[0].ephemeral_request_bytes)
        assert (tier.sized_for, tier.node_classes, tier.pays, tier.active) == ("b-small", 2, True, True)
        assert "sized for node b-small, the smallest share of the 2 node classes" in tier.why
    # a class whose disk loses to recompute leaves the tier off everywhere, and the status says which
    slow = _class("c-slow", 28 * TiB, 1.5)
    tier = dt.across_classes([big, slow, small])
    assert (tier.active, tier.pays, tier.decided_by, tier.read_gbps) == (False, False, "c-slow", 1.5)
    assert tier.verdict.startswith("node c-slow decides for all 3 node classes: disk reads 1.50 GB/s")
    # an unqualified class leaves it as asked, unjudged
    unknown = dt.across_classes([big, _class("d-unknown", 28 * TiB)])
    assert (unknown.active, unknown.pays, unknown.decided_by) == (True, None, "d-unknown")
    # nodes of one class: its first node by name, the count said
    one = dt.across_classes([(small[0], ["b-small-2", "b-small-1"])])
    assert one.sized_for == "b-small-1" and one.node_classes == 1 and one.why == small[0].why
