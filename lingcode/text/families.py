"""Model families: which tool-call format, reasoning tags, FIM tokens, completion headers and
sampling defaults a model uses.

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
class Defaults:
    """What a request gets for the sampling fields it leaves out (the model card's recommendation)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None  # a chat answer's length when the client sets none (None: the context's rest)


@dataclass(frozen=True)
class Family:
    name: str
    match: tuple[str, ...]
    tool_parser: str = "hermes"
    reasoning: Reasoning | None = None
    fim: dict[str, str] | None = field(default=None, compare=False)
    # editor completion headers: written once with {repo}, and before each file with {path}
    repo_header: str | None = None
    file_header: str | None = None
    defaults: Defaults = Defaults()

    def matches(self, *texts: str) -> bool:
        return any(re.search(p, t, re.IGNORECASE) for p in self.match for t in texts if t)


@cache
def families() -> tuple[Family, ...]:
    data = tomllib.loads(resources.files("lingcode.data").joinpath("families.toml").read_text())
    out = []
    for name, entry in data.items():
        reasoning = entry.get("reasoning")
        completion = entry.get("completion", {})
        out.append(
            Family(
                name=name,
                match=tuple(entry.get("match", ())),
                tool_parser=entry.get("tool_parser", "hermes"),
                reasoning=Reasoning(
                    reasoning["start"],
                    reasoning["end"],
                    tuple(reasoning.get("also_ends_at", ())),
                    reasoning.get("nonempty_content", False),
                )
                if reasoning
                else None,
                fim=dict(entry["fim"]) if entry.get("fim") else None,
                repo_header=completion.get("repo"),
                file_header=completion.get("file"),
                defaults=Defaults(**entry.get("defaults", {})),
            )
        )
    return tuple(out)


def family_of(name: str, architecture: str | None = None) -> Family:
    for family in families():
        if family.matches(name, architecture or ""):
            return family
    return Family("default", (".*",))


def family_for(info: ModelInfo) -> Family:
    """The family of the served model, from its name and (if the engine knows it) architecture."""
    return family_of(info.name, info.extra.get("architecture"))
