"""Replayable experiments, fixtures, the runner, and targets (see experiments/README.md).

``ledger run screening`` / ``ledger run validation`` / ``ledger run ./mine.py``
and ``ledger replay RUN_ID`` are in :mod:`experiments.commands`; the runner in
:mod:`experiments.runner`; fixtures in :mod:`experiments.fixtures`; the
``Target`` protocol in :mod:`experiments.targets._base`.
"""
