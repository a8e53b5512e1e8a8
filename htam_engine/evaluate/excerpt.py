"""Point an error at a line of the user's file and quote the lines around it."""

from __future__ import annotations

import re

_GUTTER = re.compile(r"^\s*(\d+)\s*\|\s?(.*)$")
_LOCATION = re.compile(r":(\d+):\d+: (?:fatal )?error|\((\d+)\): error")
_LINE_WORD = re.compile(r"\bline (\d+)")
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)
_BUILD_PATH = re.compile(r"\S*/(kernel\.\w+|main\.\w+)")
CONTEXT = 2
# Where a compiler line says it is: nvcc's `file(12): error`, g++'s `file:12:3: error`,
# `In file included from file:3`, `file: In function ...`.
_WHERE = re.compile(
    r"^\s*(?:In file included from|from)\s+(?P<inc>[^\s:]+):\d+"
    r"|^(?P<edg>[^\s(]+)\(\d+\): "
    r"|^(?P<gcc>[^\s:]+):\d+(?::\d+)?: "
    r"|^(?P<scope>[^\s:]+): (?:In |At )"
)
# The files a build writes from the candidate's own text (load_inline, load_cpp, nvcc)
BUILD_NAMES = frozenset({"kernel.cu", "kernel.cpp", "main.cpp", "cuda.cu"})
MAX_LOG = 20_000


def around(source: str, line: int | None) -> str:
    """`source` lines near `line`, numbered as in the file, the line itself marked `>`."""
    if not line:
        return ""
    lines = source.splitlines()
    first, last = max(1, line - CONTEXT), min(len(lines), line + CONTEXT)
    return "\n".join(
        f"{'>' if number == line else ' '}{number:5d} | {lines[number - 1]}"
        for number in range(first, last + 1)
    )


def first_line_number(detail: str) -> int | None:
    match = _LINE_WORD.search(detail)
    return int(match.group(1)) if match else None


def _located(line: str) -> str | None:
    where = _WHERE.match(line)
    if where is None:
        return None
    return next(path for path in where.groups() if path is not None)


def own_lines(log: str, own: frozenset[str] | set[str] = BUILD_NAMES) -> str:
    """The lines of a compiler log about the candidate's own files (`own`: names as the
    compiler prints them, or the base names of absolute paths): a diagnostic
    located in any other file is dropped with the lines that follow it (the compiler
    quotes that file's text there), up to the next located line. Capped at `MAX_LOG`."""
    kept: list[str] = []
    mine = True
    for line in log.splitlines():
        path = _located(line)
        if path is not None:
            mine = path.removeprefix("./") in own or (
                path.startswith("/") and path.rsplit("/", 1)[-1] in own
            )
        if mine:
            kept.append(line)
    return "\n".join(kept)[:MAX_LOG]


def first_error(log: str) -> str:
    """The first line of a compiler log that reports an error in the candidate's own
    files (`own_lines`)."""
    for line in own_lines(log).splitlines():
        if _ERROR.search(line):
            return _BUILD_PATH.sub(r"\1", line.strip())[:400]
    return ""


def line_from_log(log: str, source: str) -> int | None:
    """The user's line for the first compiler error. Compilers quote the offending line
    under the message (g++: `   12 | code`, nvcc: the bare line); embedded sources keep
    their text, so find that text in the user's file."""
    if not log:
        return None
    by_text: dict[str, int] = {}
    for number, text in enumerate(source.splitlines(), 1):
        by_text.setdefault(text.strip(), number)
    lines = log.splitlines()
    for index, text in enumerate(lines):
        where = _LOCATION.search(text)
        if not where:
            continue
        following = lines[index + 1 : index + 6]
        if where.group(2):  # nvcc quotes the code on the next line, without a gutter
            quoted = following[0].strip() if following else ""
            return by_text.get(quoted)
        for quoted in following:
            gutter = _GUTTER.match(quoted)
            if gutter and gutter.group(1) == where.group(1):
                return by_text.get(gutter.group(2).strip())
    return None
