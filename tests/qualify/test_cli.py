"""Command-line checks that need no GPU, and the GPU measurement itself where a GPU exists."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from spillway.core.errors import InvalidSpec
from spillway.qualify.cli import parse_choice, parse_sizes


def run(*args):
    return subprocess.run([sys.executable, "-m", "spillway.cli", "qualify", *args], capture_output=True, text=True, check=False)


def test_sizes_and_choices_are_checked():
    assert parse_sizes("2Mi,4Ki,2Mi") == [4096, 2 * 2**20]
    with pytest.raises(InvalidSpec):
        parse_sizes("12")
    with pytest.raises(InvalidSpec):
        parse_choice("dma,warp", ("vllm", "dma", "kernel"), "--methods")
    assert parse_choice("dma,dma,kernel", ("vllm", "dma", "kernel"), "--methods") == ["dma", "kernel"]


def test_bad_flags_exit_2_with_one_line():
    out = run("--methods", "nvlink")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--methods" in out.stderr


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_qualify_on_a_gpu_measures_every_cell(tmp_path):
    out = run("--block-sizes", "64Ki,2Mi", "--blocks", "200", "--repeats", "3", "--methods", "dma,kernel",
              "--json", str(tmp_path / "q.json"))
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "q.json").read_text())
    assert len(doc["rows"]) == 2 * 2 * 3
    assert all("median_gbps" in r for r in doc["rows"]), doc["rows"]
    assert doc["annotated"]["gbps"] > 1.0
