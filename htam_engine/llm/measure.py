"""What a cassette's answers are worth: valid choices, usable code, reasons, tokens.

`python -m htam_engine.llm.measure CASSETTE... [--json]` reads recorded answers (from
`htam optimize --record`) and judges each one as the loop does today: a choice is valid
when `parse_choice` finds a runnable id that the prompt offered; a generation or repair
is used when `extract_candidate` accepts it, else rejected with its reason. Next to it,
the first-JSON-object reading of earlier releases, for before/after numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from htam_engine.llm.extract import extract_candidate, extract_json
from htam_engine.llm.replay import read_cassette
from htam_engine.llm.structured import parse_choice

_OFFERED = re.compile(r"^### (\S+)$", re.M)  # the heading of each candidate strategy
_FENCE = re.compile(r"in one ```(\w+) block")  # the language a code prompt asks for
CODE_PURPOSES = ("generate", "translate", "repair")


@dataclass
class Report:
    """Counts over the answers of one or more cassettes."""

    choices: int = 0
    valid_choices: int = 0
    valid_first_object: int = 0
    choice_forms: Counter[str] = field(default_factory=Counter)
    valid_forms: Counter[str] = field(default_factory=Counter)  # valid choices per form
    code_answers: int = 0
    code_used: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    output_tokens: int = 0
    timed_calls: int = 0  # calls whose latency was recorded
    timed_seconds: float = 0.0
    timed_output_tokens: int = 0

    def add(self, entry: dict[str, Any]) -> None:
        self.output_tokens += int(entry.get("output_tokens", 0))
        if isinstance(entry.get("latency_s"), int | float) and entry["latency_s"] > 0:
            self.timed_calls += 1
            self.timed_seconds += float(entry["latency_s"])
            self.timed_output_tokens += int(entry.get("output_tokens", 0))
        purpose = entry.get("purpose", "")
        if purpose == "local":
            self._add_choice(entry)
        elif purpose in CODE_PURPOSES:
            self._add_code(entry)

    def _add_choice(self, entry: dict[str, Any]) -> None:
        prompt = entry.get("prompt", "")
        offered = _OFFERED.findall(prompt)
        if re.search(r"^Valid ids: .*, stop$", prompt, re.M):
            offered.append("stop")  # offered once a run has a result to keep
        form = str(entry.get("form") or "prompted")
        self.choices += 1
        self.choice_forms[form] += 1
        valid = parse_choice(entry["text"], offered, form) is not None
        self.valid_choices += valid
        self.valid_forms[form] += valid
        first = (extract_json(entry["text"]) or {}).get("local")
        self.valid_first_object += isinstance(first, str) and first in offered

    def _add_code(self, entry: dict[str, Any]) -> None:
        asked = _FENCE.findall(entry.get("prompt", ""))
        language = asked[-1] if asked else "python"
        answer = extract_candidate(
            entry["text"], language, truncated=bool(entry.get("truncated", False))
        )
        self.code_answers += 1
        self.code_used += answer.code is not None
        if answer.code is None:
            self.rejected[answer.reason.split(" (")[0]] += 1

    def to_json(self) -> dict[str, Any]:
        counts = {
            "choice_forms": dict(self.choice_forms),
            "valid_forms": dict(self.valid_forms),
            "rejected": dict(self.rejected),
        }
        return {**{k: v for k, v in vars(self).items() if k not in counts}, **counts}

    def lines(self) -> list[str]:
        return [
            f"choices: {self.valid_choices}/{self.choices} valid "
            f"(first-object reading: {self.valid_first_object}/{self.choices}); "
            f"forms: {dict(self.choice_forms)}",
            "valid by form: "
            + (
                ", ".join(f"{f} {self.valid_forms[f]}/{n}" for f, n in self.choice_forms.items())
                or "no choices"
            ),
            f"code answers: {self.code_used}/{self.code_answers} used, the rest rejected:",
            *(f"  {count} x {reason}" for reason, count in self.rejected.most_common()),
            f"output tokens: {self.output_tokens}",
            self._speed(),
        ]

    def _speed(self) -> str:
        if not self.timed_calls:
            return "time per call: not recorded"
        per_call = self.timed_seconds / self.timed_calls
        rate = self.timed_output_tokens / self.timed_seconds
        return f"time per call: {per_call:.1f} s over {self.timed_calls} calls; {rate:.1f} tokens/s"


def measure(cassettes: Sequence[Path]) -> Report:
    report = Report()
    for cassette in cassettes:
        for entry in read_cassette(cassette):
            report.add(entry)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m htam_engine.llm.measure")
    parser.add_argument("cassettes", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    report = measure(args.cassettes)
    if args.json:
        print(json.dumps(report.to_json()))
    else:
        print("\n".join(report.lines()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
