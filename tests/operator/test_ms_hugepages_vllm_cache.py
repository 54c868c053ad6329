"""vLLM's compile cache on a pod volume: a restarted container finds it, a changed model or release never shares it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes_validate
import pytest
from spillway.core import k8s_names as names
from spillway.core import vllm_api as api
from spillway.core.errors import InvalidSpec
from support.ms_examples import rendered_deployment

KUBERNETES_VERSIONS = ("1.30", "1.37")
pod_of = rendered_deployment


def cache_root(**spec) -> str:
    container = pod_of(**spec)["spec"]["template"]["spec"]["containers"][0]
    return next(e["value"] for e in container["env"] if e["name"] == api.ENV_CACHE_ROOT)


@pytest.mark.parametrize("image", [None, "vllm/vllm-openai:v0.34.0"], ids=["ours", "stock"])
def test_the_cache_root_is_on_an_emptydir_the_container_mounts(image):
    deployment = pod_of(**({"image": image} if image else {}))
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volume = next(v for v in pod["volumes"] if v["name"] == names.VOLUME_VLLM_CACHE)
    assert volume == {"name": names.VOLUME_VLLM_CACHE, "emptyDir": {}}
    mount = next(m for m in container["volumeMounts"] if m["name"] == names.VOLUME_VLLM_CACHE)
    root = next(e["value"] for e in container["env"] if e["name"] == api.ENV_CACHE_ROOT)
    assert os.path.dirname(root) == mount["mountPath"] == names.VLLM_CACHE_MOUNT
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(json.loads(json.dumps(deployment)), version, strict=True)


def test_the_key_follows_model_revision_release_tp_and_image():
    base = cache_root()
    changed = [cache_root(model="Qwen/Qwen3-8B"), cache_root(revision="abc123"), cache_root(vllmVersion="0.33.0"),
               cache_root(tensorParallelSize=2), cache_root(image="vllm/vllm-openai:v0.34.0")]
    assert len({base, *changed}) == 1 + len(changed)
    # what does not change the compiled graphs keeps the directory
    assert cache_root(replicas=3) == cache_root(env=[{"name": "EXTRA", "value": "1"}]) == base


def test_the_spec_may_not_set_the_cache_root():
    with pytest.raises(InvalidSpec, match=api.ENV_CACHE_ROOT):
        pod_of(env=[{"name": api.ENV_CACHE_ROOT, "value": "/elsewhere"}])


def test_vllm_reads_the_root_the_pod_sets(tmp_path):
    """vLLM's own envs module (the installed release) takes the variable as its cache root."""
    root = cache_root()
    code = "import vllm.envs as e; print(e.VLLM_CACHE_ROOT)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, api.ENV_CACHE_ROOT: root, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == root
