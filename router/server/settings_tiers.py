"""The tiers' settings (local replicas, frontier entries) and the run-identity knobs of the sidecar;
part of :mod:`router.server.settings` (documented there, re-exported from it)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from router.policy.deployment import FrontierPrices

__all__ = [
    "ProtocolName",
    "SettingsError",
    "StrictModel",
    "LocalTier",
    "FrontierTier",
    "IdentitySettings",
    "root_url",
]

ProtocolName = Literal["chat", "responses", "messages"]
_ALL_PROTOCOLS: tuple[ProtocolName, ...] = ("chat", "responses", "messages")


class SettingsError(ValueError):
    """The configuration cannot be used; the message is one line meant for a person."""


def root_url(url: str) -> str:
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalTier(StrictModel):
    urls: list[str] = Field(min_length=1)
    model: str = "local-model"
    protocols: list[ProtocolName] = Field(default_factory=lambda: list(_ALL_PROTOCOLS), min_length=1)
    models: list[str] = Field(default_factory=list)  # client model names (fnmatch) the local tier accepts
    names: list[str] | None = None
    max_context: int = Field(default=32768, gt=0)
    api_key_env: str | None = None  # optional key for a vLLM started with --api-key
    prefill_s_per_token: float = Field(default=0.0001, ge=0)
    ttft_base_s: float = Field(default=0.02, ge=0)
    # KV cache size of one replica in tokens; None = read vllm:cache_config_info from /metrics
    kv_cache_tokens: int | None = Field(default=None, gt=0)
    # a replica's price in USD per GPU-hour (0 = the learned policy's local_gpu_usd_per_hour)
    gpu_usd_per_hour: float = Field(default=0.0, ge=0)
    # the prefix index (router.core.prefix_index, approximate mode, chat requests): on/off, its
    # character block (tokens x 4 characters) and each replica's KV size in tokens when
    # ``kv_cache_tokens`` is unset (the index's LRU capacity)
    prefix_index: bool = True
    prefix_block_chars: int = Field(default=1024, ge=4)
    prefix_index_tokens: int = Field(default=262144, gt=0)
    # with store.kind redis: share the index between router replicas (router.server.state.prefix_share)
    prefix_share: bool = True
    # the index's precise mode (router.core.prefix_precise, router.server.state.kv_events): token blocks
    # of prefix_block_tokens (vLLM's --block-size) from the model's tokenizer folder
    # (tokenizer.json + tokenizer_config.json), each replica's blocks from its KV events (one ZMQ
    # endpoint per url, None = that replica stays approximate); "approximate" ignores the rest
    prefix_index_mode: Literal["approximate", "precise"] = "approximate"
    prefix_tokenizer: str | None = None
    prefix_block_tokens: int = Field(default=16, ge=1)
    kv_events_endpoints: list[str | None] = Field(default_factory=list)
    kv_events_replay_endpoints: list[str | None] = Field(default_factory=list)
    kv_events_topic: str = ""
    kv_events_silence_s: float = Field(default=30.0, gt=0)
    # post-hoc token uncertainty (router.server.hotpath.posthoc): ask a local replica for
    # ``logprobs`` on chat steps whose client did not (stripped from the client's answer again);
    # ``low_confidence_nll``: a step whose mean negative logprob per token exceeds it posts the
    # ``low_confidence`` signal (None = logged only; weigh it through policy.trouble_boost)
    request_logprobs: bool = False
    low_confidence_nll: float | None = Field(default=None, gt=0)

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return [root_url(u) for u in v]

    def serves(self, name: str) -> bool:
        from fnmatch import fnmatchcase

        return any(fnmatchcase(name, p) for p in self.models)

    @model_validator(mode="after")
    def _names(self) -> LocalTier:
        if self.names is None:
            self.names = [f"local-{i}" for i in range(len(self.urls))]
        if len(self.names) != len(self.urls) or len(set(self.names)) != len(self.names):
            raise ValueError("local.names must be unique and one per url")
        if self.prefix_index_mode == "precise" and not self.prefix_tokenizer:
            raise ValueError(
                "local.prefix_index_mode precise needs local.prefix_tokenizer (the model's folder)"
            )
        for f in ("kv_events_endpoints", "kv_events_replay_endpoints"):
            if len(getattr(self, f)) > len(self.urls):
                raise ValueError(f"local.{f}: at most one per url")
        return self


class FrontierTier(StrictModel, FrontierPrices):
    """One frontier backend; its prices per 1M tokens (``price_in_per_m``, ``price_cached_in_per_m``,
    ``price_cache_write_per_m``, ``price_out_per_m``) are the deployment description's
    :class:`~router.policy.deployment.FrontierPrices`."""

    model_config = ConfigDict(extra="forbid")

    url: str
    kind: Literal["openai", "anthropic", "azure", "openai-compatible"] = "openai"
    model: str = "frontier-model"
    name: str = "frontier"
    models: list[str] = Field(default_factory=list)  # requested names / fnmatch patterns mapped here
    pass_model: bool = False  # send the client's model name (matched by ``models``) instead of ``model``
    default: bool = False
    api_key_env: str | None = "OPENAI_API_KEY"
    allow_no_key: bool = False  # only for loopback fakes
    max_context: int = Field(default=131072, gt=0)
    ttft_base_s: float = Field(default=0.4, ge=0)
    # azure
    deployment: str | None = None
    api_version: str = "2024-10-21"
    # openai-compatible: paths under url (None = not served), auth header and scheme ("" = raw key)
    chat_path: str | None = "/v1/chat/completions"
    responses_path: str | None = None
    auth_header: str = "authorization"
    auth_scheme: str = "Bearer"
    # anthropic
    anthropic_version: str = "2023-06-01"

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return root_url(v)

    @model_validator(mode="after")
    def _key(self) -> FrontierTier:
        if self.kind == "azure" and not self.deployment:
            raise ValueError("frontier kind 'azure' needs deployment")
        if self.kind == "openai-compatible" and self.chat_path is None and self.responses_path is None:
            raise ValueError("frontier kind 'openai-compatible' needs chat_path and/or responses_path")
        if not self.allow_no_key:
            if not self.api_key_env:
                raise ValueError("frontier.api_key_env must name the env var holding the API key")
            if not os.environ.get(self.api_key_env):
                raise ValueError(
                    f"frontier tier configured but env var {self.api_key_env} is unset or empty "
                    "(set it, or allow_no_key: true for a loopback fake)"
                )
        return self

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def endpoints(self) -> tuple[dict[str, str], dict[str, str]]:
        """``(protocol -> URL, headers)`` of this frontier (module docstring, ``kind``)."""
        key = self.api_key()
        hdr = {"content-type": "application/json"}
        u = self.url
        if self.kind == "anthropic":
            if key:
                hdr["x-api-key"] = key
            hdr["anthropic-version"] = self.anthropic_version
            return {"messages": u + "/v1/messages"}, hdr
        if self.kind == "azure":
            if key:
                hdr["api-key"] = key
            base = f"{u}/openai/deployments/{self.deployment}"
            q = f"?api-version={self.api_version}"
            return {"chat": f"{base}/chat/completions{q}", "responses": f"{u}/openai/responses{q}"}, hdr
        if key:
            hdr[self.auth_header.lower()] = f"{self.auth_scheme} {key}".strip() if self.auth_scheme else key
        if self.kind == "openai":
            return {"chat": u + "/v1/chat/completions", "responses": u + "/v1/responses"}, hdr
        urls = {}
        if self.chat_path:
            urls["chat"] = u + "/" + self.chat_path.lstrip("/")
        if self.responses_path:
            urls["responses"] = u + "/" + self.responses_path.lstrip("/")
        return urls, hdr

    def serves(self, name: str) -> bool:
        """Whether a client's requested model name maps to this entry (``models`` patterns)."""
        from fnmatch import fnmatchcase

        return any(fnmatchcase(name, p) for p in self.models)


class IdentitySettings(StrictModel):
    """Run identity and lifecycle knobs (the module docstring says how the defaults were derived)."""

    idle_end_s: float = Field(default=900.0, gt=0)
    reopen_gap_s: float = Field(default=600.0, gt=0)
    sweep_s: float = Field(default=15.0, ge=0)
    response_store_entries: int = Field(default=20000, gt=0)
    session_header: str = "x-claude-code-session-id"
