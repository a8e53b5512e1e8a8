"""`common.share_inline_builds`: `load_inline` builds land in a folder keyed by their
arguments, whether `cpp_extension` was imported before the patch or after it (a worker
patches before its candidate runs, and imports `cpp_extension` only if the candidate does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A call that fails inside torch after the wrapper chose (and made) its build folder.
_PROBE = """
import sys
from pathlib import Path
{before}
from htam_engine.evaluate import common
common.share_inline_builds(Path(sys.argv[1]))
print("imported before the candidate:", "torch.utils.cpp_extension" in sys.modules)
import torch.utils.cpp_extension as cpp_extension
try:
    cpp_extension.load_inline("probe", cpp_sources=0)
except AttributeError:
    pass
"""


@pytest.mark.parametrize("before", ["", "import torch.utils.cpp_extension"])
def test_inline_builds_are_keyed_whenever_cpp_extension_is_imported(
    tmp_path: Path, before: str
) -> None:
    code = _PROBE.format(before=before)
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"imported before the candidate: {bool(before)}" in done.stdout
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["probe"]
