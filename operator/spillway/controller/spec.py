"""A ModelServer's spec -> checked, typed settings and the planner's ServingRequest.

The CRD's schema rejects most bad input at the API server; this module checks it again
(the operator must never crash on what the schema missed, or on objects written before
a schema change) and adds the rules a schema cannot express. Every failure is an
InvalidSpec naming the field and the value.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import k8s_names as names
from ..core import vllm_api as api
from ..core.errors import InvalidSpec
from ..core.geometry import KV_CACHE_DTYPE_BYTES
from ..core.model_source import ModelSource
from ..core.options import Connector, EvictionPolicy, Layout, choices
from ..core.planner import OffloadRequest, ServingRequest
from .disk_spec import parse_disk
from .engine_flags import flag_values, geometry_flag, human_readable_int, planned_flag
from .routing_spec import RoutingSpec, check_events_args, parse_routing
from .spec_checks import (
    OFFLOAD_FIELDS,
    SPEC_FIELDS,
    argv_text,
    check_affinity,
    check_document,
    check_tolerations,
    known_fields,
    object_name,
)

# Resources the plan sets; a spec may add others (cpu, ephemeral-storage, ...) but not these.
PLANNED_RESOURCES = ("memory", names.GPU_RESOURCE)
KV_CACHE_DTYPES = ("auto", *KV_CACHE_DTYPE_BYTES)
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_SECRET_KEY = "token"
DEFAULT_API_KEY_KEY = "api-key"
DEFAULT_CONFIG_KEY = "config.json"


@dataclass(frozen=True)
class ObjectKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class CompileCacheClaim:
    """spec.compileCache: a claim every replica shares, carrying vLLM's compile cache between pods."""

    claim_name: str


@dataclass(frozen=True)
class ModelConfigSource:
    inline: Mapping[str, Any] | None = None
    config_map: ObjectKeyRef | None = None


@dataclass(frozen=True)
class ModelServerSpec:
    model: str
    revision: str | None = None
    served_model_name: str | None = None
    model_config: ModelConfigSource | None = None
    hf_token_secret: ObjectKeyRef | None = None
    request: ServingRequest = field(default_factory=ServingRequest)  # what the planner sizes
    replicas: int = 1
    image: str = names.DEFAULT_VLLM_IMAGE
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    extra_args: tuple[str, ...] = ()
    max_model_len: int | None = None  # extraArgs' --max-model-len: the request length the plan's tokens assume
    env: tuple[Mapping[str, Any], ...] = ()
    api_key_secret: ObjectKeyRef | None = None  # VLLM_API_KEY from a Secret
    network_policy: bool = True  # a NetworkPolicy admits only the router, Prometheus and client_namespaces
    client_namespaces: Mapping[str, Any] | None = None  # a namespace label selector
    routing: RoutingSpec = field(default_factory=RoutingSpec)  # how requests reach the replicas
    compile_cache: CompileCacheClaim | None = None

    def model_source(self) -> ModelSource:
        config = self.model_config
        return ModelSource(
            model=self.model,
            revision=self.revision,
            inline=config.inline if config is not None else None,
            config_map=(config.config_map.name, config.config_map.key)
            if config is not None and config.config_map is not None else None,
        )


def ours(image: str) -> bool:
    """Spillway's own vLLM image: its entrypoint and user are known (images/vllm/)."""
    repository = names.VLLM_IMAGE_REPOSITORY
    return image == repository or image.startswith((f"{repository}:", f"{repository}@"))


# -- typed readers: each names the field it reads -----------------------------------------------------

def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{where} must be an object, got {type(value).__name__} {value!r}")
    return value


def _given(obj: Mapping[str, Any], key: str, default: Any) -> Any:
    """The field's value; an explicit null means the default, as the API server's defaulting makes it."""
    value = obj.get(key)
    return default if value is None else value


def _int(obj: Mapping[str, Any], key: str, where: str, default: int | None, minimum: int) -> int | None:
    value = _given(obj, key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"{where}.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidSpec(f"{where}.{key} must be >= {minimum}, got {value}")
    return value


def _str(obj: Mapping[str, Any], key: str, where: str, default: str | None = None,
         choices: tuple[str, ...] | None = None) -> str | None:
    value = _given(obj, key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidSpec(f"{where}.{key} must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise InvalidSpec(f"{where}.{key} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _bool(obj: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = _given(obj, key, default)
    if not isinstance(value, bool):
        raise InvalidSpec(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidSpec(f"{where}.{key} must be a list, got {value!r}")
    return value


def _key_ref(value: Any, where: str, default_key: str, kind: str) -> ObjectKeyRef:
    ref = _mapping(value, where)
    name = _str(ref, "name", where)
    if not name:
        raise InvalidSpec(f"{where}.name is required")
    return ObjectKeyRef(object_name(name, f"{where}.name", kind), _str(ref, "key", where, default_key) or default_key)


# -- the spec --------------------------------------------------------------------------------------------

def _offload(spec: Mapping[str, Any]) -> OffloadRequest:
    where = "spec.offload"
    off = _mapping(spec.get("offload"), where)
    known_fields(off, OFFLOAD_FIELDS, where)
    size = off.get("size", "auto")
    if isinstance(size, bool) or not isinstance(size, (str, int, float)):
        raise InvalidSpec(f"{where}.size must be auto, a fraction like \"0.5\" or a quantity like 200Gi; got {size!r}")
    disk = parse_disk(off.get("disk"), _int(spec, "replicas", "spec", 1, 0), _resources(spec))
    for value, field_name, kind in ((disk.volume.claim_name, "persistentVolumeClaim.claimName", "PersistentVolumeClaim"),
                                    (disk.volume.storage_class, "ephemeral.storageClassName", "StorageClass")):
        if value is not None:
            object_name(value, f"{where}.disk.volume.{field_name}", kind)
    return OffloadRequest(
        enabled=_bool(off, "enabled", where, True),
        size=str(size).strip(),
        eviction_policy=EvictionPolicy(_str(off, "evictionPolicy", where, EvictionPolicy.LRU, choices(EvictionPolicy))),
        layout=Layout(_str(off, "layout", where, Layout.CONTIGUOUS, choices(Layout))),
        offload_block_size=_int(off, "blockSize", where, None, 1),
        connector=Connector(_str(off, "connector", where, Connector.SPILLWAY, choices(Connector))),
        disk=disk,
    )


def _model_config(spec: Mapping[str, Any]) -> ModelConfigSource | None:
    where = "spec.modelConfig"
    if spec.get("modelConfig") is None:
        return None
    source = _mapping(spec["modelConfig"], where)
    inline, ref = source.get("inline"), source.get("configMapRef")
    if (inline is None) == (ref is None):
        raise InvalidSpec(f"{where} takes exactly one of inline (a config.json object) or configMapRef")
    if inline is not None:
        check_document(inline, f"{where}.inline")
        return ModelConfigSource(inline=_mapping(inline, f"{where}.inline"))
    return ModelConfigSource(config_map=_key_ref(ref, f"{where}.configMapRef", DEFAULT_CONFIG_KEY, "ConfigMap"))


def _resources(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    where = "spec.resources"
    res = _mapping(spec.get("resources"), where)
    out: dict[str, dict[str, Any]] = {}
    for part in ("requests", "limits"):
        values = dict(_mapping(res.get(part), f"{where}.{part}"))
        planned = sorted(set(values) & set(PLANNED_RESOURCES))
        if planned:
            raise InvalidSpec(
                f"{where}.{part} sets {', '.join(planned)}: Spillway plans memory and GPUs "
                "(set offload.size and tensorParallelSize instead)"
            )
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise InvalidSpec(f"{where}.{part}.{name} must be a quantity, got {value!r}")
        if values:
            out[part] = {k: str(v) for k, v in values.items()}
    unknown = sorted(set(res) - {"requests", "limits"})
    if unknown:
        raise InvalidSpec(f"{where} takes requests and limits only, got {', '.join(unknown)}")
    return out


def _extra_args(spec: Mapping[str, Any]) -> tuple[str, ...]:
    args = _list(spec, "extraArgs", "spec")
    for arg in args:
        if not isinstance(arg, str):
            raise InvalidSpec(f"spec.extraArgs must be strings, got {arg!r}"[:300])
        argv_text(arg, "spec.extraArgs entry")
        flag = planned_flag(arg)
        if flag is not None:
            raise InvalidSpec(
                f"spec.extraArgs sets {flag}, which changes what the operator plans or writes itself "
                "(tensorParallelSize, blockSize, kvCacheDtype, offload, revision, servedModelName, apiKeySecretRef; "
                f"API servers follow the node's CPU; no parallelism, weight offload or {api.FLAG_CONFIG} file either)"
            )
        flag = geometry_flag(arg)
        if flag is not None:
            raise InvalidSpec(
                f"spec.extraArgs sets {flag}, which changes the model's KV geometry or host memory the plan sized "
                "(the cache dtype is kvCacheDtype; a changed config.json is modelConfig.inline)"
            )
    _check_mm_cache(args)
    return tuple(args)


def _check_mm_cache(args: list[str]) -> None:
    for value in flag_values(args, api.FLAG_MM_PROCESSOR_CACHE_GB):
        try:
            gib = float(value) if value is not None else None
        except ValueError:
            gib = None
        if gib is None or not 0 <= gib <= api.MM_PROCESSOR_CACHE_GB_DEFAULT:
            raise InvalidSpec(
                f"spec.extraArgs sets {api.FLAG_MM_PROCESSOR_CACHE_GB} {str(value)[:40]!r}: the plan reserves host "
                f"memory for vLLM's default of {api.MM_PROCESSOR_CACHE_GB_DEFAULT:g} GiB per API server, so it may "
                "be a number from 0 to that, no more"
            )


def _max_model_len(args: tuple[str, ...]) -> int | None:
    """extraArgs' --max-model-len (the last one, as argparse keeps it): the plan's tokens follow it. -1 and
    auto let vLLM fit it to GPU memory, which the config's own length bounds."""
    values = flag_values(args, api.FLAG_MAX_MODEL_LEN)
    if not values:
        return None
    value = values[-1]
    if value is not None and value.strip().lower() in ("-1", "auto"):
        return None
    length = human_readable_int(value) if value is not None else None
    if not length:
        raise InvalidSpec(f"spec.extraArgs sets {api.FLAG_MAX_MODEL_LEN} {str(value)[:40]!r}: vLLM takes a "
                          "positive number of tokens (8192, 8k, 8K), -1 or auto")
    return length


def _argv_word(obj: Mapping[str, Any], key: str, what: str) -> str | None:
    """A value the pod's command line carries as one word: vLLM's parser would read a leading '-' as a flag."""
    value = _str(obj, key, "spec")
    if value is None:
        return None
    if not value.strip():
        raise InvalidSpec(f"spec.{key} must name {what}, got {value!r}")
    if value.strip().startswith("-"):
        raise InvalidSpec(f"spec.{key} {value[:80]!r} starts with '-': vLLM's command line would read it as a "
                          f"flag; it must name {what}")
    return argv_text(value.strip(), f"spec.{key}")


def _env(spec: Mapping[str, Any], reserved: set[str]) -> tuple[Mapping[str, Any], ...]:
    env = _list(spec, "env", "spec")
    seen: set[str] = set()
    for item in env:
        entry = _mapping(item, "spec.env[]")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidSpec(f"spec.env entries need a name, got {item!r}")
        if name in reserved:
            raise InvalidSpec(f"spec.env sets {name}, which the operator writes from the plan or hfTokenSecretRef")
        if name in seen:
            raise InvalidSpec(f"spec.env sets {name} twice")
        seen.add(name)
    return tuple(env)


def parse_spec(spec: Any) -> ModelServerSpec:
    """Check a ModelServer's .spec and return its settings, or raise InvalidSpec."""
    spec = _mapping(spec, "spec")
    known_fields(spec, SPEC_FIELDS, "spec")
    model = spec.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidSpec(f"spec.model must name a model (a Hugging Face id or a path/URI), got {model!r}"[:300])
    model = _argv_word(spec, "model", "a model (a Hugging Face id or a path/URI)")
    selector = _mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    for key, value in selector.items():
        if not isinstance(value, str):
            raise InvalidSpec(f"spec.nodeSelector.{key} must be a string, got {value!r}")
    hf_token = spec.get("hfTokenSecretRef")
    token_ref = _key_ref(hf_token, "spec.hfTokenSecretRef", DEFAULT_SECRET_KEY, "Secret") if hf_token is not None else None
    reserved = set(api.RESERVED_ENV) | ({api.ENV_HF_TOKEN} if token_ref else set())
    pull_secrets = []
    for item in _list(spec, "imagePullSecrets", "spec"):
        name = _mapping(item, "spec.imagePullSecrets[]").get("name")
        if not isinstance(name, str) or not name:
            raise InvalidSpec(f"spec.imagePullSecrets entries need a name, got {item!r}")
        pull_secrets.append(object_name(name, "spec.imagePullSecrets[].name", "Secret"))
    affinity = spec.get("affinity")
    image = _str(spec, "image", "spec", names.DEFAULT_VLLM_IMAGE) or names.DEFAULT_VLLM_IMAGE
    return ModelServerSpec(
        model=model,
        revision=_argv_word(spec, "revision", "a branch, tag or commit of the model"),
        served_model_name=_argv_word(spec, "servedModelName", "the model for clients"),
        model_config=_model_config(spec),
        hf_token_secret=token_ref,
        request=ServingRequest(
            tensor_parallel_size=_int(spec, "tensorParallelSize", "spec", 1, 1),
            block_size=_int(spec, "blockSize", "spec", None, 1),  # None: the plan takes the model's
            kv_cache_dtype=_str(spec, "kvCacheDtype", "spec", "auto", KV_CACHE_DTYPES),
            replicas_per_node=_int(spec, "replicasPerNode", "spec", None, 1),
            offload=_offload(spec),
            vllm_version=_str(spec, "vllmVersion", "spec", api.IMAGE_VLLM_VERSION),
        ),
        replicas=_int(spec, "replicas", "spec", 1, 0),
        image=image,
        image_pull_policy=_str(spec, "imagePullPolicy", "spec", None, PULL_POLICIES),
        image_pull_secrets=tuple(pull_secrets),
        resources=_resources(spec),
        node_selector=dict(selector),
        tolerations=check_tolerations(spec.get("tolerations")),
        affinity=check_affinity(affinity),
        extra_args=(extra := _extra_args(spec)),
        max_model_len=_max_model_len(extra),
        env=_env(spec, reserved),
        **_exposure(spec),
        routing=_routing(spec),
        compile_cache=_compile_cache(spec, image),
    )


def _compile_cache(spec: Mapping[str, Any], image: str) -> CompileCacheClaim | None:
    where = "spec.compileCache"
    if spec.get("compileCache") is None:
        return None
    obj = _mapping(spec.get("compileCache"), where)
    known_fields(obj, frozenset({"claimName"}), where)
    name = obj.get("claimName")
    if not isinstance(name, str) or not name:
        raise InvalidSpec(f"{where}.claimName is required: the PersistentVolumeClaim the replicas share")
    if not ours(image):
        raise InvalidSpec(f"{where} needs Spillway's vLLM image ({names.VLLM_IMAGE_REPOSITORY}): its entrypoint "
                          f"seeds each pod's compile cache from the claim and publishes to it, and image {image} "
                          "is another; drop compileCache or the image")
    return CompileCacheClaim(object_name(name, f"{where}.claimName", "PersistentVolumeClaim"))


def _routing(spec: Mapping[str, Any]) -> RoutingSpec:
    result = parse_routing(spec)
    check_events_args(tuple(a for a in _list(spec, "extraArgs", "spec") if isinstance(a, str)), result.mode)
    env_names = {e.get("name") for e in _list(spec, "env", "spec") if isinstance(e, Mapping)}
    if result.publishes_events and api.ENV_PYTHONHASHSEED in env_names:
        raise InvalidSpec(f"spec.env sets {api.ENV_PYTHONHASHSEED}, which routing.mode {result.mode} fixes: every "
                          "replica must hash prefixes alike")
    return result


def _exposure(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Who may reach the server: the API key Secret and the NetworkPolicy's client namespaces."""
    key = spec.get("apiKeySecretRef")
    policy = _mapping(spec.get("networkPolicy"), "spec.networkPolicy")
    known_fields(policy, frozenset({"enabled", "namespaceSelector"}), "spec.networkPolicy")
    clients = policy.get("namespaceSelector")
    return {
        "api_key_secret": _key_ref(key, "spec.apiKeySecretRef", DEFAULT_API_KEY_KEY, "Secret") if key is not None else None,
        "network_policy": _bool(policy, "enabled", "spec.networkPolicy", True),
        "client_namespaces": _mapping(clients, "spec.networkPolicy.namespaceSelector") if clients is not None else None,
    }
