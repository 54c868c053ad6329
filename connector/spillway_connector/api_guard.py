"""The API key on every route of vLLM's API server, not only on its OpenAI prefixes.

vLLM's own check (`--api-key`, VLLM_API_KEY) guards paths under /v1, /v2, /inference and /cohere only
(GUARDED_PREFIX in vllm/entrypoints/serve/middleware/authenticate.py, 0.33.0 and 0.34.0); the rest of what it
serves answers without a key: /invocations (which dispatches to completions and chat), /tokenize,
/detokenize, /pooling, /classify, /score, /rerank, /generative_scoring, /load, /version, ... The operator
renders `vllm serve --middleware spillway_connector.api_guard.require_api_key` when spec.apiKeySecretRef is
set and the image is Spillway's: vLLM adds a coroutine named by --middleware as an HTTP middleware
(vllm/entrypoints/serve/middleware/register.py), so every HTTP request but OPEN_PATHS needs the key.

Import-light: starlette only (vLLM's API server already runs on it).
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

ENV_API_KEY = "VLLM_API_KEY"  # what the operator sets from spec.apiKeySecretRef (vllm/envs.py reads it too)
# The kubelet's probes and Prometheus's scrape carry no key.
OPEN_PATHS = frozenset({"/health", "/metrics"})


def _digests() -> list[bytes]:
    key = os.environ.get(ENV_API_KEY) or ""
    return [hashlib.sha256(key.encode()).digest()] if key else []


def authorized(authorization: str | None, digests: list[bytes]) -> bool:
    """Whether an Authorization header carries one of the keys (compared as digests, in constant time)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    seen = hashlib.sha256(token.encode()).digest()
    found = False
    for digest in digests:
        found |= hmac.compare_digest(seen, digest)
    return found


async def require_api_key(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Starlette HTTP middleware: 401 for a request without the key, whatever its path (OPEN_PATHS aside).
    The path is the one routing sees (the ASGI scope's, root_path removed), so no spelling of a route
    (`/v1/../invocations`, `%2e%2e`) reaches it around the check. Without a key set it lets all through, as
    vLLM does."""
    digests = _digests()
    if not digests or request.method == "OPTIONS":
        return await call_next(request)
    scope = request.scope
    path = scope["path"].removeprefix(scope.get("root_path", "") or "")
    if path in OPEN_PATHS or authorized(request.headers.get("authorization"), digests):
        return await call_next(request)
    from starlette.responses import JSONResponse

    return JSONResponse({"error": "Unauthorized"}, status_code=401)
