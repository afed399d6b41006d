"""`lingcode bench grammar`: constrained decoding's costs, llguidance (lingcode's) against xgrammar.

For the tool sets real agents send (opencode's, Claude Code's, Codex CLI's: tests/data/*_tools.json)
it times, per library: building its view of the tokenizer (once per daemon), compiling the grammar
of a forced tool call (tool_choice "required", Hermes markup, the default model's format) and of a
JSON response format (cold, no cache), and the mask of every token of a real call while the call
is fed through it (what each decoded token pays). Then pathological schemas, each compile in a
child process with a time limit, since one of them kept xgrammar busy for minutes.

xgrammar is not a lingcode dependency: its column is measured only where it is installed
(`pip install xgrammar`); its grammar is the structural tag lingcode used with it before.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

from lingcode.bench import REPO, source_commit, usable_cpus, write_result

TOOL_SETS = {"opencode": "opencode_tools.json", "claude-code": "claude_code_tools.json", "codex": "codex_tools.json"}
# One real call per tool set, as the model writes it (json.dumps' separators).
CALLS = {
    "opencode": ("edit", {"filePath": "/src/app.py", "oldString": "return a+b", "newString": "return a + b"}),
    "claude-code": ("Bash", {"command": "ls -la src", "description": "List the source files"}),
    "codex": ("shell", {"command": ["bash", "-lc", "rg -n TODO src"], "workdir": "/work"}),
}
ANSWER = {"language": "python", "lines": 120, "files": ["app.py", "util.py"]}
ANSWER_SCHEMA = {"type": "object", "properties": {"language": {"type": "string", "enum": ["python", "rust", "go"]},
                 "lines": {"type": "integer", "minimum": 1}, "files": {"type": "array", "items": {"type": "string"}}},
                 "required": ["language", "lines", "files"], "additionalProperties": False}  # fmt: skip
PATHOLOGICAL_TIMEOUT_S = 120


def pathological() -> dict[str, dict]:
    nested = {"type": "string"}
    for _ in range(40):
        nested = {"type": "object", "properties": {"a": nested}, "required": ["a"]}
    return {
        "enum of 10,000 strings of ~70 chars (770 KB)": {
            "type": "object",
            "properties": {"a": {"enum": [f"option-{i:05d}-" + "x" * 60 for i in range(10000)]}},
        },
        "5,000 required integer properties": {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(5000)},
            "required": [f"p{i}" for i in range(5000)],
        },
        "anyOf of 3,000 objects": {
            "anyOf": [
                {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
                for i in range(3000)
            ]
        },
        "40 levels of nested objects": nested,
    }


def tools(name: str):
    from lingcode.agent.tool_parsers import Tool

    data = json.loads((REPO / "tests" / "data" / TOOL_SETS[name]).read_text())["tools"]
    return [
        Tool(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"]) for t in data
    ]


def load_tokenizer():
    from gguf import GGUFReader

    from lingcode import models
    from lingcode.text.tokenizer import Tokenizer

    reader = GGUFReader(str(models.ensure(models.DEFAULT_MODEL)))
    return Tokenizer.from_gguf_fields(
        {k: reader.fields[k].contents() for k in reader.fields if k.startswith("tokenizer.ggml.")}
    )


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, stop_ids):
        from lingcode.agent import grammar

        self.grammar, self.tokenizer, self.stop_ids = grammar, tokenizer, stop_ids
        started = time.perf_counter()
        compiler = grammar._compiler(tokenizer, stop_ids)
        self.setup_ms = (time.perf_counter() - started) * 1e3
        self.compiler = compiler

    def compile(self, kind: str, spec, tools_=None):
        from lingcode.agent.tool_parsers import tool_call_grammar

        if kind == "tools":
            kind, spec = "lark", tool_call_grammar("hermes", tools_, True)
        self.compiler.compiled.clear()  # cold: no cached grammar
        return self.grammar.constraint(self.tokenizer, self.stop_ids, kind, spec)


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, stop_ids):
        import xgrammar as xgr

        self.xgr = xgr
        started = time.perf_counter()
        vocab = [tokenizer.id_to_token(i) or "" for i in range(tokenizer.vocab_size)]
        for i in tokenizer.special_ids:
            vocab[i] = ""
        info = xgr.TokenizerInfo(
            vocab,
            vocab_type=xgr.VocabType.BYTE_LEVEL,
            vocab_size=tokenizer.vocab_size,
            stop_token_ids=list(stop_ids),
            add_prefix_space=False,
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab_size = tokenizer.vocab_size
        self.setup_ms = (time.perf_counter() - started) * 1e3

    def compile(self, kind: str, spec, tools_=None):
        if kind == "tools":
            compiled = self.compiler.compile_structural_tag(json.dumps(hermes_structural_tag(tools_)))
        else:
            compiled = self.compiler.compile_json_schema(json.dumps(spec), any_whitespace=False)
        return XgrammarConstraint(self.xgr, compiled, self.vocab_size)


class XgrammarConstraint:
    """lingcode's constraint with xgrammar, as it was: a CPU bitmask applied to the logits."""

    def __init__(self, xgr, compiled, vocab_size):
        self.xgr, self.vocab_size = xgr, vocab_size
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask_logits(self, logits) -> None:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self.xgr.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=self.vocab_size)

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"xgrammar rejected token {token_id}")


def hermes_structural_tag(tools_) -> dict:
    """The xgrammar structural tag lingcode's Hermes format used (before llguidance)."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools_
        ]
    }
    tag = {
        "type": "tag",
        "begin": "<tool_call>",
        "end": "</tool_call>",
        "content": {"type": "json_schema", "json_schema": call, "max_whitespace_cnt": 1},
    }
    return {
        "type": "structural_tag",
        "format": {
            "type": "tags_with_separator",
            "tags": [tag],
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": False,
        },
    }


def measure(lib, tokenizer, kind: str, spec, text: str, tools_=None, rounds: int = 3) -> dict:
    """Compile (cold) and feed `text` token by token, masking before each: ms and µs, best of rounds
    for the compile, median and max over every token (of every round) for the mask."""
    import torch

    compile_ms, mask_us = [], []
    ids = tokenizer.encode(text)
    for _ in range(rounds):
        started = time.perf_counter()
        constraint = lib.compile(kind, spec, tools_)
        compile_ms.append((time.perf_counter() - started) * 1e3)
        logits = torch.zeros(tokenizer.vocab_size)
        for token in ids:
            started = time.perf_counter()
            constraint.mask_logits(logits)
            mask_us.append((time.perf_counter() - started) * 1e6)
            if logits[token] != 0:
                raise RuntimeError(f"{lib.name} masked out token {token} ({tokenizer.decode([token])!r}) of {text!r}")
            logits.zero_()
            constraint.accept(token)
    return {
        "compile_ms": round(min(compile_ms), 2),
        "mask_us_median": round(statistics.median(mask_us), 1),
        "mask_us_max": round(max(mask_us), 1),
        "tokens": len(ids),
    }


def main(args) -> int:
    if args.pathological_child:  # one compile in a child process: `lingcode bench grammar` runs it with a limit
        return _pathological_child(args.pathological_child)
    tokenizer = load_tokenizer()
    stop_ids = (2,)
    libraries = []
    for cls in (Llguidance, Xgrammar):
        try:
            libraries.append(cls(tokenizer, stop_ids))
        except ImportError:
            print(f"lingcode bench grammar: {cls.name} is not installed; measuring without it", file=sys.stderr)
    rows = []
    for name in TOOL_SETS:
        tool_list = tools(name)
        fn, arguments = CALLS[name]
        text = f"<tool_call>{json.dumps({'name': fn, 'arguments': arguments})}</tool_call>"
        schema_bytes = len(json.dumps([t.parameters for t in tool_list]))
        for lib in libraries:
            row = measure(lib, tokenizer, "tools", None, text, tool_list)
            rows.append(
                {
                    "case": f"{name}: tool_choice required ({len(tool_list)} tools, {schema_bytes} B of schemas)",
                    "library": lib.name,
                    **row,
                }
            )
    for lib in libraries:
        row = measure(lib, tokenizer, "json_schema", ANSWER_SCHEMA, json.dumps(ANSWER))
        rows.append({"case": "response_format json_schema (3 properties)", "library": lib.name, **row})
    setup = {lib.name: round(lib.setup_ms, 1) for lib in libraries}
    patho = []
    for label in pathological():
        for lib in libraries:
            patho.append({"case": label, "library": lib.name, **_run_child(lib.name, label)})
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "command": "lingcode bench grammar " + " ".join(sys.argv[3:]),
        "cpus": usable_cpus(),
        "loadavg": os.getloadavg(),
        "versions": _versions(),
        "tokenizer_setup_ms": setup,
        "rows": rows,
        "pathological": patho,
    }
    table = render(result)
    print(table)
    write_result(args.out, result, table)
    return 0


def _run_child(library: str, label: str) -> dict:
    argv = [sys.executable, "-m", "lingcode", "bench", "grammar", "--pathological-child", f"{library}:{label}"]
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PATHOLOGICAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"outcome": f"still compiling after {PATHOLOGICAL_TIMEOUT_S} s (stopped)", "compile_ms": None}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {
            "outcome": f"child failed: {done.stderr.strip()[-200:]}",
            "compile_ms": None,
            "wall_s": round(time.perf_counter() - started, 1),
        }
    return json.loads(lines[-1])


def _pathological_child(which: str) -> int:
    import torch

    library, label = which.split(":", 1)
    tokenizer = load_tokenizer()
    lib = {"llguidance": Llguidance, "xgrammar": Xgrammar}[library](tokenizer, (2,))
    started = time.perf_counter()
    try:
        constraint = lib.compile("json_schema", pathological()[label])
        outcome = "compiled"
        compile_ms = (time.perf_counter() - started) * 1e3
        started = time.perf_counter()
        constraint.mask_logits(torch.zeros(tokenizer.vocab_size))
        first_mask_ms = round((time.perf_counter() - started) * 1e3, 1)
    except Exception as exc:  # a refusal (over the bounds) is an outcome too
        outcome, compile_ms, first_mask_ms = (
            f"refused: {str(exc).splitlines()[0][:120]}",
            (time.perf_counter() - started) * 1e3,
            None,
        )
    print(json.dumps({"outcome": outcome, "compile_ms": round(compile_ms, 1), "first_mask_ms": first_mask_ms}))
    return 0


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("llguidance", "xgrammar", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def render(result: dict) -> str:
    lines = [
        f"# lingcode bench grammar ({result['date']}, commit {result['commit']})",
        "",
        f"`{result['command']}`; {result['cpus']} CPUs, load average {result['loadavg'][0]:.2f}; "
        f"{', '.join(f'{k} {v}' for k, v in result['versions'].items() if v)}. Default model's tokenizer "
        "(SmolLM2, 49,152 tokens), Hermes tool-call markup.",
        "",
        "Tokenizer set-up (once per daemon): "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in result["tokenizer_setup_ms"].items()),
        "",
        "| case | library | compile ms (cold) | mask µs per token, median | max | tokens |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['case']} | {row['library']} | {row['compile_ms']:.1f} | {row['mask_us_median']:.0f} | "
            f"{row['mask_us_max']:.0f} | {row['tokens']} |"
        )
    lines += [
        "",
        f"Pathological schemas (a compile per child process, stopped after {PATHOLOGICAL_TIMEOUT_S} s):",
        "",
        "| schema | library | outcome | compile ms | first mask ms |",
        "|---|---|---|---|---|",
    ]
    for row in result["pathological"]:
        compile_ms = "-" if row.get("compile_ms") is None else f"{row['compile_ms']:.0f}"
        first = "-" if row.get("first_mask_ms") is None else f"{row['first_mask_ms']:.1f}"
        lines.append(f"| {row['case']} | {row['library']} | {row['outcome']} | {compile_ms} | {first} |")
    return "\n".join(lines) + "\n"
