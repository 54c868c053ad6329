"""Scattering, GB/s arithmetic, statistics and rate lookups of the transfer qualification."""
from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from spillway.core.qualification import Row, production_method, rate_at
from spillway.qualify.measure import (
    DEFAULT_BLOCK_SIZES,
    KiB,
    MiB,
    block_pointers,
    gbps,
    pool_blocks,
    pool_bytes,
    scatter,
    transfer_bytes,
)


def test_gbps_is_decimal_gigabytes_per_second():
    assert gbps(2 * 10**9, 1.0) == 2.0
    assert gbps(1000 * 2 * MiB, 0.04) == pytest.approx(52.4288)
    with pytest.raises(ValueError):
        gbps(1, 0.0)


def test_bidirectional_transfers_count_both_directions():
    assert transfer_bytes(2 * MiB, 1000, "c2g") == 2000 * MiB
    assert transfer_bytes(2 * MiB, 1000, "bidir") == 4000 * MiB


def test_pool_is_twice_the_transfer_below_4_mib_and_one_transfer_from_there():
    assert pool_blocks(2 * MiB) == 2000
    assert pool_blocks(4 * MiB) == 1000
    assert pool_bytes(DEFAULT_BLOCK_SIZES) == 1000 * 16 * MiB
    assert pool_bytes([4 * KiB, 2 * MiB]) == 2000 * 2 * MiB


@given(st.integers(1, 3000), st.integers(0, 2**32), st.integers(0, 3000))
def test_scatter_draws_distinct_indices_inside_the_pool(blocks, seed, extra):
    pool = blocks + extra
    picked = scatter(random.Random(seed), pool, blocks)
    assert len(picked) == blocks == len(set(picked))
    assert all(0 <= i < pool for i in picked)


def test_scatter_is_scattered_and_reproducible():
    a = scatter(random.Random(7), 2000, 1000)
    assert a == scatter(random.Random(7), 2000, 1000)
    assert a != sorted(a)  # random order, not a contiguous run
    with pytest.raises(ValueError):
        scatter(random.Random(0), 10, 11)


def test_block_pointers_are_base_plus_index_times_size():
    assert block_pointers(4096, [0, 3, 1], 2 * MiB) == [4096, 4096 + 6 * MiB, 4096 + 2 * MiB]


def test_a_row_reports_median_best_worst_spread_and_round_trips():
    r = Row("dma", "c2g", 2 * MiB, 1000, samples=[50.0, 52.0, 51.0, 40.0, 51.5])
    assert r.median == 51.0 and r.best == 52.0 and r.worst == 40.0
    assert r.spread_pct == pytest.approx(12 / 51 * 100)
    d = r.to_dict()
    assert d["median_gbps"] == 51.0 and d["samples_gbps"] == [50.0, 52.0, 51.0, 40.0, 51.5]
    assert Row.from_dict(d).samples == r.samples
    failed = Row("vllm", "c2g", 2 * MiB, 1000, error="ImportError: no vllm")
    assert not failed.ok and failed.to_dict()["error"].startswith("ImportError")


def _rows(method="dma"):
    return [Row(method, "c2g", 1 * MiB, 1000, samples=[40.0]), Row(method, "c2g", 4 * MiB, 1000, samples=[50.0]),
            Row(method, "g2c", 1 * MiB, 1000, samples=[30.0])]


def test_rate_at_interpolates_on_log2_of_the_block_size_and_clamps_outside():
    rows = _rows()
    assert rate_at(rows, 1 * MiB) == 40.0
    assert rate_at(rows, 2 * MiB) == pytest.approx(45.0)  # halfway between 1 and 4 MiB in log2
    assert rate_at(rows, 64 * KiB) == 40.0
    assert rate_at(rows, 64 * MiB) == 50.0
    assert rate_at(rows, 2 * MiB, "g2c") == 30.0
    assert rate_at(rows, 2 * MiB, "bidir") is None


def test_the_production_method_is_preferred():
    rows = _rows("dma") + [Row("vllm", "c2g", 2 * MiB, 1000, samples=[48.0]),
                           Row("kernel", "c2g", 2 * MiB, 1000, samples=[60.0])]
    assert production_method(rows) == "vllm"
    assert rate_at(rows, 2 * MiB) == 48.0
    assert rate_at(rows, 2 * MiB, method="kernel") == 60.0
    rows[-2].error = "RuntimeError: broken"
    assert production_method(rows) == "dma"
