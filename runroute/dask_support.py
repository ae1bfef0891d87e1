"""Dask for the CLI: open a client (a LocalCluster or a scheduler's address) and map tasks on it.

Only ``--dask`` imports this module, and it imports Dask only inside its functions, so a command run
without ``--dask`` never loads Dask (tests/test_dask_cli.py checks ``sys.modules``).

- :func:`dask_client` (a context manager): ``"local"`` starts a :class:`distributed.LocalCluster` on
  127.0.0.1 with ``workers`` worker processes of one thread each (LightGBM and the simulator are
  single-threaded here; processes sidestep the GIL) and prints its dashboard address; any other value
  is a scheduler address (``tcp://HOST:PORT``), and ``workers`` then means "wait until that many
  workers have joined" (``wait_s`` at most).
- :class:`DaskMap`: a drop-in for the builtin ``map`` over pure functions (what-if points, bench
  simulations): the function is one task (shipped once; recomputed if its worker dies), each item
  is one task (a worker killed mid-task loses nothing: the scheduler runs the task again elsewhere,
  up to ``distributed.scheduler.allowed-failures`` worker deaths; ``retries`` = how often a task
  that raised is tried again), results come back in the
  order of the items (so the output is the serial run's) while ``on_done`` is called as each task
  finishes on the cluster (the progress bar follows the scheduler, not the result order).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["dask_client", "DaskMap", "TaskBar", "parse_dask", "progress_bar"]


def parse_dask(value: str | None) -> str | None:
    """``--dask`` value: ``local``, a ``tcp://``/``tls://`` address or ``HOST:PORT``; None = off."""
    if value is None:
        return None
    v = value.strip()
    if v == "local":
        return v
    if "://" not in v:
        if ":" not in v:
            raise ValueError(
                f"--dask: expected 'local' or a scheduler address (tcp://HOST:PORT), got {value!r}"
            )
        v = f"tcp://{v}"
    return v


@contextlib.contextmanager
def dask_client(
    address: str,
    workers: int | None = None,
    *,
    echo: Callable[[str], None] = print,
    memory_limit: str | None = None,
    wait_s: float = 60.0,
) -> Iterator[Any]:
    """A :class:`distributed.Client` on ``address`` (module docstring); closes what it opened."""
    from distributed import Client, LocalCluster

    if address == "local":
        n = workers or 2
        with (
            LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
                memory_limit=memory_limit or "auto",
            ) as cluster,
            Client(cluster) as client,
        ):
            echo(f"dask: LocalCluster with {n} workers x 1 thread; dashboard {cluster.dashboard_link}")
            yield client
        return
    with Client(address, timeout=wait_s) as client:
        if workers:
            client.wait_for_workers(workers, timeout=wait_s)
        n_now = len(client.scheduler_info(n_workers=-1)["workers"])
        echo(f"dask: scheduler {address} with {n_now} workers; dashboard {client.dashboard_link}")
        yield client


class TaskBar:
    """A rich bar over Dask tasks: the total grows as maps submit, it advances as tasks finish."""

    def __init__(self, prog: Any, task: Any) -> None:
        self.prog, self.task, self.total = prog, task, 0

    def submitted(self, n: int) -> None:
        self.total += n
        self.prog.update(self.task, total=self.total)

    def done(self, _i: int) -> None:
        self.prog.update(self.task, advance=1)


@contextlib.contextmanager
def progress_bar(console: Any, what: str) -> Iterator[TaskBar]:
    """A :class:`TaskBar` shown on ``console`` while the block runs."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*cols, console=console, transient=True) as prog:
        yield TaskBar(prog, prog.add_task(what, total=None))


def _identity(x: Any) -> Any:
    return x


def _apply(cls: type | None, item: Any, fn: Callable[[Any], Any]) -> Any:
    """Run ``fn`` on one item (rebuilt from its fields, whose shared futures Dask resolved)."""
    return fn(item if cls is None else cls(**item))


_SMALL = (int, float, str, bool, bytes, type(None))


def _share(client: Any, items: list[Any]) -> tuple[list[type | None], list[Any]]:
    """Dataclass items whose field values (by identity) recur across items: each such value becomes
    one recipe task and the item goes as (its class, its fields with those futures); other items go
    as they are (class None)."""
    plain: list[type | None] = [None] * len(items)
    if len(items) < 2 or not all(dataclasses.is_dataclass(x) and not isinstance(x, type) for x in items):
        return plain, items
    names = [f.name for f in dataclasses.fields(items[0]) if f.init]
    count: dict[int, int] = {}
    for x in items:
        for n in names:
            v = getattr(x, n)
            if not isinstance(v, _SMALL):
                count[id(v)] = count.get(id(v), 0) + 1
    futs: dict[int, Any] = {}
    out = []
    for x in items:
        fields = {}
        for n in names:
            v = getattr(x, n)
            if count.get(id(v), 0) >= 2:
                if id(v) not in futs:
                    futs[id(v)] = client.submit(_identity, v, pure=False)
                v = futs[id(v)]
            fields[n] = v
        out.append(fields)
    return [type(x) for x in items], out


class DaskMap:
    """``map(fn, items)`` as one Dask task per item, results in item order (module docstring)."""

    def __init__(
        self,
        client: Any,
        on_done: Callable[[int], None] | None = None,
        *,
        on_submit: Callable[[int], None] | None = None,
        retries: int = 2,
    ) -> None:
        self.client = client
        self.on_done = on_done
        self.on_submit = on_submit
        self.retries = retries

    def __call__(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        from distributed import as_completed

        todo = list(items)
        if not todo:
            return
        client = self.client
        # the function, and every part that several items share (the workload and run starts of
        # what-if points), each as ONE task (not scattered data): shipped once, fetched from worker
        # to worker, recomputed from its recipe if its worker dies. Embedding a multi-MB workload
        # in every task made the grid slower on 2 workers than serially.
        fn_f = client.submit(_identity, fn, pure=False)
        classes, shipped = _share(client, todo)
        futs = client.map(_apply, classes, shipped, fn=fn_f, pure=False, retries=self.retries)
        if self.on_submit is not None:
            self.on_submit(len(futs))
        where = {f.key: i for i, f in enumerate(futs)}
        done: dict[int, Any] = {}
        nxt = 0
        try:
            for fut, res in as_completed(futs, with_results=True):
                i = where[fut.key]
                done[i] = res
                if self.on_done is not None:
                    self.on_done(i)
                while nxt in done:
                    yield done.pop(nxt)
                    nxt += 1
        finally:
            client.cancel([*futs, fn_f])
