"""Price table (USD per million tokens): the packaged one, overridable with HTAM_PRICES."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from htam_engine.llm.base import LLMError

PRICES_ENV = "HTAM_PRICES"


@dataclass(frozen=True)
class Price:
    input: float
    output: float


class PriceTable:
    """Looks a model up by exact name, else by the longest listed prefix."""

    def __init__(self, prices: Mapping[str, Price]) -> None:
        self.prices = dict(prices)

    def price(self, model: str) -> Price | None:
        if model in self.prices:
            return self.prices[model]
        prefixes = [name for name in self.prices if model.startswith(name)]
        return self.prices[max(prefixes, key=len)] if prefixes else None

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """Dollars for one call; 0 for a model with no listed price."""
        price = self.price(model)
        if price is None:
            return 0.0
        return (input_tokens * price.input + output_tokens * price.output) / 1_000_000


def _parse(data: Any, origin: str) -> dict[str, Price]:
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise LLMError(f"price table {origin}: expected a 'models' table of {{input, output}}")
    prices = {}
    for name, entry in models.items():
        try:
            prices[name] = Price(float(entry["input"]), float(entry["output"]))
        except (KeyError, TypeError, ValueError) as error:
            raise LLMError(
                f"price table {origin}: model {name!r} needs numeric 'input' and 'output' "
                f"(USD per million tokens): {error}"
            ) from None
    return prices


def _read_override(path: Path) -> dict[str, Price]:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as error:
        raise LLMError(f"cannot read price table {path} ({PRICES_ENV}): {error}") from None
    return _parse(data, str(path))


def load_prices(env: Mapping[str, str] | None = None) -> PriceTable:
    """The packaged prices, with the entries of `$HTAM_PRICES` (TOML or JSON) on top."""
    env = os.environ if env is None else env
    packaged = resources.files("htam_engine.llm").joinpath("prices.toml").read_text("utf-8")
    prices = _parse(tomllib.loads(packaged), "prices.toml")
    override = env.get(PRICES_ENV)
    if override:
        prices.update(_read_override(Path(override).expanduser()))
    return PriceTable(prices)
