"""`htam memory ...` in a real subprocess, through htam_engine.cli.main."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from htam_engine.memory import START, MemoryStore, Outcome


def htam(*args: str) -> subprocess.CompletedProcess[str]:
    """`htam memory ARGS` in the test's own home (conftest's `HTAM_HOME`)."""
    return subprocess.run(
        [sys.executable, "-m", "htam_engine.cli", "memory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_show_json_prints_one_object_with_node_ids(tmp_path: Path) -> None:
    result = htam("show", "--backend", "cpu", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["backend"] == "cpu"
    assert {"global_nodes", "local_nodes", "edges"} <= data.keys()
    assert all(node["id"] for node in data["global_nodes"] + data["local_nodes"])
    assert any(edge["src"] == START for edge in data["edges"])


def test_show_human_output_is_a_table_on_stderr(tmp_path: Path) -> None:
    result = htam("show")
    assert result.returncode == 0
    assert result.stdout == ""
    assert "Memory Access" in result.stderr


def test_graph_formats(tmp_path: Path) -> None:
    mermaid = htam("graph", "--format", "mermaid", "--backend", "cpu")
    dot = htam("graph", "--format", "dot")
    assert mermaid.stdout.startswith("flowchart LR") and "START -->" in mermaid.stdout
    assert dot.stdout.startswith('digraph "htam_cuda"') and dot.stdout.rstrip().endswith("}")


def test_export_import_reset_cycle(tmp_path: Path, htam_home: Path) -> None:
    home = htam_home
    MemoryStore(home).apply_outcome(
        Outcome(
            "cpu",
            "cpu:relu:f32",
            [START],
            [1.0],
            "compiler_flags",
            "opt_flags",
            "improved",
            True,
            True,
            2.0,
            0.5,
            0.69,
        )
    )
    exported = tmp_path / "memory.json"
    assert htam("export", str(exported)).returncode == 0
    assert htam("reset", "--yes").returncode == 0
    assert MemoryStore(home).graph("cpu").locals["opt_flags"].stats.attempts == 0
    assert htam("import", str(exported)).returncode == 0
    assert MemoryStore(home).graph("cpu").locals["opt_flags"].stats.attempts == 1


def test_bad_import_and_unconfirmed_reset_fail_with_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{broken")
    for result in (htam("import", str(bad)), htam("reset")):
        assert result.returncode == 2
        assert result.stderr.startswith("htam: error:")
        assert "Traceback" not in result.stderr


def test_every_subcommand_has_help(tmp_path: Path) -> None:
    for action in ("show", "export", "import", "reset", "graph"):
        result = htam(action, "--help")
        assert result.returncode == 0 and "usage:" in result.stdout
