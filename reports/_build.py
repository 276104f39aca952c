"""The report's views built as a graph: each one as soon as the views it reads exist.

Built one after another, the views left one of two cores idle for about a third of
their time (a small statement runs on one thread, and most are small), and the audit's
re-derivations could only start once every view was built. Here each view is a task
whose dependencies are the extractions and views its SQL names; workers, each on a
cursor of its own to the same in-memory database (DuckDB runs statements off the GIL),
take the first ready task in the order given, so the report's chain
(``kv_requests`` → ``kv_measured`` → ``kv_pairs``) goes first and the re-derivations
fill the other core. The tables are the same as the sequential build's: each is one
deterministic statement over tables already complete.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import duckdb


@dataclass
class Task:
    """One statement that creates ``name``, run once everything in ``needs`` exists."""

    name: str
    statement: str
    needs: frozenset[str]
    done: Future[float] = field(default_factory=Future)  # seconds the statement took


def tasks(statements: Sequence[tuple[str, str]]) -> list[Task]:
    """Tasks of ``statements`` (name → statement creating it), in an order where each statement
    reads only names before it or names that exist already: a task needs the earlier names its
    statement mentions as words."""
    made: list[Task] = []
    earlier: set[str] = set()
    for name, statement in statements:
        if name in earlier:
            raise ValueError(f"{name} is built twice")
        mentioned = {other for other in earlier if re.search(rf"\b{re.escape(other)}\b", statement)}
        made.append(Task(name, statement, frozenset(mentioned)))
        earlier.add(name)
    return made


class Build:
    """``tasks`` run on ``cursors`` (one worker thread each), every task as soon as the tasks it
    needs have finished. A failed task fails the tasks that need it, with its error."""

    def __init__(self, tasks: Sequence[Task], cursors: Sequence[duckdb.DuckDBPyConnection]) -> None:
        self.tasks = list(tasks)
        self._by_name = {task.name: task for task in self.tasks}
        self._waiting = list(self.tasks)
        self._finished: set[str] = set()
        self._lock = threading.Condition()
        self._threads = [
            threading.Thread(target=self._work, args=(cursor,), name=f"kvledger-views-{i}", daemon=True)
            for i, cursor in enumerate(cursors)
        ]
        for thread in self._threads:
            thread.start()

    def _next(self) -> Task | None:
        with self._lock:
            while True:
                if not self._waiting:
                    return None
                for index, task in enumerate(self._waiting):
                    failed = [
                        n for n in task.needs if n in self._finished and self._by_name[n].done.exception()
                    ]
                    if failed:
                        del self._waiting[index]
                        self._fail(task, self._by_name[failed[0]].done.exception())
                        break
                    if task.needs <= self._finished:
                        del self._waiting[index]
                        return task
                else:
                    self._lock.wait()

    def _fail(self, task: Task, error: BaseException | None) -> None:
        task.done.set_exception(error or RuntimeError(f"{task.name} was not built"))
        self._finished.add(task.name)
        self._lock.notify_all()

    def _work(self, cursor: duckdb.DuckDBPyConnection) -> None:
        try:
            while (task := self._next()) is not None:
                started = time.perf_counter()
                try:
                    cursor.execute(task.statement)
                except BaseException as exc:  # recorded on the task; whoever waits for it raises
                    with self._lock:
                        self._fail(task, exc)
                    continue
                with self._lock:
                    task.done.set_result(time.perf_counter() - started)
                    self._finished.add(task.name)
                    self._lock.notify_all()
        finally:
            cursor.close()

    def wait(self, names: Iterable[str]) -> float:
        """Wait for ``names``; raise the first error among them; the seconds their statements took."""
        return sum(self._by_name[name].done.result() for name in names)

    def when_done(self, names: Iterable[str]) -> Future[float]:
        """A future of the seconds the statements of ``names`` took, set once all have finished
        (with the first error among them, if any)."""
        waited = [self._by_name[name].done for name in names]
        result: Future[float] = Future()
        remaining = [len(waited)]
        lock = threading.Lock()

        def one_done(_: Future[float]) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            errors = [f.exception() for f in waited if f.exception() is not None]
            if errors:
                result.set_exception(errors[0])
            else:
                result.set_result(sum(f.result() for f in waited))

        if not waited:
            result.set_result(0.0)
        for future in waited:
            future.add_done_callback(one_done)
        return result


def build(
    statements: Sequence[tuple[str, str]], cursor: Callable[[], duckdb.DuckDBPyConnection], workers: int = 2
) -> Build:
    """Start building ``statements`` (name → statement) on ``workers`` cursors made by ``cursor``."""
    return Build(tasks(statements), [cursor() for _ in range(max(1, workers))])
