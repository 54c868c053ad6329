"""Huge numbers: the CRD's pattern refuses them, and what gets past it anyway (the CLIs, objects written
before a schema change) is one clear error, never an OverflowError or decimal.Overflow."""
from __future__ import annotations

import pytest
from harness import LLAMA_8B, modelserver, one_error_line, render, spillway

HUGE_SIZES = ["1e400", "1e309", "9e99999999Ei", "99999999999999999999999999Ei"]


@pytest.mark.parametrize("size", HUGE_SIZES)
def test_plan_refuses_a_huge_node_memory_in_one_line(size):
    one_error_line(spillway("plan", "--model", LLAMA_8B, "--node-memory", size, "--gpus-per-node", "8"),
                   "--node-memory")


@pytest.mark.parametrize("size", HUGE_SIZES)
def test_plan_refuses_a_huge_offload_size_in_one_line(size):
    one_error_line(spillway("plan", "--model", LLAMA_8B, "--node-memory", "2Ti", "--gpus-per-node", "8",
                            "--offload-size", size), "offload size")


@pytest.mark.parametrize("size", HUGE_SIZES[:2])
def test_render_refuses_a_huge_offload_size_in_one_line(tmp_path, size):
    one_error_line(render(tmp_path, modelserver(offload={"size": size})), "offload size")


def test_render_refuses_a_huge_node_description_in_one_line(tmp_path):
    one_error_line(render(tmp_path, modelserver(), memory="1e309"), "memory")


def test_the_schema_refuses_sizes_past_any_memory():
    from support.crd_schema import admit  # the CRD applied the way the API server applies it

    for size in ("1e400", "1e309", "1e100Ei", "99999999999999999999999Ei"):
        _, errors = admit(modelserver(offload={"size": size}))
        assert errors, size
    for size in ("200Gi", "1.5Ti", "2e11", "0.5", "auto"):
        _, errors = admit(modelserver(offload={"size": size}))
        assert not errors, (size, errors)


@pytest.mark.parametrize("flags, field", [(["--offload-size"], "offload size"),
                                          (["--disk-tier", "--disk-size"], "offload.disk.size")])
@pytest.mark.parametrize("size", ["1.5", "0.0"])
def test_a_share_outside_0_to_1_is_one_line_naming_its_field(flags, field, size):
    """The pool and the disk tier read a size the same way (core/quantity.py parse_size): a fraction is a share."""
    line = one_error_line(spillway("plan", "--model", LLAMA_8B, "--node-memory", "2Ti", "--gpus-per-node", "8",
                                   *flags, size), f"{field} fraction must be in (0, 1]")
    assert line.endswith(f"got {size}"), line
