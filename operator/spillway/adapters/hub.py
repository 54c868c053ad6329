"""Optional fetch of a model's config.json from the Hugging Face hub.

Only used when the catalog does not know a model, a token is available
(HF_TOKEN) and the caller allows it; tests point HF_ENDPOINT at a local server.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..core.errors import ModelGeometryUnknown
from ..core.model_source import MAX_CONFIG_BYTES, parse_config_text

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
    request = urllib.request.Request(url)
    # Unredirected: urllib would copy a plain header to wherever a redirect points; the handler below
    # sends it again only to the origin it was meant for.
    request.add_unredirected_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.build_opener(_SameOriginAuth).open(request, timeout=TIMEOUT_S) as response:
            body = response.read(MAX_CONFIG_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ModelGeometryUnknown(f"fetching {url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ModelGeometryUnknown(f"fetching {url}: {reason}") from exc
    return parse_config_text(body, url)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects; keep the token for redirects within the hub's own origin only (a CDN never sees it)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        token = req.unredirected_hdrs.get("Authorization")
        if new is not None and token and _origin(newurl) == _origin(req.full_url):
            new.add_unredirected_header("Authorization", token)
        return new
