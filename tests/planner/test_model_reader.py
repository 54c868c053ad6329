"""A config.json read as vLLM reads it: through transformers' config class of its model type (every default it
fills is the planner's), bounded before anything is expanded, refused where vLLM itself refuses."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spillway.adapters.model_config import (
    TRANSFORMERS_VERSION,
    VLLM_CONFIG_TYPES,
    _catalog,
    filled_config,
    geometry_of,
)
from spillway.core.errors import ModelGeometryUnknown
from spillway.core.geometry import geometry_from_config, kv_layout
from spillway.core.groups import FULL, SLIDING
from spillway.core.model_facts import read_facts
from support.forked import spillway_cli

PUBLISHED = Path(__file__).resolve().parent / "published"
GEMMA3_27B = PUBLISHED / "google--gemma-3-27b-it.json"  # as google publishes it: no layer_types, no pattern


def _spillway(*args: str) -> subprocess.CompletedProcess:
    return spillway_cli(*args, timeout=60)


def test_the_transformers_in_use_is_the_one_the_reader_names():
    from importlib.metadata import version
    assert version("transformers") == TRANSFORMERS_VERSION


def test_gemma3_as_published_gets_the_layer_kinds_transformers_fills():
    config = json.loads(GEMMA3_27B.read_text())
    facts = read_facts(filled_config(config), "gemma-3-27b-it")
    kinds = [layer[0] for layer in facts.kinds]
    assert (kinds.count(SLIDING), kinds.count(FULL), facts.window) == (52, 10, 1024)
    # TP 2, block 32, fp8: vLLM's row is one block of a group of 10 layers, 8 KV heads of 128 per rank, K and V
    layout = kv_layout(geometry_of(config, "gemma-3-27b-it"), 2, 32, "fp8")
    assert layout.block_bytes == 10 * 32 * 8 * 128 * 2 == 655_360


def test_an_unfilled_config_is_refused_by_the_core_not_read_as_all_sliding():
    with pytest.raises(ModelGeometryUnknown, match="without layer_types"):
        geometry_from_config(json.loads(GEMMA3_27B.read_text()), "gemma-3-27b-it")


def test_the_published_config_plans_through_the_cli():
    out = _spillway("plan", "--model-config", str(GEMMA3_27B), "--tensor-parallel-size", "2", "--block-size", "32",
                    "--kv-cache-dtype", "fp8", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["geometry"]["block_bytes"] == 655_360


def _config_registry(tree: str) -> set[str]:
    module = ast.parse((Path(tree) / "vllm/transformers_utils/config.py").read_text())
    (call,) = [node.value for node in ast.walk(module) if isinstance(node, ast.AnnAssign)
               and getattr(node.target, "id", None) == "_CONFIG_REGISTRY"]
    return {k.arg for k in call.keywords if k.arg} | {key.value for k in call.keywords if k.arg is None
                                                      for key in k.value.keys}


def test_the_model_types_vllm_builds_itself_are_its_registrys():
    """VLLM_CONFIG_TYPES is vllm/transformers_utils/config.py _CONFIG_REGISTRY of 0.33 and 0.34 together."""
    trees = [t for t in os.environ.get("SPILLWAY_VLLM_TREES", "").split(os.pathsep) if "/0.33." in t or "/0.34." in t]
    if len(trees) < 2:
        pytest.skip("vLLM 0.33's and 0.34's source trees are not unpacked (make vllm-src)")
    assert set().union(*map(_config_registry, trees)) == VLLM_CONFIG_TYPES


def test_the_catalog_stores_configs_as_vllm_reads_them():
    """The catalog is not filled at plan time (its entries keep only geometry fields): each must read the same
    layers, windows and heads as its filled form."""
    for model, config in _catalog().items():
        raw, filled = read_facts(config, model), read_facts(filled_config(config, model), model)
        assert (raw.kinds, raw.window, raw.num_kv_heads, raw.head_dim, raw.layer_heads, raw.mamba) == \
            (filled.kinds, filled.window, filled.num_kv_heads, filled.head_dim, filled.layer_heads, filled.mamba), model


@pytest.mark.parametrize("field,value,message", [
    ("num_hidden_layers", 10**30, "'num_hidden_layers' is about 10\\*\\*30, beyond any model vLLM serves"),
    ("num_hidden_layers", 10**9, "'num_hidden_layers' is 1000000000, beyond"),
    ("num_attention_heads", 1 << 30, "'num_attention_heads' is 1073741824"),
    ("head_dim", 1 << 30, "'head_dim' is 1073741824"),
    ("num_key_value_heads", 1 << 20, "'num_key_value_heads'"),
])
def test_absurd_geometry_is_refused_in_one_line(field, value, message):
    config = json.loads(GEMMA3_27B.read_text())
    config["text_config"][field] = value
    with pytest.raises(ModelGeometryUnknown, match=message):
        geometry_of(config)
    with pytest.raises(ModelGeometryUnknown, match=message):  # the core bounds it too, filled or not
        read_facts(config)


def test_a_layer_count_of_10_to_the_30_exits_2_with_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "num_hidden_layers": 10**30, "num_attention_heads": 32}))
    out = _spillway("plan", "--model-config", str(tmp_path / "config.json"))
    assert (out.returncode, out.stdout, out.stderr.count("\n")) == (2, "", 1), out.stderr
    assert "num_hidden_layers' is about 10**30" in out.stderr


def test_more_kv_heads_than_attention_heads_is_refused_with_vllms_assertion():
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
              "num_attention_heads": 64, "num_key_value_heads": 128, "hidden_size": 8192}
    with pytest.raises(ModelGeometryUnknown, match=r"num_heads \(64\) is not divisible by num_kv_heads \(128\)"):
        geometry_of(config)


def test_a_config_transformers_refuses_is_one_line_naming_its_class():
    config = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": "62"}
    with pytest.raises(ModelGeometryUnknown, match="Gemma3TextConfig .*expected int"):
        geometry_of(config)


def test_a_window_is_counted_in_the_offloads_chunks():
    """vLLM's scheduler keeps a sliding group's window in chunks (get_sliding_window_size_in_chunks): 1,024 tokens
    in chunks of 4 blocks of 32 are 8 chunks, not 32 blocks."""
    out = _spillway("plan", "--model-config", str(GEMMA3_27B), "--tensor-parallel-size", "2", "--block-size", "32",
                    "--offload-block-size", "128", "--node-memory", "1Ti", "--gpus-per-node", "8",
                    "--offload-size", "64Gi", "-o", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["pool"]["blocks"] == 4 * plan["pool"]["chunks"]
    windows = {(g["kind"], g["window"], g["window_chunks"]) for g in plan["kv_cache_groups"]["groups"]}
    assert windows == {(SLIDING, 1024, 8), (FULL, None, None)}


@pytest.mark.parametrize("config,length", [
    # microsoft/Phi-4-mini-instruct: LongRoPE, so vLLM defaults to original_max_position_embeddings
    ({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32,
      "num_attention_heads": 24, "num_key_value_heads": 8, "max_position_embeddings": 131072,
      "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
      "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}, 4096),
    # a Qwen2 language model with dynamic RoPE of factor 2 (OpenGVLab/InternVL3-8B's): 32,768 positions x 2
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
      "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
      "rope_scaling": {"factor": 2.0, "rope_type": "dynamic", "type": "dynamic"}}, 65536),
    # Llama 3.1's llama3 RoPE is already in max_position_embeddings
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, 131072),
])
def test_max_model_len_is_derived_as_vllm_derives_it(config, length):
    """vllm/config/model.py _get_and_verify_max_len with no --max-model-len."""
    assert geometry_of(config).max_model_len == length


# The operator plans ModelServers in parallel handler threads: the first readings of a config.json import
# transformers from several threads at once, whose lazy modules then raise ImportError in the threads that lose the
# race; unguarded, those read "transformers is not installed" and refused the config (adapters/model_config.py
# _IMPORT_LOCK). In a fresh interpreter, as the operator starts: without the lock 5-6 of 8 threads were refused.
_CONCURRENT_FIRST_READS = """
import threading
from spillway.adapters.model_config import catalog_config, catalog_ids, geometry_of
ids, said = catalog_ids(), []
def read(i):
    try:
        geometry_of(catalog_config(ids[i]), "acme/inline")
        said.append("ok")
    except Exception as exc:
        said.append(f"{type(exc).__name__}: {exc}")
threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print("\\n".join(said))
"""


def test_first_readings_from_concurrent_threads_all_see_transformers():
    done = subprocess.run([sys.executable, "-c", _CONCURRENT_FIRST_READS], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split("\n")[:8] == ["ok"] * 8, done.stdout[-2000:]
