"""``--config FILE`` and ``--show-config`` of every command that acts for a deployment.

The file is the one ``runroute serve --config FILE`` serves from (``runroute.example.yaml``); its
deployment part (:class:`router.policy.deployment.Deployment`: frontier prices, GPU-hour price,
node profile, KV size, replicas, SLOs, admission) is read without the serving-only checks, so a
planning machine without the frontier's API key answers for the same deployment.

Algorithm: each value is resolved, highest priority first, from a command-line flag (only when
it was given on the command line: click's parameter source), an environment variable
``RUNROUTE_<SECTION>__<FIELD>`` (as the sidecar reads them: env wins over the file), the file,
else the default of :mod:`router.policy.defaults`. :func:`resolve` returns the deployment and the
source of every value; ``--show-config`` prints them (:meth:`Resolved.lines`) and exits 0. A file
that cannot be read or holds a bad value exits 2 with one line (:class:`runroute.errors.CliError`).

Knobs: none; the keys are the fields of :class:`~router.policy.deployment.Deployment`, dotted
(``frontier.price_in_per_m``, ``gpu_hour_usd``, ``node.kv_cache_gb``, ``replicas``, ``slo.ttft_s``,
``admission.slo_short_step_s``, ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import typer
import yaml
from pydantic import ValidationError

from router.policy.deployment import Deployment, default_frontier_entry
from router.policy.types import BackendState
from runroute.errors import CliError

__all__ = [
    "CONFIG_HELP",
    "SHOW_HELP",
    "Resolved",
    "resolve",
    "given",
    "deployment_for",
    "priced_backends",
]

CONFIG_HELP = "deployment file (the runroute.yaml `serve --config` serves from); flags override it"
SHOW_HELP = "print every resolved deployment value with its source (default/file/env/flag) and exit"


@dataclass(frozen=True)
class Resolved:
    """A resolved deployment, the flat value of each key and where it came from."""

    deployment: Deployment
    values: dict[str, object]
    sources: dict[str, str]

    def stated(self, key: str) -> bool:
        """Whether ``key`` came from the file, the environment or a flag (not a default)."""
        return self.sources[key] != "default"

    def stated_fields(
        self, section: str, exclude: set[str] | frozenset[str] = frozenset()
    ) -> dict[str, object]:
        """The fields of ``section`` (e.g. ``admission``) that a file, env or flag set, with their
        resolved values (a nested field counts when any of its leaves was set)."""
        model = getattr(self.deployment, section)
        out: dict[str, object] = {}
        for key, src in self.sources.items():
            head, _, rest = key.partition(".")
            name = rest.split(".")[0]
            if head == section and src != "default" and name not in exclude:
                out[name] = getattr(model, name)
        return out

    def lines(self) -> list[str]:
        width = max(len(k) for k in self.values)
        return [f"{k:<{width}}  {_fmt(v):<12}  {self.sources[k]}" for k, v in self.values.items()]


def given(ctx: typer.Context, param: str) -> bool:
    """Whether ``param`` was set on the command line (not its default). Compared by name: typer may
    bring its own copy of click's ``ParameterSource``."""
    src = ctx.get_parameter_source(param)
    return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")


def resolve(config: Path | None, flags: Mapping[str, tuple[str, object]] | None = None) -> Resolved:
    """The deployment of ``config`` (None: defaults) under RUNROUTE_* env, then ``flags``
    (``key -> (flag name, value)``, only the flags given on the command line)."""
    file_data = _read(config) if config is not None else {}
    env_data = _env_tree()
    data = _merge(file_data, env_data)
    try:
        base = Deployment.from_mapping(data)
        dumped = base.model_dump()
        flags = dict(flags or {})
        for key, (_flag, value) in flags.items():
            _put(dumped, key.split("."), value)
        dep = Deployment.model_validate(dumped)
    except (ValidationError, ValueError, TypeError) as e:
        raise CliError(_one_line(e, config)) from None
    values = _flat(dep.model_dump())
    sources = {}
    for key in values:
        if key in flags:
            sources[key] = f"flag {flags[key][0]}"
            continue
        sources[key] = _source(key, data, env_data, config)
    return Resolved(dep, values, sources)


def deployment_for(
    config: Path | None, show: bool, flags: Mapping[str, tuple[str, object]] | None = None
) -> Resolved:
    """:func:`resolve`, and with ``show`` print the values with their sources and exit 0."""
    r = resolve(config, flags)
    if show:
        typer.echo(f"deployment ({'config ' + str(config) if config else 'no --config: defaults'})")
        for line in r.lines():
            typer.echo("  " + line)
        raise typer.Exit(0)
    return r


def priced_backends(r: Resolved, backends: list[BackendState]) -> list[BackendState]:
    """Replay's backends at the deployment's prices: each frontier at the default frontier's, each
    local replica at the GPU-hour price when the deployment states one (else 0: the policy's own)."""
    f, gpu = r.deployment.frontier, r.deployment.gpu_hour_usd
    out = []
    for b in backends:
        if b.tier == "frontier":
            b = replace(
                b,
                price_in_per_m=f.price_in_per_m,
                price_cached_in_per_m=f.price_cached_in_per_m,
                price_out_per_m=f.price_out_per_m,
            )
        elif r.stated("gpu_hour_usd"):
            b = replace(b, gpu_usd_per_hour=gpu)
        out.append(b)
    return out


def _read(path: Path) -> dict[str, object]:
    if not path.is_file():
        raise CliError(f"config file not found: {path}")
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise CliError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None
    if not isinstance(loaded, dict):
        raise CliError(f"{path}: top level must be a mapping")
    return loaded


def _env_tree() -> dict[str, object]:
    """RUNROUTE_A__B=v as ``{"a": {"b": v}}`` (values parsed as YAML: numbers, booleans, lists)."""
    out: dict[str, object] = {}
    for k, v in os.environ.items():
        if not k.upper().startswith("RUNROUTE_") or k.upper() in ("RUNROUTE_DEBUG", "RUNROUTE_NATIVE"):
            continue
        path = k[len("RUNROUTE_") :].lower().split("__")
        try:
            val = yaml.safe_load(v)
        except yaml.YAMLError:
            val = v
        _put(out, path, val)
    return out


def _put(d: dict[str, object], path: list[str], value: object) -> None:
    for p in path[:-1]:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            d[p] = nxt
        d = nxt
    d[path[-1]] = value


def _get(d: object, path: tuple[str | int, ...]) -> tuple[bool, object]:
    for p in path:
        if isinstance(p, int):
            if not isinstance(d, list) or p >= len(d):
                return False, None
            d = d[p]
        elif isinstance(d, Mapping) and p in d:
            d = d[p]
        else:
            return False, None
    return True, d


def _merge(a: Mapping[str, object], b: Mapping[str, object]) -> dict[str, object]:
    out = dict(a)
    for k, v in b.items():
        old = out.get(k)
        out[k] = _merge(old, v) if isinstance(v, Mapping) and isinstance(old, Mapping) else v
    return out


def _flat(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _paths(key: str, data: Mapping[str, object]) -> list[tuple[str | int, ...]]:
    """Where in a sidecar config ``key`` is read from, in the order the resolution tries them."""
    parts = tuple(key.split("."))
    if parts[0] == "frontier":
        entry = default_frontier_entry(data)
        if entry is None:
            return []
        if entry is data.get("frontier"):
            return [("frontier", *parts[1:])]
        many = data.get("frontiers")
        idx = next(i for i, e in enumerate(many) if e is entry) if isinstance(many, list) else 0
        return [("frontiers", idx, *parts[1:])]
    if key == "gpu_hour_usd":
        found, own = _get(data, ("local", "gpu_usd_per_hour"))
        local = [("local", "gpu_usd_per_hour")] if found and _positive(own) else []
        return [*local, ("policy", "local_gpu_usd_per_hour")]
    if key == "replicas":
        return [("node", "replicas"), ("local", "urls")]
    return [parts]


def _positive(v: object) -> bool:
    try:
        return float(v) > 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _source(key: str, data: Mapping[str, object], env: Mapping[str, object], config: Path | None) -> str:
    for path in _paths(key, data):
        found, value = _get(data, path)
        if not found or value is None:
            continue
        top = str(path[0])
        if _get(env, path)[0] or (top in env and not isinstance(env[top], Mapping)):
            return "env RUNROUTE_" + "__".join(str(p) for p in path if isinstance(p, str)).upper()
        shown = ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")
        return f"file {config} ({shown})"
    return "default"


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if v is None:
        return "unset"
    if isinstance(v, tuple | list):
        return ",".join(_fmt(x) for x in v)
    return str(v)


def _one_line(e: Exception, path: Path | None) -> str:
    where = f"{path}: " if path else ""
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "config"
        more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        return f"{where}invalid config: {loc}: {str(err.get('msg', '')).removeprefix('Value error, ')}{more}"
    return f"{where}invalid config: {e}"
