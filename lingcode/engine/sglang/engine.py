"""`lingcode serve --engine sglang`: preflight, then SGLang launched and supervised (or attached to), then the adapter.

Launch (the default): the profile resolves to `python -m sglang.launch_server ...`, the preflight
checks GPUs, driver, interpreter and model directory, and the supervisor starts SGLang on a free
loopback port with a per-launch API key and waits for it. Attach (`--engine-url`, or
`engine_url` in config.toml): a server someone else runs, on this machine or a multi-node
deployment; lingcode only needs the model directory for its tokenizer and chat template.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Callable

import httpx

from lingcode import paths
from lingcode.engine.sglang import preflight, profiles
from lingcode.engine.sglang.adapter import SGLangEngine
from lingcode.engine.sglang.model_dir import load_model_info
from lingcode.engine.sglang.preflight import PreflightError
from lingcode.engine.sglang.supervisor import StartupFailed, Supervisor

__all__ = ["open_engine", "PreflightError", "StartupFailed"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_info(url: str, api_key: str | None, timeout: float = 10.0) -> dict:
    """SGLang's /server_info (the resolved launch settings, SGLang's version, scheduler limits)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/server_info", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise PreflightError(
            f"SGLang at {url} does not answer ({type(exc).__name__}): start it "
            "(`lingcode sglang-args` prints the command) or fix --engine-url"
        ) from None
    if response.status_code in (401, 403):
        raise PreflightError(
            f"SGLang at {url} refused the API key ({response.status_code}): set "
            f"{preflight.API_KEY_ENV} or [sglang] api_key to its --api-key"
        )
    if response.status_code != 200:
        raise PreflightError(f"SGLang at {url} answered /server_info with {response.status_code}")
    return response.json()


def _engine(url: str, model_dir: Path, name: str | None, api_key: str | None, info: dict, **hooks) -> SGLangEngine:
    # The server's context, and what its KV pool admits as input: whichever is shorter.
    limits = [v for v in (info.get("context_length"), (info.get("max_req_input_len") or 0) + 1) if isinstance(v, int)]
    limits = [v for v in limits if v > 1]
    extra = {
        "engine": "sglang",
        "url": url,
        "model_path": str(model_dir),
        "sglang_version": info.get("version"),
        "speculative_algorithm": info.get("speculative_algorithm"),
        "tp_size": info.get("tp_size"),
    }
    model = load_model_info(model_dir, name=name, context_length=min(limits) if limits else None, extra=extra)
    return SGLangEngine(
        url, model, api_key=api_key, incremental=bool(info.get("incremental_streaming_output")), **hooks
    )


def open_engine(
    model: str | Path | None = None,
    *,
    engine_url: str | None = None,
    profile: str | None = None,
    name: str | None = None,
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] = print,
) -> SGLangEngine:
    """A ready SGLang engine, or PreflightError / StartupFailed / ProfileError with a one-line message."""
    config = profiles.load_config()
    engine_url = engine_url or config.get("engine_url")
    if model is not None and Path(model).expanduser().exists():
        model = Path(model).expanduser().resolve()
    overrides = {"model-path": str(model)} if model else None
    spec = profiles.resolve(profile, config=config, overrides=overrides)

    if engine_url:
        api_key = os.environ.get(preflight.API_KEY_ENV) or config.get("api_key")
        model_dir = Path(spec.model_path).expanduser()
        preflight.check_attach(engine_url, api_key, model_dir)
        info = server_info(engine_url, api_key)
        say(f"attached to SGLang {info.get('version', '?')} at {engine_url} ({info.get('model_path')})")
        return _engine(
            engine_url, model_dir, name, api_key, info, status=lambda: {"state": "attached", "url": engine_url}
        )

    for warning in preflight.check_launch(spec):
        say(f"warning: {warning}")
    port, api_key = _free_port(), secrets.token_urlsafe(24)
    url = f"http://127.0.0.1:{port}"
    supervisor = Supervisor(
        spec.command("--host", "127.0.0.1", "--port", str(port), "--api-key", api_key),
        spec.env,
        url=url,
        log_file=paths.state_dir() / "sglang.log",
        **({"on_line": on_line} if on_line else {}),
    )
    say(f"starting SGLang ({spec.name}, tp {spec.tp_size}) on {url}; log: {supervisor.log_file}")
    try:
        supervisor.start()
        info = server_info(url, api_key)
        return _engine(
            url,
            Path(spec.model_path),
            name,
            api_key,
            info,
            availability=supervisor.unavailable,
            status=supervisor.status,
            on_close=supervisor.stop,
        )
    except BaseException:
        supervisor.stop()
        raise
