"""Model families: which tool-call format, reasoning tags and FIM tokens a model uses.

The facts are data (lingcode/data/families.toml), matched against what the engine says about the
model, so supporting a new family is a TOML edit, not code.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from lingcode.engine import ModelInfo


@dataclass(frozen=True)
class Reasoning:
    start: str
    end: str
    also_ends_at: tuple[str, ...] = ()
    nonempty_content: bool = False  # output that is all reasoning is also the answer (lingcode.agent.reasoning)


@dataclass(frozen=True)
class Family:
    name: str
    match: tuple[str, ...]
    tool_parser: str = "hermes"
    reasoning: Reasoning | None = None
    fim: dict[str, str] | None = field(default=None, compare=False)

    def matches(self, *texts: str) -> bool:
        return any(re.search(p, t, re.IGNORECASE) for p in self.match for t in texts if t)


@cache
def families() -> tuple[Family, ...]:
    data = tomllib.loads(resources.files("lingcode.data").joinpath("families.toml").read_text())
    out = []
    for name, entry in data.items():
        reasoning = entry.get("reasoning")
        out.append(Family(
            name=name,
            match=tuple(entry.get("match", ())),
            tool_parser=entry.get("tool_parser", "hermes"),
            reasoning=Reasoning(reasoning["start"], reasoning["end"], tuple(reasoning.get("also_ends_at", ())),
                                reasoning.get("nonempty_content", False)) if reasoning else None,
            fim=entry.get("fim"),
        ))  # fmt: skip
    return tuple(out)


def family_of(name: str, architecture: str | None = None) -> Family:
    for family in families():
        if family.matches(name, architecture or ""):
            return family
    return Family("default", (".*",))


def family_for(info: ModelInfo) -> Family:
    """The family of the served model, from its name and (if the engine knows it) architecture."""
    return family_of(info.name, info.extra.get("architecture"))
