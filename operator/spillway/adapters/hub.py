"""Optional fetch of a model's config.json from the Hugging Face hub.

Only used when the catalog does not know a model, a token is available
(HF_TOKEN) and the caller allows it; tests point HF_ENDPOINT at a local server.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..core.errors import ModelGeometryUnknown

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 10


def config_url(model_id: str, revision: str = "main", endpoint: str | None = None) -> str:
    base = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    return f"{base}/{urllib.parse.quote(model_id)}/resolve/{urllib.parse.quote(revision, safe='')}/config.json"


def fetch_config(model_id: str, revision: str = "main", token: str | None = None,
                 endpoint: str | None = None) -> dict[str, Any]:
    token = token or os.environ.get("HF_TOKEN")
    if not token:
        raise ModelGeometryUnknown(
            f"model {model_id!r} is not in Spillway's catalog and no HF_TOKEN is set to fetch its config.json"
        )
    url = config_url(model_id, revision, endpoint)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise ModelGeometryUnknown(f"fetching {url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ModelGeometryUnknown(f"fetching {url}: {reason}") from exc
    try:
        config = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ModelGeometryUnknown(f"{url}: malformed JSON: {exc.msg}") from exc
    if not isinstance(config, dict):
        raise ModelGeometryUnknown(f"{url}: config.json is not a JSON object")
    return config
