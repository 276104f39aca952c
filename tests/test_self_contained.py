"""The repository speaks of itself alone: no tracked file points outside it or at how it was made.

A user's clone has no shared folder beside it and no reference notes, and
numbered tasks, machines on loan and the tools that reach them, or the people
who happened to share a machine, mean nothing to its readers. Every tracked file
is read, compressed ledger exports (``.xz``) decompressed.
"""

from __future__ import annotations

import lzma
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]

# Spelled (and named) so that this file does not match itself. Matched on lower-cased text.
_WORDS = {
    "shared-folder": r"\.\./shared\b|/work/share[d]\b",
    "numbered-task": r"\b(?:issue|task)s?\s+#?\d{1,2}\b",
    "lent-machine": r"\blent\s+(?:gpu|h200|machine|host|device)s?\b",
    "device-tool": r"\bdevice\s+tools?\b|`run`\s+(?:device\s+)?tool\b|\bgive_bac[k]\b",
    "other-engineers": r"\bother\s+engineers?\b|\bengineers'",
}
# Cheap literal anchors: only lines holding one are matched against the patterns above.
_ANCHORS = (b"shared", b"issue", b"task", b"lent", b"device", b"`run`", b"give_", b"engineer")
_WORDS_RX = re.compile("|".join(f"(?P<w{i}>{p})" for i, p in enumerate(_WORDS.values())).encode())
# Reference notes kept outside the repository, by their exact names (docs/design.md is ours).
_NOTES_RX = re.compile(rb"\b(?:DESIGN|PEERS|ENGINES-CPU|VLLM-LMCACHE-FACTS|NEEDLE-FEASIBILITY)\.md\b")
_WHAT = [*_WORDS, "outside-note"]


def _tracked() -> list[str]:
    """Tracked files; in a copy without git, every file outside hidden and build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
    if names:
        return names
    skip = {"__pycache__", "build", "dist"}
    return [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if p.is_file()
        and not any(
            part.startswith(".") or part in skip or part.endswith(".egg-info")
            for part in p.relative_to(ROOT).parts
        )
    ]


def _near(
    data: bytes, needles: tuple[bytes, ...], rx: re.Pattern[bytes]
) -> Iterator[tuple[int, re.Match[bytes]]]:
    """Matches of ``rx`` close to each needle (export lines are long: never scan a whole one)."""
    for needle in needles:
        at = data.find(needle)
        while at >= 0:
            offset = max(0, at - 48)
            for m in rx.finditer(data, offset, at + len(needle) + 48):
                if m.start() <= at < m.end():
                    yield m.start(), m
            at = data.find(needle, at + 1)


def mentions(data: bytes) -> list[tuple[int, str, str]]:
    """(line number, what, the words) for each mention in ``data``."""
    found = {}
    lower = data.lower()
    for at, m in _near(lower, _ANCHORS, _WORDS_RX):
        what = _WHAT[int(next(k for k, v in m.groupdict().items() if v is not None)[1:])]
        found[at] = (what, m.group(0))
    for at, m in _near(data, (b".md",), _NOTES_RX):
        found[at] = (_WHAT[-1], m.group(0))
    return [
        (data.count(b"\n", 0, at) + 1, what, words.decode("utf-8", "replace"))
        for at, (what, words) in sorted(found.items())
    ]


def test_the_scan_finds_each_kind_of_mention() -> None:
    samples = {
        "shared-folder": "see ../" + "shared/design for the rest",
        "numbered-task": "as Issue " + "7 asked",
        "lent-machine": "measured on a lent " + "H200 machine",
        "device-tool": "through the `run` device " + "tool, kind x",
        "other-engineers": "Other " + "engineers were using the machine",
        "outside-note": "per DESIGN" + ".md's table",
    }
    for what, text in samples.items():
        assert [w for _, w, _ in mentions(("ok\n" + text + "\n").encode())] == [what], what
    assert mentions(b"docs/design.md; LMCache issue 4463; the session's devices; lent-out\n") == []


def test_no_tracked_file_mentions_the_outside() -> None:
    names = _tracked()
    assert len(names) > 100, names
    problems = []
    for name in names:
        data = (ROOT / name).read_bytes()
        if name.endswith(".xz"):
            data = lzma.decompress(data)
        elif b"\0" in data[:8192]:
            continue  # binary: weights, native builds
        problems += [f"{name}:{line}: {what}: {words!r}" for line, what, words in mentions(data)]
    assert not problems, "the repository should speak of itself alone:\n" + "\n".join(problems)
