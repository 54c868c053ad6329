"""The connector runs only on the vLLM minors it supports, and says so in one line otherwise."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from spillway_connector.versions import SUPPORTED_MINORS, UnsupportedVLLMVersion, require_supported

CONNECTOR_SRC = Path(__file__).resolve().parents[2] / "connector"


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0+cpu", "0.33.0", "0.33.2rc1", "0.34.0", "0.26.0.dev3+g1234abc"])
def test_supported_versions_pass(version):
    assert require_supported(version) in SUPPORTED_MINORS


@pytest.mark.parametrize("version", ["0.25.2", "0.27.0", "0.35.0", "1.0.0", "dev", ""])
def test_unsupported_versions_fail_with_one_clear_line(version):
    with pytest.raises(UnsupportedVLLMVersion) as raised:
        require_supported(version)
    message = str(raised.value)
    assert "\n" not in message
    assert f"vLLM {version} is installed" in message
    assert "0.26, 0.32, 0.33, 0.34" in message


def test_loading_the_connector_on_an_unsupported_vllm_fails_loudly(tmp_path):
    """vLLM imports kv_connector_module_path; on another vLLM that import must stop with the message."""
    stand_in = tmp_path / "vllm"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text('__version__ = "0.20.1"\n')
    result = subprocess.run(
        [sys.executable, "-c", "import importlib; importlib.import_module('spillway_connector.connector')"],
        env={"PYTHONPATH": f"{tmp_path}:{CONNECTOR_SRC}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == (
        "spillway_connector.versions.UnsupportedVLLMVersion: spillway_connector supports vLLM 0.26, 0.32, 0.33, 0.34, "
        "but vLLM 0.20.1 is installed; install a supported vLLM or use vLLM's own OffloadingConnector"
    )
