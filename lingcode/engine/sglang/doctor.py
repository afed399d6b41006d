"""The SGLang part of `lingcode doctor`: every latency switch of the active profile, and the environment.

Each switch (lingcode/data/sglang-switches.toml) is shown on or off, where it is set (a profile,
config.toml, SGLang's default, or built in) and what it buys; each one that is off gets a
warning with what that costs. The environment table lists GPUs, driver and the SGLang
interpreter's packages against what SGLang 0.5.23 was built for, then what would stop
`lingcode serve --engine sglang` here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from lingcode.engine.sglang import preflight
from lingcode.engine.sglang.profiles import SGLANG_VERSION, Profile, ProfileError, resolve

# What sglang 0.5.23's wheel pins (its METADATA): other versions are untested combinations.
EXPECTED = {"sglang": SGLANG_VERSION, "torch": "2.14.1", "flashinfer": "0.7.2", "sglang_kernel": "0.4.10"}


@cache
def switches() -> list[dict]:
    text = resources.files("lingcode").joinpath("data/sglang-switches.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["switch"]


@dataclass(frozen=True)
class SwitchRow:
    name: str
    on: bool | None  # None: does not apply to this profile
    setting: str
    where: str
    buys: str
    warning: str | None


def _matches(value, want) -> bool:
    if isinstance(want, bool):
        return value is want or (
            isinstance(value, str) and value.lower() in (("1", "true") if want else ("0", "false"))
        )
    return str(value).lower() == str(want).lower()


def switch_rows(profile: Profile) -> list[SwitchRow]:
    rows = []
    for s in switches():
        if s.get("only") not in (None, profile.arch):
            continue
        if "builtin" in s:
            on = s.get("want", True)  # a built-in behaviour can be a deliberate "off" (no cost given)
            rows.append(SwitchRow(s["name"], on, s["builtin"], f"built into SGLang {SGLANG_VERSION}", s["buys"], None))
            continue
        kind, key = ("args", s["arg"]) if "arg" in s else ("env", s["env"])
        table = profile.args if kind == "args" else profile.env
        present, value = key in table, table.get(key)
        setting = (f"--{key} {value}" if value is not True else f"--{key}") if kind == "args" else f"{key}={value}"
        if not present:
            setting = f"(--{key} not given)" if kind == "args" else f"({key} not set)"
        if "min" in s:
            on = present and float(value) >= s["min"]
        elif s["want"] is False:
            on = not present or _matches(value, False)
        else:
            on = (present and _matches(value, s["want"])) or (not present and s.get("default_on", False))
        where = profile.sources.get(f"{kind}.{key}") if present else ("SGLang default" if s.get("default_on") else "-")
        if key == "mamba-radix-cache-strategy" and profile.args.get("disable-radix-cache"):
            rows.append(SwitchRow(s["name"], None, setting, where, s["buys"], None))  # no radix cache: moot
            continue
        rows.append(
            SwitchRow(s["name"], on, setting, where, s["buys"], None if on else f"{s['name']} is off: {s['cost']}")
        )
    return rows


def print_report(console, profile_name: str | None = None) -> bool:
    """Print the switch and environment tables; False when `serve --engine sglang` could not start here."""
    from rich.markup import escape
    from rich.table import Table

    try:
        profile = resolve(profile_name)
    except ProfileError as exc:
        console.print(f"[bold]SGLang engine[/bold]: profile error: {escape(str(exc))}")
        return False
    console.print(f"\n[bold]SGLang engine[/bold]: profile {profile.name} ({profile.description})")
    console.print(f"Each switch, its setting (from profile {profile.name} unless another place is named):")
    # Three columns, the setting and where it is set under the switch's name: within 100 columns.
    table = Table("", "switch: setting", "what it buys", box=None, pad_edge=False)
    warnings = []
    for row in switch_rows(profile):
        mark = {True: "[green]on[/green]", False: "[red]off[/red]", None: "n/a"}[row.on]
        where = f" [dim]({escape(row.where)})[/dim]" if row.where not in ("-", f"profile {profile.name}") else ""
        table.add_row(mark, f"{escape(row.name)}\n  {escape(row.setting)}{where}", escape(row.buys))
        if row.warning:
            warnings.append(row.warning)
    console.print(table)

    found = preflight.inspect(profile)
    versions, gpus = found.versions, found.gpus
    env = Table("environment", "found", "note", box=None, pad_edge=False)
    env.add_row("interpreter", escape(profile.python), escape(profile.sources.get("python", "")))
    for key, want in EXPECTED.items():
        have = (versions or {}).get(key)
        note = "" if have == want else f"SGLang {SGLANG_VERSION} is built for {want}"
        env.add_row(key.replace("_", "-"), have or "not installed", note)
        if have and have != want and key != "sglang":
            warnings.append(f"{key} {have} with SGLang {SGLANG_VERSION}, which pins {want}: an untested combination")
    if not gpus:
        env.add_row("GPUs", "none", found.no_gpu_reason or "")
    for g in gpus:
        env.add_row(
            f"GPU {g.index}",
            f"{g.name}, compute capability {g.cc} ({g.arch})",
            f"{g.memory_free_mib / 1024:.0f} of {g.memory_total_mib / 1024:.0f} GiB free",
        )
    if gpus:
        env.add_row("driver", gpus[0].driver, f"SGLang {SGLANG_VERSION} needs >= {preflight.MIN_DRIVER} (CUDA 13)")
    console.print(env)
    for warning in warnings + found.warnings:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    for problem in found.problems:
        console.print(f"[red]missing[/red]: {escape(problem)}")
    if not found.problems:
        console.print("`lingcode serve --engine sglang` can start here")
    return not found.problems
