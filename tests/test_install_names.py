"""No text in the repository tells anyone to install `htam`: on PyPI that name is an
unrelated package. This project's distribution is the one pyproject.toml names."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
OLD_NAME = "htam"
# History says what was true then; it is not an instruction.
HISTORY = {"CHANGELOG.md"}

# `pip install htam`, `pip install -U 'htam[ray]'`, `-m pip install htam` ...: the old name
# as a whole requirement (followed by the end, a space, an extra or a quote).
PIP_OLD = re.compile(rf"pip install(?:\s+-\S+)*\s+['\"]?{OLD_NAME}(?=$|[\s\['\"`])", re.MULTILINE)
# `htam[ray]` anywhere: the old name with one of the project's extras.
EXTRAS = "|".join(map(re.escape, PROJECT["optional-dependencies"]))
EXTRA_OLD = re.compile(rf"(?<![\w.-]){OLD_NAME}\[(?:{EXTRAS})\]")


def repository_texts() -> list[Path]:
    """The repository's files (tracked, and new ones git does not ignore) that are text,
    but for this test, whose examples are the old instructions."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    found = []
    for name in filter(None, listed):
        path = ROOT / name.decode()
        if not path.is_file() or name.decode() in HISTORY or path == Path(__file__).resolve():
            continue
        data = path.read_bytes()
        if b"\0" not in data:
            found.append(path)
    return found


def offences(text: str) -> list[str]:
    return [m.group(0) for pattern in (PIP_OLD, EXTRA_OLD) for m in pattern.finditer(text)]


def test_the_distribution_is_not_the_unrelated_htam() -> None:
    assert PROJECT["name"] != OLD_NAME
    assert {"htam", "htam-lsp"} <= set(PROJECT["scripts"]), "the commands keep their names"


def test_the_patterns_catch_the_old_instructions_and_spare_the_new() -> None:
    for said in (
        "pip install htam",
        "`python -m pip install htam`",
        "pip install htam into that Python",
        "pip install 'htam[ray]'",
        'pip install -U "htam"',
        "install htam[triton]",
    ):
        assert offences(said), said
    for said in (
        f"pip install {PROJECT['name']}",
        f"pip install '{PROJECT['name']}[ray]'",
        "python -m pip install -e <path-to-htam>",
        "offers to install htam into it",
        'htam["total"]',
    ):
        assert not offences(said), said


def test_no_text_installs_the_unrelated_package() -> None:
    texts = repository_texts()
    assert any(p.name == "README.md" for p in texts), "the scan reads the repository"
    found = [
        f"{path.relative_to(ROOT)}: {said}"
        for path in texts
        for said in offences(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, "\n".join(found)
