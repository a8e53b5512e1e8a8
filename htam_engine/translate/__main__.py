"""`python -m htam_engine.translate REFERENCE`: one JSON line, {"source": ...} or
{"error": ...} (the op htam cannot yet write, or why tracing failed)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from htam_engine.translate import CannotTranslate, first_cpp


def main(path: str) -> int:
    warnings.simplefilter("ignore")
    try:
        source = first_cpp(Path(path).read_text(encoding="utf-8"), path)
    except CannotTranslate as error:
        print(json.dumps({"error": f"{error}; write a ModelNew, or use an LLM provider"}))
        return 1
    except Exception as error:  # the reference's own code failed while traced
        print(
            json.dumps({"error": f"tracing the reference failed: {type(error).__name__}: {error}"})
        )
        return 1
    print(json.dumps({"source": source}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
