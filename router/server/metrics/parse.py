"""Parse Prometheus text exposition (a vLLM server's ``/metrics``) into the numbers the router reads.

Algorithm: one pass over the lines. ``#`` lines (HELP/TYPE/comments) are skipped; every other line is
a sample ``name{label="value",...} value [timestamp]``. Label values are read with a small
state machine that honours the escapes ``\\\\``, ``\\"`` and ``\\n``, so commas and braces inside
quoted values do not split labels. A line that does not parse raises :class:`MetricsParseError`
naming the line number (a scrape that returns garbage must not look like an idle server).
:func:`read_vllm_metrics` then sums each metric the router uses over its label sets, optionally
only the series whose ``model_name`` label matches.

Knobs:
- ``model_name`` (:func:`read_vllm_metrics`): keep only series with this ``model_name`` label
  (vLLM labels every series with the served model name; series without the label, such as the
  ``vllm:cache_config_info`` info gauge, are kept); ``None`` sums all series.

No third-party imports: the router scrapes in the background and this stays cheap to import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "MetricsParseError",
    "Sample",
    "VllmMetrics",
    "VLLM_METRIC_NAMES",
    "parse_prometheus_text",
    "read_vllm_metrics",
]

# Every vLLM metric name the router (sidecar scraper, conformance tests) reads. Counters carry
# the ``_total`` suffix as exposed; histograms are listed by base name (``_bucket``/``_sum``/
# ``_count`` series are exposed under them).
VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
VLLM_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
)
VLLM_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
)
# info gauges (value 1): the numbers are in the labels. ``vllm:cache_config_info`` carries the KV
# cache size as ``num_gpu_blocks`` x ``block_size`` (one series per engine).
VLLM_INFO = ("vllm:cache_config_info",)
VLLM_METRIC_NAMES: tuple[str, ...] = VLLM_GAUGES + VLLM_COUNTERS + VLLM_HISTOGRAMS + VLLM_INFO


class MetricsParseError(ValueError):
    """The text is not Prometheus exposition format; the message names the line."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, its labels and its value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """The router's view of one vLLM replica, summed over label sets.

    Histogram fields hold the ``_count`` and ``_sum`` of each histogram (seconds for ``_sum``).
    """

    num_requests_running: float = 0.0
    num_requests_waiting: float = 0.0
    kv_cache_usage_perc: float = 0.0  # 0-1
    prefix_cache_queries_total: float = 0.0  # tokens looked up in the prefix cache
    prefix_cache_hits_total: float = 0.0  # tokens found there
    prompt_tokens_cached_total: float = 0.0  # prompt tokens served from cache (usage cached_tokens)
    # KV cache capacity in tokens: sum over engines of num_gpu_blocks x block_size from
    # vllm:cache_config_info; None when not exposed (or not yet known: num_gpu_blocks="None")
    cache_capacity_tokens: float | None = None
    ttft_count: float = 0.0
    ttft_sum_s: float = 0.0
    e2e_count: float = 0.0
    e2e_sum_s: float = 0.0
    present: frozenset[str] = frozenset()  # the VLLM_METRIC_NAMES seen in the text

    @property
    def prefix_cache_computed_total(self) -> float:
        """Prompt tokens the prefix cache missed (queries - hits): tokens newly computed and written
        into the KV cache since the server started."""
        return self.prefix_cache_queries_total - self.prefix_cache_hits_total

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hits / queries since the server started (0 when nothing was queried)."""
        q = self.prefix_cache_queries_total
        return self.prefix_cache_hits_total / q if q > 0 else 0.0


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_value(text: str, lineno: int) -> float:
    t = text.strip()
    if t in ("+Inf", "Inf"):
        return math.inf
    if t == "-Inf":
        return -math.inf
    try:
        return float(t)  # also accepts NaN
    except ValueError:
        raise MetricsParseError(f"line {lineno}: bad sample value {t!r}") from None


def _parse_labels(line: str, start: int, lineno: int) -> tuple[dict[str, str], int]:
    """Parse ``{a="x",b="y"}`` starting at ``line[start] == '{'``; return labels and the index after '}'."""
    labels: dict[str, str] = {}
    i = start + 1
    n = len(line)
    while True:
        while i < n and line[i] in " \t,":
            i += 1
        if i >= n:
            raise MetricsParseError(f"line {lineno}: unterminated label set")
        if line[i] == "}":
            return labels, i + 1
        eq = line.find("=", i)
        if eq < 0:
            raise MetricsParseError(f"line {lineno}: label without '='")
        key = line[i:eq].strip()
        i = eq + 1
        if i >= n or line[i] != '"':
            raise MetricsParseError(f"line {lineno}: label {key!r} value is not quoted")
        i += 1
        buf: list[str] = []
        while True:
            if i >= n:
                raise MetricsParseError(f"line {lineno}: unterminated label value for {key!r}")
            c = line[i]
            if c == "\\" and i + 1 < n:
                buf.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
                continue
            if c == '"':
                i += 1
                break
            buf.append(c)
            i += 1
        labels[key] = "".join(buf)


def parse_prometheus_text(text: str) -> list[Sample]:
    """All samples in ``text``, in order. Raises MetricsParseError on a malformed line."""
    out: list[Sample] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _parse_labels(line, brace, lineno)
            rest = line[end:].split()
        else:
            parts = line.split()
            name, labels, rest = parts[0], {}, parts[1:]
        if not name or not rest or len(rest) > 2:
            raise MetricsParseError(f"line {lineno}: expected 'name[{{labels}}] value [timestamp]'")
        out.append(Sample(name, labels, _parse_value(rest[0], lineno)))
    return out


def read_vllm_metrics(text: str, model_name: str | None = None) -> VllmMetrics:
    """Sum the router's vLLM metrics over label sets (only ``model_name``'s series when given)."""
    sums: dict[str, float] = {}
    present: set[str] = set()
    wanted = set(VLLM_GAUGES + VLLM_COUNTERS)
    hist_parts = {f"{h}{suffix}": h for h in VLLM_HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    capacity: float | None = None
    for s in parse_prometheus_text(text):
        if s.name in VLLM_INFO:
            if model_name is not None and s.labels.get("model_name", model_name) != model_name:
                continue
            present.add(s.name)
            cap = _cache_tokens(s.labels)
            if cap is not None:
                capacity = cap if capacity is None else capacity + cap
            continue
        if s.name in wanted:
            base = s.name
        elif s.name in hist_parts:
            base = hist_parts[s.name]
        else:
            continue
        if model_name is not None and s.labels.get("model_name", model_name) != model_name:
            continue
        present.add(base)
        if s.name in wanted or s.name.endswith(("_sum", "_count")):
            sums[s.name] = sums.get(s.name, 0.0) + s.value
    return VllmMetrics(
        num_requests_running=sums.get("vllm:num_requests_running", 0.0),
        num_requests_waiting=sums.get("vllm:num_requests_waiting", 0.0),
        kv_cache_usage_perc=sums.get("vllm:kv_cache_usage_perc", 0.0),
        prefix_cache_queries_total=sums.get("vllm:prefix_cache_queries_total", 0.0),
        prefix_cache_hits_total=sums.get("vllm:prefix_cache_hits_total", 0.0),
        prompt_tokens_cached_total=sums.get("vllm:prompt_tokens_cached_total", 0.0),
        ttft_count=sums.get("vllm:time_to_first_token_seconds_count", 0.0),
        ttft_sum_s=sums.get("vllm:time_to_first_token_seconds_sum", 0.0),
        e2e_count=sums.get("vllm:e2e_request_latency_seconds_count", 0.0),
        e2e_sum_s=sums.get("vllm:e2e_request_latency_seconds_sum", 0.0),
        cache_capacity_tokens=capacity,
        present=frozenset(present),
    )


def _cache_tokens(labels: dict[str, str]) -> float | None:
    """``num_gpu_blocks * block_size`` from a ``vllm:cache_config_info`` label set, None if either
    is absent or not a positive number (vLLM writes ``"None"`` before the KV cache is sized)."""
    try:
        blocks = float(labels["num_gpu_blocks"])
        size = float(labels["block_size"])
    except (KeyError, ValueError):
        return None
    if not (blocks > 0 and size > 0) or math.isinf(blocks * size):
        return None
    return blocks * size
