"""Spillway's vLLM plugin (`vllm.general_plugins` entry point `spillway`): the two changes no vLLM seam reaches.

vLLM runs every general plugin in each of its processes before they start work (vllm/plugins/__init__.py,
load_general_plugins; the API server runs it while it builds the engine config). This one replaces two functions
on the API server's time-to-first-token path, each only where the function it replaces reads as in the releases
verified (source_guard.py; PATCHES.md entries 6 and 7), and otherwise logs once and leaves the stock function:

- the detokenizer window (`FastIncrementalDetokenizer.__init__`, vllm/v1/engine/detokenizer.py): each request's
  decode stream is primed with the prompt's last tokens, from a token where the prompt's text splits cleanly,
  instead of the whole prompt, which the stream's first step decodes twice (33-38 ms at 131,008 tokens on the
  2-core CPU machine against 0.1-0.3 ms: bench/detokenizer_window.py). detokenizer_window.py says why the text
  is the same.
- the request-body parse (starlette's `Request.json`, which FastAPI reads every body with): orjson where it reads
  the body as json.loads does, json.loads otherwise (~15 ms of the API server's ~37 ms for a 131,008-token prompt
  sent as token ids: bench/json_body.py). json_body.py says where the two could differ.

Set SPILLWAY_VLLM_PLUGIN=off to leave both stock (or leave `spillway` out of vLLM's VLLM_PLUGINS allowlist).
Loading twice is harmless: each replacement is marked and installed once.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from spillway_connector.source_guard import logger, verified

PLUGIN_ENV = "SPILLWAY_VLLM_PLUGIN"
_MARK = "_spillway_replacement"

# vLLM 0.26.0, 0.32.0, 0.33.0 and 0.34.0 read the same (vllm/v1/engine/detokenizer.py).
DETOKENIZER_CODE = {"FastIncrementalDetokenizer.__init__": frozenset({"0e60e735e8e31087"})}
# starlette 1.10.0 (the tests' venv; vLLM 0.32-0.34 ask for starlette>=1.0.1): starlette/requests.py.
REQUEST_JSON_CODE = {"Request.json": frozenset({"c666e5c7f52d3139"})}


class _WindowedRequest:
    """The request as FastIncrementalDetokenizer.__init__ reads it, with the prompt's window as its prompt ids
    (the guarded __init__ reads prompt_token_ids only to prime the stream)."""

    __slots__ = ("_request", "prompt_token_ids")

    def __init__(self, request: Any, window: list[int]):
        self._request = request
        self.prompt_token_ids = window

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def install_detokenizer_window(detokenizer: Any = None) -> bool:
    """Replace FastIncrementalDetokenizer.__init__ where it reads as verified; whether the window is on.
    `detokenizer`: the module (default vLLM's vllm.v1.engine.detokenizer)."""
    if detokenizer is None:
        from vllm.v1.engine import detokenizer

    from spillway_connector.detokenizer_window import prompt_window

    cls = detokenizer.FastIncrementalDetokenizer
    original = cls.__init__
    if getattr(original, _MARK, False):
        return True
    if not verified("the detokenizer window (plugin.py)", {"FastIncrementalDetokenizer.__init__": original},
                    DETOKENIZER_CODE):
        return False

    @functools.wraps(original)
    def __init__(self: Any, tokenizer: Any, request: Any) -> None:
        prompt = request.prompt_token_ids
        params = request.sampling_params
        if prompt is not None and params is not None:
            window = prompt_window(tokenizer._tokenizer, prompt, params.skip_special_tokens)
            if window is not prompt:
                request = _WindowedRequest(request, window)
        original(self, tokenizer, request)

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__
    return True


def install_fast_json_body(requests: Any = None) -> bool:
    """Replace starlette's Request.json where it reads as verified; whether the orjson read is on.
    `requests`: the module (default starlette.requests)."""
    if requests is None:
        try:
            from starlette import requests
        except ImportError:
            return False
    from spillway_connector.json_body import MISS, orjson_loads

    original = requests.Request.json
    if getattr(original, _MARK, False):
        return True
    if not verified("the request-body parse (plugin.py)", {"Request.json": original}, REQUEST_JSON_CODE):
        return False

    @functools.wraps(original)
    async def json(self: Any) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            parsed = orjson_loads(body)
            # starlette's own call, looked up as its Request.json looks it up (the module's global `json`)
            self._json = requests.json.loads(body) if parsed is MISS else parsed
        return self._json

    setattr(json, _MARK, True)
    requests.Request.json = json
    return True


def _log_with_vllm() -> None:
    """The package's log lines go where vLLM's go, in vLLM's format (vllm/logger.py configures the `vllm` logger
    only); tests and other hosts keep Python's defaults."""
    import logging

    vllm_logger = logging.getLogger("vllm")
    if not logger.handlers and vllm_logger.handlers:
        for handler in vllm_logger.handlers:
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def register() -> None:
    """The entry point: vLLM calls it in each process; a failure leaves vLLM stock and says so."""
    if os.environ.get(PLUGIN_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return
    _log_with_vllm()
    on = []
    for install, what in ((install_detokenizer_window, "the detokenizer window"),
                          (install_fast_json_body, "the request-body parse")):
        try:
            if install():
                on.append(what)
        except Exception:  # noqa: BLE001 - the stock function stays; the engine starts as without the plugin
            logger.exception("spillway_connector: %s failed; the stock code runs", install.__name__)
    import spillway_connector

    logger.info("spillway_connector %s plugin loaded from %s: %s on", spillway_connector.__version__,
                os.path.dirname(spillway_connector.__file__), ", ".join(on) or "nothing")
