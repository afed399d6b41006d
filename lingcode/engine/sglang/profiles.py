"""SGLang launch profiles: TOML data that resolves to the argv and environment of `sglang.launch_server`.

A profile lives in lingcode/data/profiles/NAME.toml (or any path): `[args]` maps a launch flag
(without its dashes) to a value, `[env]` holds environment variables, and `extends` names the
profile it changes. The user's config.toml ([sglang] table) is applied last, so it can override
any flag or variable without copying a profile:

    [sglang]
    profile = "ling-3.0-flash-dspark-agent"
    python = "/opt/sglang/.venv/bin/python"      # the interpreter that has sglang
    args = { model-path = "/models/Ling-3.0-flash", mem-fraction-static = 0.85 }
    env = { SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED = false }   # false removes what a profile set

Values: true writes the bare flag, false removes it, a list writes its items after the flag, a
table is written as JSON, and "${flag}" is replaced by another flag's value. The flag names are
SGLang 0.5.23's; tests/test_sglang_contract.py runs every profile through SGLang's own parser.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from lingcode import paths
from lingcode.engine import EngineStartError

SGLANG_VERSION = "0.5.23"  # the release the profiles are written for
DEFAULT_PROFILE = "ling-3.0-flash-dspark"
LAUNCH_MODULE = "sglang.launch_server"
DSPARK_DEFAULT_BLOCK = 8  # Ling-3.0-flash-dspark's block size, when a profile does not say
DEFAULT_TRACK_INTERVAL = 256  # SGLang's default --mamba-track-interval
# Set by lingcode at launch (a private loopback port and a per-launch key), never by a profile.
RESERVED_ARGS = ("host", "port", "api-key")
CONFIG_KEYS = {"profile", "python", "args", "env", "engine_url", "api_key"}
_REF = re.compile(r"\$\{([a-z0-9-]+)\}")


class ProfileError(EngineStartError, ValueError):
    """A profile or the [sglang] table of config.toml is wrong; the message says where and how."""


@dataclass(frozen=True)
class Profile:
    """One resolved profile: what to launch, and where each setting came from."""

    name: str
    description: str
    arch: str  # "blackwell" or "hopper": the GPUs the switches are meant for
    min_gpu_memory_gib: float
    python: str
    args: dict[str, Any]  # flag name without dashes -> value, in launch order
    env: dict[str, str]
    sources: dict[str, str] = field(default_factory=dict)  # "args.X" / "env.X" / "python" -> origin

    @property
    def argv(self) -> list[str]:
        return to_argv(self.args)

    @property
    def tp_size(self) -> int:
        return int(self.args.get("tp-size", 1))

    @property
    def model_path(self) -> str:
        return str(self.args["model-path"])

    def command(self, *extra: str) -> list[str]:
        return [self.python, "-m", LAUNCH_MODULE, *self.argv, *extra]

    def shell(self) -> str:
        """The launch as one copy-pasteable shell command (env first)."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        flags, args = [], self.argv
        for i, arg in enumerate(args):
            sep = " \\\n  " if arg.startswith("--") and i else " "
            flags.append(sep + shlex.quote(arg))
        return f"{env + ' ' if env else ''}{shlex.quote(self.python)} -m {LAUNCH_MODULE}{''.join(flags)}"


def to_argv(args: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for name, value in args.items():
        flag = f"--{name}"
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            argv += [flag, str(value)]
    return argv


# --- files ------------------------------------------------------------------------------------


def _builtin_dir():
    return resources.files("lingcode").joinpath("data/profiles")


@cache
def builtin_profiles() -> tuple[str, ...]:
    return tuple(sorted(p.name.removesuffix(".toml") for p in _builtin_dir().iterdir() if p.name.endswith(".toml")))


def _read_profile(name: str) -> tuple[str, dict]:
    """(label, data) of a built-in profile name or a path to a TOML file."""
    if name.endswith(".toml") or "/" in name:
        path = Path(name).expanduser()
        try:
            return str(path), tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ProfileError(f"profile {path}: {exc}") from None
    if name not in builtin_profiles():
        raise ProfileError(f"unknown SGLang profile {name!r}; built in: {', '.join(builtin_profiles())}")
    return f"profile {name}", tomllib.loads(_builtin_dir().joinpath(f"{name}.toml").read_text(encoding="utf-8"))


def config_file() -> Path:
    return paths.config_dir() / "config.toml"


def load_config() -> dict:
    """The [sglang] table of the user's config.toml ({} when there is none)."""
    path = config_file()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"{path}: {exc}") from None
    table = data.get("sglang", {})
    if not isinstance(table, dict):
        raise ProfileError(f"{path}: [sglang] must be a table")
    unknown = set(table) - CONFIG_KEYS
    if unknown:
        raise ProfileError(
            f"{path}: unknown key(s) in [sglang]: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(CONFIG_KEYS))})"
        )
    for key in ("args", "env"):
        if not isinstance(table.get(key, {}), dict):
            raise ProfileError(f"{path}: [sglang] {key} must be a table")
    return table


# --- resolution -------------------------------------------------------------------------------


def resolve(profile: str | None = None, *, config: dict | None = None, overrides: dict | None = None) -> Profile:
    """The profile asked for (else config.toml's, else the default), with config.toml and
    `overrides` (flags given on lingcode's command line, e.g. --model) applied, and validated."""
    config = load_config() if config is None else config
    name = profile or config.get("profile") or DEFAULT_PROFILE
    chain, seen = [], set()
    current: str | None = name
    while current is not None:  # the profile, then what it extends, ...
        if current in seen:
            raise ProfileError(f"profile {name!r}: `extends` loops back to {current!r}")
        seen.add(current)
        label, data = _read_profile(current)
        chain.append((label, data))
        current = data.get("extends")

    meta: dict[str, Any] = {}
    args: dict[str, Any] = {}
    env: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def apply(label: str, new_args: dict, new_env: dict) -> None:
        for key, value in new_args.items():
            args[key] = value
            sources[f"args.{key}"] = label
        for key, value in new_env.items():
            env[key] = value
            sources[f"env.{key}"] = label

    for label, data in reversed(chain):  # the base first
        meta.update({k: v for k, v in data.items() if k not in ("args", "env", "extends")})
        apply(label, data.get("args", {}), data.get("env", {}))
    apply(str(config_file()), config.get("args", {}), config.get("env", {}))
    apply("command line", overrides or {}, {})

    python = config.get("python") or sys.executable
    sources["python"] = str(config_file()) if config.get("python") else "default (this interpreter)"
    args = {k: v for k, v in args.items() if v is not False and v is not None}
    args = {k: _substitute(k, v, args) for k, v in args.items()}
    env = {k: _env_value(k, v) for k, v in env.items() if v is not False and v is not None}
    resolved = Profile(
        name=str(name),
        description=str(meta.get("description", "")),
        arch=str(meta.get("arch", "blackwell")),
        min_gpu_memory_gib=float(meta.get("min_gpu_memory_gib", 0)),
        python=str(python),
        args=args,
        env=env,
        sources=sources,
    )
    validate(resolved)
    return resolved


def _substitute(key: str, value: Any, args: dict) -> Any:
    if not isinstance(value, str):
        return value

    def ref(match: re.Match) -> str:
        other = match.group(1)
        if other not in args or other == key:
            raise ProfileError(f"--{key}: ${{{other}}} names no other flag of the profile")
        return str(args[other])

    return _REF.sub(ref, value)


def _env_value(key: str, value: Any) -> str:
    if value is True:
        return "1"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ProfileError(f"env {key}: a string, number or boolean, not {type(value).__name__}")


# --- the constraints between switches (SGLang checks them too, but only after loading the model) ----


def verify_window(args: dict) -> int | None:
    """Tokens per speculative verify step (draft tokens + 1 bonus), when the profile decides it."""
    algorithm = str(args.get("speculative-algorithm") or "").upper()
    if algorithm == "DSPARK":
        return int(args.get("speculative-dspark-block-size", DSPARK_DEFAULT_BLOCK)) + 1
    if "speculative-num-draft-tokens" in args:
        return int(args["speculative-num-draft-tokens"])
    return None


def validate(profile: Profile) -> None:
    args = profile.args
    for name in RESERVED_ARGS:
        if name in args:
            raise ProfileError(
                f"--{name} is set by lingcode at launch; remove it from {profile.sources[f'args.{name}']}"
            )
    if not args.get("model-path"):
        raise ProfileError(f"profile {profile.name!r} sets no model-path")
    speculative = bool(args.get("speculative-algorithm"))
    window = verify_window(args)
    if speculative and "max-running-requests" not in args:
        raise ProfileError(
            "max-running-requests must be set under speculative decoding: SGLang resets it to 48 otherwise"
        )
    if args.get("enable-linear-replayssm-spec"):
        if args.get("enable-linear-replayssm"):
            raise ProfileError("enable-linear-replayssm and enable-linear-replayssm-spec exclude each other")
        cache_len = int(args.get("linear-replayssm-cache-len", 16))
        if window is not None and cache_len < window:
            raise ProfileError(
                f"linear-replayssm-cache-len {cache_len} is shorter than the verify window of {window} tokens"
            )
    if speculative and not args.get("disable-radix-cache"):
        strategy = args.get("mamba-radix-cache-strategy", "auto")
        if strategy == "no_buffer":
            raise ProfileError(
                "mamba-radix-cache-strategy no_buffer needs overlap scheduling off and page size 1; "
                "use extra_buffer to keep the radix cache on under speculation"
            )
        if strategy.startswith("extra_buffer"):
            interval = int(args.get("mamba-track-interval", DEFAULT_TRACK_INTERVAL))
            if window is not None and interval < window:
                raise ProfileError(f"mamba-track-interval {interval} must be >= the verify window ({window} tokens)")
            page = args.get("page-size")
            if page is not None and interval % int(page):
                raise ProfileError(f"mamba-track-interval {interval} must be a multiple of page-size {page}")
