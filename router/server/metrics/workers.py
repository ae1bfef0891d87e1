"""One ``/metrics`` view over the worker processes of ``runroute serve --workers N``.

Algorithm: every worker writes its own series (:meth:`RouterMetrics.render`, Prometheus text) to
``<dir>/metrics-<pid>.prom`` every ``every_s`` seconds (a daemon thread; written to a temp file and
renamed, so a reader never sees half a file) and once more when it stops. A scrape reaches one
worker; that worker parses its own fresh series and the other workers' latest files (files of pids
no longer alive are skipped) and answers the merge: counters and histograms (``_bucket``, ``_sum``,
``_count``) summed over the workers, sample by sample with the same labels; gauges kept per worker
with a ``pid`` label (a sum is wrong for gauges that state a value, e.g. the bundle's info gauge).
A counter of a worker lags by at most ``every_s`` in another worker's answer.

Knobs: ``dir`` (a folder the workers share; the supervisor makes a fresh one per start), ``every_s``
(1 s).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from router.server.runs.log_writer import pid_alive

if TYPE_CHECKING:
    from router.server.metrics.registry import RouterMetrics

__all__ = ["WorkerMetrics", "merge_expositions"]


def merge_expositions(texts: dict[int, str]) -> list[Metric]:
    """The families of several workers' Prometheus text expositions (``{pid: text}``), merged as the
    module docstring says."""
    fams: dict[str, Metric] = {}
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for pid, text in sorted(texts.items()):
        for fam in text_string_to_metric_families(text):
            out = fams.get(fam.name)
            if out is None:
                out = fams[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                sums[fam.name] = {}
            for s in fam.samples:
                if fam.type == "gauge":
                    out.add_sample(s.name, {**s.labels, "pid": str(pid)}, s.value)
                else:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    sums[fam.name][key] = sums[fam.name].get(key, 0.0) + s.value
    for name, by_key in sums.items():
        for (sname, labels), v in by_key.items():
            fams[name].add_sample(sname, dict(labels), v)
    return list(fams.values())


class _Merged:
    def __init__(self, fams: list[Metric]):
        self.fams = fams

    def collect(self) -> Iterator[Metric]:
        yield from self.fams


class WorkerMetrics:
    """A worker's share of the merged view; ``render`` replaces the app's ``metrics.render``."""

    def __init__(self, metrics: RouterMetrics, dir: Path, every_s: float = 1.0):
        self.metrics, self.dir, self.every_s = metrics, Path(dir), every_s
        self.pid = os.getpid()
        self._own_render = metrics.render
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _own_text(self) -> str:
        body, _ = self._own_render(None)
        return bytes(body).decode()

    def write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".metrics-{self.pid}.tmp"
        tmp.write_text(self._own_text())
        tmp.replace(self.dir / f"metrics-{self.pid}.prom")

    def start(self) -> WorkerMetrics:
        self.write()

        def loop() -> None:
            while not self._stop.wait(self.every_s):
                try:
                    self.write()
                except OSError:  # a full disk: the next round tries again
                    pass

        self._thread = threading.Thread(target=loop, name="runroute-metrics-share", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        try:
            self.write()
        except OSError:
            pass

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type): this worker's series merged with the other live workers' files."""
        texts = {self.pid: self._own_text()}
        for f in self.dir.glob("metrics-*.prom"):
            try:
                pid = int(f.stem.split("-", 1)[1])
            except ValueError:
                continue
            if pid == self.pid or not pid_alive(pid):
                continue
            try:
                texts[pid] = f.read_text()
            except OSError:
                continue
        encoder, content_type = choose_encoder(accept or "")
        return encoder(_Merged(merge_expositions(texts))), content_type  # type: ignore[arg-type]
