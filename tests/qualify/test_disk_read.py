"""`spillway qualify --disk`: the disk's read rate into a shared mapping, read as vLLM's fs tier reads, on this
machine's real disk; the volume is left as it was found."""
from __future__ import annotations

import json
import subprocess
import sys

from spillway.qualify.disk import measure_disk_read


def test_measures_a_read_rate_and_leaves_the_volume_as_it_was(tmp_path):
    (tmp_path / "kept.bin").write_bytes(b"k" * 4096)
    rate = measure_disk_read(str(tmp_path), chunk_bytes=64 * 1024, chunks=32, threads=4)
    print(f"disk read: {rate.gbps} GB/s ({'O_DIRECT' if rate.o_direct else 'buffered'}, {rate.seconds} s)")
    assert rate.gbps > 0 and rate.seconds > 0 and rate.chunks == 32
    assert [p.name for p in tmp_path.iterdir()] == ["kept.bin"]


def test_cli_prints_json_and_refuses_bad_input_in_one_line(tmp_path):
    run = [sys.executable, "-m", "spillway.cli", "qualify", "--disk", str(tmp_path), "--disk-chunks", "8",
           "--disk-chunk-size", "64Ki", "--disk-threads", "2", "--json", "-"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    assert doc["chunk_bytes"] == 65536 and doc["gbps"] > 0
    for bad in (["--disk", str(tmp_path / "missing")], ["--disk", str(tmp_path), "--disk-chunk-size", "1000"]):
        done = subprocess.run([sys.executable, "-m", "spillway.cli", "qualify", *bad], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
