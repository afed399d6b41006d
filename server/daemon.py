"""`lingcode serve`: the daemon in the foreground.

In order: take this home's daemon lock (flock on state/daemon.lock, held for the daemon's life:
a second daemon on the same LINGCODE_HOME exits at once, saying who holds it); make sure
the token file exists (created once, 0600); bind the socket (so `--port 0` gets a free port
whose number we know, and a busy port fails before the model loads), and the optional Unix
socket (0600, no token needed); load the engine; run uvicorn on those sockets. Once uvicorn
accepts connections, daemon.json (url, pid, engine, model, token file, socket) is written for
clients to find us; on a clean exit (Ctrl+C, SIGTERM) running requests end with an error, and
daemon.json (if it is still ours) and the Unix socket are removed.

Only loopback addresses are bound unless --allow-remote is given, and then with a warning.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import os
import secrets
import shlex
import signal
import socket
import stat
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from lingcode import __version__, paths
from lingcode.engine import EngineStartError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
GRACEFUL_SHUTDOWN_S = 5  # open streams get this long to finish on Ctrl+C / SIGTERM
# How long an idle connection stays open. Clients reuse theirs until their own expiry (aiohttp,
# lingcode's front ends: 15 s; httpx, the SDKs: 5 s); at uvicorn's 5 s a request sent as the daemon
# closed one was lost. Longer than both, the client always closes first.
KEEP_ALIVE_S = 75
# Open connections served at once (uvicorn's limit_concurrency): past it a request gets a 503, past
# twice it a connection is closed as it opens (server/frameworks.py). Clients hold a few each.
MAX_CONNECTIONS = 256


SWITCH_INTERVAL_MS = 0.05  # see _set_switch_interval(); Python's default is 5 ms


def _engine_in_own_process(device: str) -> bool:
    """The GPU engine runs in a process of its own: its Python between two GPU steps then never
    waits for the event loop's GIL, which slowed drafting beside the loop (docs/engine-notes.md).
    The CPU step computes without the GIL, and there the hop would only delay the first token.
    LINGCODE_ENGINE_PROCESS=1 or 0 decides instead (lingcode bench daemon compares the two)."""
    chosen = os.environ.get("LINGCODE_ENGINE_PROCESS", "")
    if chosen in ("0", "1"):
        return chosen == "1"
    from lingcode.engine.local.engine import pick_device

    return pick_device(device).type == "cuda"


def _say(message: str) -> None:
    print(message, flush=True)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"lingcode serve: {message}", file=sys.stderr, flush=True)
    return code


# --- files ------------------------------------------------------------------------------------


def _write_new(path: Path, text: str) -> Path:
    """Write `text` to a fresh temp file (0600 from the start) next to `path`; returns the temp path."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def ensure_token(path: Path) -> str:
    """The daemon's token: read from `path`, or created there (32 random bytes, url-safe, 0600).

    Only a regular file of this user's is read (never through a symlink). Anything else found
    there, such as a file another user planted while the directory was open to them, is never
    trusted: it is replaced, atomically, by a new token, and a warning says so.
    """
    token = _trusted_token(path)
    if token:
        return token
    tmp = _write_new(path, secrets.token_urlsafe(32))
    try:
        if token is None:
            try:
                os.link(tmp, path)  # create-if-absent, atomically: if a daemon starting at the same
            except FileExistsError:  # time won the race, use its token
                return ensure_token(path)
            except (OSError, AttributeError):  # no hard links here
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)  # an empty or untrusted token file: the name now points at ours
    finally:
        tmp.unlink(missing_ok=True)
    return ensure_token(path)


def _trusted_token(path: Path) -> str | None:
    """The token in `path`; None if there is no file; "" if it is empty or not this user's file to trust."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block us
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symbolic link; or a file we may not read
        return _untrusted(path, exc.strerror or str(exc))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _untrusted(path, "not a regular file")
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            return _untrusted(path, f"it belongs to uid {info.st_uid}")
        if os.name == "posix" and info.st_mode & 0o077:
            os.fchmod(fd, 0o600)  # someone loosened it; a token readable by others is no token
        return f.read(4096).decode("utf-8", "replace").strip()


def _untrusted(path: Path, why: str) -> str:
    print(
        f"lingcode serve: WARNING: the token file {path} is not this user's own file ({why}); it is "
        "replaced by a new token",
        file=sys.stderr,
        flush=True,
    )
    return ""


def write_daemon_file(path: Path, record: dict) -> None:
    """Atomically (temp file + rename), 0600: a client never reads half a file."""
    tmp = _write_new(path, json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)


def remove_daemon_file(path: Path) -> None:
    """Remove daemon.json if it still describes this process (a newer daemon may have replaced it)."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return
    if record.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def running_daemon(path: Path) -> dict | None:
    """The daemon that daemon.json names, if it is alive and answering; None if the file is stale."""
    try:
        record = json.loads(path.read_text())
        pid, url = int(record["pid"]), str(record["url"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, someone else's
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return record if response.status == 200 else None
    except (OSError, ValueError):
        return None


# --- the socket -------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind (not yet listen: connections are refused, not left hanging, while the model loads)."""
    addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = addresses[0]
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "posix":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bind_unix_socket(path: Path) -> socket.socket:
    """Bind a Unix socket that only this user can connect to: 0600 from the moment it exists.

    A socket file left by a daemon that died is replaced; one that something still listens on, or
    a path that is not a socket, is an error (OSError with a message that says which).
    """
    if path.is_symlink() or path.exists():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise OSError(f"{path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink(missing_ok=True)  # stale: nobody listens there
            else:
                raise OSError(f"another process listens on {path}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)  # the socket file is created by bind(): never, even briefly, open to others
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(previous)
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    """The URL clients use: the bound address with its real port (a wildcard address -> loopback)."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


# --- one daemon per home ---------------------------------------------------------------------


def lock_home(path: Path):
    """This home's daemon lock, held until the returned file is closed; None if another process holds it.

    flock, not a check of daemon.json: two daemons started at the same moment would both find no
    file, both load and both serve, and daemon.json would name only the second. The kernel
    drops the lock when its holder exits, however it exits.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): daemon.json's check is all there is
        return open(os.devnull)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    lock = os.fdopen(fd, "r+")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")  # for the message the next one prints
    lock.flush()
    return lock


def _holding_home_lock(run):
    @functools.wraps(run)
    def serve(**options) -> int:
        lock_file, daemon_file = paths.daemon_lock_file(), paths.daemon_file()
        lock = lock_home(lock_file)
        if lock is None:
            if (other := running_daemon(daemon_file)) is not None:
                return _fail(
                    f"a daemon (pid {other['pid']}) already serves {other['url']} for this LINGCODE_HOME; stop it first"
                )
            holder = lock_file.read_text().strip() or "?"
            return _fail(
                f"another lingcode daemon (pid {holder}) is starting or running for this LINGCODE_HOME "
                f"(it holds {lock_file}); use that one, or stop it first"
            )
        with lock:
            return run(**options)

    return serve


# --- serve ------------------------------------------------------------------------------------


@_holding_home_lock
def serve(
    *,
    engine: str,
    model_path: Path,
    model_name: str,
    host: str,
    port: int,
    device: str,
    max_queue: int,
    log_level: str,
    engine_url: str | None = None,
    profile: str | None = None,
    session_idle_s: float = 1800.0,
    max_sessions: int = 64,
    session_memory_mb: int = 64,
    keep_alive_s: float = 10.0,
    allow_remote: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    allowed_origins: tuple[str, ...] = (),
    unix_socket: Path | None = None,
    log_format: str = "json",
    kernels: str = "auto",
    compile: bool = False,
    speculation: str = "ngram",
) -> int:
    """Run the daemon until Ctrl+C or SIGTERM; the process exit code.

    engine "sglang": `model_path` is the model directory (None: the profile's), `profile` the
    SGLang launch profile, `engine_url` an SGLang server to attach to instead of launching one.
    allow_remote: permit a non-loopback `host`. allowed_hosts / allowed_origins: Host names and
    browser origins served besides loopback ones. unix_socket: also listen there (0600, no token).
    keep_alive_s: how far apart a stream's comments are until its first token.
    kernels: the local engine's forward pass, "torch", "triton" (GPU), "native" (CPU) or "auto". compile:
    torch.compile the local engine's torch step (minutes of compiling at load). speculation: the local
    engine's drafting ("ngram", "off", "early-exit:L").
    """
    # 1. what cannot run is refused before anything is bound or loaded
    if engine not in ("local", "sglang"):
        return _fail(f"engine {engine!r} is not available; choose 'local' or 'sglang'", EXIT_USAGE)
    if not is_loopback(host) and not allow_remote:
        return _fail(
            f"--host {host} is not a loopback address: anyone who can reach this machine could try "
            "the token. Pass --allow-remote as well if that is what you want",
            EXIT_USAGE,
        )
    daemon_file = paths.daemon_file()
    if (other := running_daemon(daemon_file)) is not None:
        return _fail(
            f"a daemon (pid {other['pid']}) already serves {other['url']}; stop it first "
            f"(or remove {daemon_file} if that is wrong)"
        )
    # 2. the token file, then the sockets: a busy port fails before the model loads
    token_file = paths.token_file()
    token = ensure_token(token_file)
    if not is_loopback(host):
        allowed_hosts = _warn_remote(host, allowed_hosts)
    bound = _bind(host, port, unix_socket)
    if isinstance(bound, int):
        return bound
    sockets, unix_socket = bound
    # 3. the engine
    started = time.perf_counter()
    try:
        local_engine = _load_engine(
            engine,
            model_path,
            model_name,
            device,
            engine_url=engine_url,
            profile=profile,
            kernels=kernels,
            compile=compile,
            speculation=speculation,
        )
    except KeyboardInterrupt:
        _close(sockets, unix_socket)
        return 130
    except EngineStartError as exc:  # no GPU, no model directory, SGLang died while loading: one line
        _close(sockets, unix_socket)
        return _fail(str(exc), EXIT_USAGE)
    except Exception as exc:  # a bad file, an unsupported architecture, no CUDA: say so, no traceback
        _close(sockets, unix_socket)
        return _fail(f"could not load {model_path}: {type(exc).__name__}: {exc}")
    info = local_engine.info
    model_name = model_name or info.name
    model_path = model_path or info.extra.get("model_path")
    where = " ".join(str(info.extra[k]) for k in ("device", "dtype") if k in info.extra) or info.extra.get(
        "url", device
    )
    _say(
        f"loaded {model_name} in {time.perf_counter() - started:.1f} s ({where}, "
        f"{info.context_length} tokens of context)"
    )
    # 4. the app over the engine
    from lingcode.pipeline.scheduler import Scheduler
    from lingcode.server import logs
    from lingcode.server.app import create_app

    log_config = logs.configure(log_level, log_format)
    _set_switch_interval()
    scheduler = Scheduler(local_engine, max_queue=max_queue)
    app = create_app(
        scheduler,
        info,
        token,
        model_id=model_name,
        session_idle_s=session_idle_s,
        max_sessions=max_sessions,
        session_bytes=session_memory_mb * 2**20,
        keep_alive_s=keep_alive_s,
        allowed_hosts=tuple(allowed_hosts),
        allowed_origins=tuple(allowed_origins),
        unix_socket=str(unix_socket) if unix_socket else None,
    )
    # 5. uvicorn on the sockets; daemon.json once it accepts connections, removed when it stops
    url = socket_url(sockets[0])
    record = {
        "url": url,
        "pid": os.getpid(),
        "engine": engine,
        "model": model_name,
        "model_path": str(model_path),
        "token_file": str(token_file),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "version": __version__,
    }
    if unix_socket is not None:
        record["socket"] = str(unix_socket)

    def ready() -> None:
        write_daemon_file(daemon_file, record)
        _say(banner(model_name, url, token_file, daemon_file))
        if unix_socket is not None:
            _say(f"  socket: {unix_socket} (this user only, no token needed)")

    try:
        return _run_uvicorn(app, sockets, scheduler, log_config, log_level, ready)
    finally:
        remove_daemon_file(daemon_file)
        _close(sockets, unix_socket)


def _warn_remote(host: str, allowed_hosts: tuple[str, ...]) -> tuple[str, ...]:
    """Warn that a host that is not loopback (--allow-remote) is served; the Host names served then."""
    wildcard = host in ("0.0.0.0", "::", "")
    served = ", ".join(["localhost", "127.0.0.1", "::1", *([] if wildcard else [host]), *allowed_hosts])
    print(
        f"lingcode serve: WARNING: listening on {host}, not loopback (--allow-remote): anyone who can "
        f"reach this machine and has the token can use the model. Host names served: {served} "
        "(add more with --allow-host)",
        file=sys.stderr,
        flush=True,
    )
    if not wildcard:
        allowed_hosts = (*allowed_hosts, host)
    return allowed_hosts


def _bind(host: str, port: int, unix_socket: Path | None) -> tuple[list[socket.socket], Path | None] | int:
    """The daemon's sockets, TCP first, and the Unix socket's absolute path; or, if one cannot be
    bound, the exit code (with nothing left bound)."""
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        return _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    unix_sock = None
    if unix_socket is not None:
        unix_socket = Path(unix_socket).absolute()
        try:
            unix_sock = bind_unix_socket(unix_socket)
        except OSError as exc:
            sock.close()
            return _fail(f"cannot listen on {unix_socket}: {exc.strerror or exc}")
    return ([sock] if unix_sock is None else [sock, unix_sock]), unix_socket


def _load_engine(
    engine: str,
    model_path: Path,
    model_name: str,
    device: str,
    *,
    engine_url: str | None,
    profile: str | None,
    kernels: str,
    compile: bool,
    speculation: str,
):
    """The engine: SGLang's adapter, or the local engine in this process or in one of its own."""
    if engine == "sglang":
        from lingcode.engine.sglang.engine import open_engine

        # Preflight first (GPUs, interpreter, model directory): a problem is one line, at once.
        return open_engine(model_path, engine_url=engine_url, profile=profile, name=model_name, say=_say)
    _say(f"lingcode {__version__}: loading {model_name} from {model_path} ...")
    if _engine_in_own_process(device):
        from lingcode.engine.local.process import EngineProcess

        return EngineProcess.start(
            Path(model_path), device=device, kernels=kernels, compile=compile, speculation=speculation
        )
    from lingcode.engine.local import load_engine

    return load_engine(Path(model_path), device=device, kernels=kernels, compile=compile, speculation=speculation)


def _set_switch_interval() -> None:
    """The engine's worker thread and the event loop share the GIL. A thread that wants it waits
    until the holder reaches a switch point, by default up to 5 ms: the engine's Python between
    two GPU verify steps then waits behind a whole burst of the loop's work, which slowed drafting in
    the daemon (docs/engine-notes.md has the measurement). LINGCODE_SWITCH_INTERVAL_MS overrides it,
    for `lingcode bench daemon`."""
    sys.setswitchinterval(float(os.environ.get("LINGCODE_SWITCH_INTERVAL_MS", SWITCH_INTERVAL_MS)) / 1e3)


def _close(sockets: list[socket.socket], unix_socket: Path | None) -> None:
    for sock in sockets:
        sock.close()
    if unix_socket is not None:
        unix_socket.unlink(missing_ok=True)


def banner(model_name: str, url: str, token_file: Path, daemon_file: Path) -> str:
    """What `lingcode serve` prints once it is ready: where it is, and how to point a client at it."""
    return (
        f"\nlingcode is serving {model_name} at {url}\n"
        f"  token:  {token_file}\n"
        f"  daemon: {daemon_file}\n"
        f"Point an OpenAI client at it:\n"
        f"  export OPENAI_BASE_URL={url}/v1\n"
        f"  export OPENAI_API_KEY=$(cat {shlex.quote(str(token_file))})\n"
        f"Ctrl+C stops it."
    )


def uvicorn_config(app, log_config: dict | None, log_level: str, http: type | None = None):
    """uvicorn's Config for the daemon: its protocol (server/frameworks.py; `http` another of its classes)
    and the connection layer's limits."""
    import uvicorn

    # access_log off: lingcode.access (server/observability.py) logs each request with its id.
    # proxy_headers off: nothing sits in front of the daemon, so X-Forwarded-For is never believed.
    from lingcode.server.frameworks import HEAD_BYTES, protocol_class

    # httptools (C) parses requests where it is installed, else h11; either way a request the parser
    # refuses (a bad Content-Length) is answered in the API's own error shape (server/frameworks.py).
    return uvicorn.Config(
        app,
        http=http or protocol_class(),
        log_config=log_config,
        log_level=log_level,
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONNECTIONS,
        h11_max_incomplete_event_size=HEAD_BYTES,
    )


def _run_uvicorn(app, sockets: list[socket.socket], scheduler, log_config: dict, log_level: str, ready) -> int:
    """Serve `app` on `sockets` until SIGINT/SIGTERM; call ready() once connections are accepted."""
    from lingcode.server.frameworks import DaemonServer

    config = uvicorn_config(app, log_config, log_level)
    server = DaemonServer(config, scheduler, ready)
    # uvicorn handles SIGINT/SIGTERM itself (a graceful shutdown), then re-raises the signal with
    # the handler it found. A no-op there lets us return, clean up, and exit 0.
    in_main_thread = threading.current_thread() is threading.main_thread()
    stop_signals = (signal.SIGINT, signal.SIGTERM) if in_main_thread else ()
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in stop_signals}
    try:
        with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
            runner.run(_serve(server, sockets, scheduler))
    except SystemExit as exc:  # uvicorn's startup failure
        return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _say("lingcode: stopped")
    return EXIT_OK


def _event_loop_factory():
    """uvloop where it is installed (not on Windows): its loop wakes, reads and writes sockets in C,
    which is per-request and per-chunk time the daemon adds; LINGCODE_EVENT_LOOP=asyncio for the
    standard loop (lingcode bench daemon compares them)."""
    if os.environ.get("LINGCODE_EVENT_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop

            return uvloop.new_event_loop
        except ImportError:
            pass
    return None


async def _serve(server, sockets: list[socket.socket], scheduler) -> None:
    """uvicorn's serve() on our sockets (until SIGINT/SIGTERM), then the engine closed."""
    try:
        await server.serve(sockets=sockets)
    finally:
        await scheduler.engine.close()
