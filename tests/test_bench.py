"""`lingcode bench` runs end to end on the CPU and writes what it claims (numbers are not asserted).

Each engine runs in a worker process of its own; these tests check that the variants ran there,
on the same prompts, and what they answered, never how fast."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

BENCH = [sys.executable, "-m", "lingcode", "bench", "--device", "cpu"]


def run_bench(tmp_path, model_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bench"
    done = subprocess.run(
        [*BENCH, "--model", str(model_path), *args, "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done, json.loads(out.with_suffix(".json").read_text())


def test_bench_writes_json_markdown_and_plot(tmp_path, model_path):
    _, report = run_bench(
        tmp_path,
        model_path,
        "--workload",
        "completion,code-edit",
        "--speculation",
        "off,ngram",
        "--requests",
        "1",
        "--max-tokens",
        "6",
    )
    variants = {(row["workload"], row["variant"]) for row in report["summary"]}
    assert variants == {(w, v) for w in ("completion", "code-edit") for v in ("lingcode-off", "lingcode-ngram")}
    assert all(r["tokens"] >= 1 and r["ttft_ms"] > 0 for r in report["requests"])
    # Greedy drafts are lossless: n-gram decoding gives plain decoding's tokens, request by request.
    assert all(r["same_as_first"] for r in report["requests"])
    assert all(row["same_tokens_as_first"] == 1 for row in report["summary"])
    assert "| workload | variant |" in (tmp_path / "bench.md").read_text()
    assert report["command"].startswith("lingcode bench --device cpu --model")
    assert report["threads"] >= 1 and report["workers"]["lingcode"]["threads"] == report["threads"]
    assert report["workers"]["lingcode"]["pid"] != os.getpid()


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs transformers (make test installs it)"
)
def test_bench_runs_a_peer_in_a_process_of_its_own(tmp_path, model_path):
    _, report = run_bench(
        tmp_path,
        model_path,
        "--workload",
        "chat",
        "--speculation",
        "off",
        "--peers",
        "transformers-eager",
        "--threads",
        "1",
        "--requests",
        "2",
        "--max-tokens",
        "5",
    )
    workers = report["workers"]
    assert set(workers) == {"lingcode", "transformers-eager"}
    assert workers["lingcode"]["pid"] != workers["transformers-eager"]["pid"]
    assert workers["transformers-eager"]["threads"] == workers["lingcode"]["threads"] == 1
    assert "transformers" in workers["transformers-eager"]["versions"]
    peer = [r for r in report["requests"] if r["variant"] == "transformers-eager"]
    ours = [r for r in report["requests"] if r["variant"] == "lingcode-off"]
    # Alternating A, B, A, B: the same prompts to both, each worker warmed up once first.
    assert [r["request"] for r in peer] == [r["request"] for r in ours] == [0, 1]
    assert [r["prompt_tokens"] for r in peer] == [r["prompt_tokens"] for r in ours]
    assert [r["served"] for r in peer] == [2, 3]
    assert all(r["tokens"] == 5 == len(r["token_ids"]) and r["tpot_ms"] > 0 for r in peer)  # chat: exactly max tokens


def test_bench_says_how_to_get_llama_cpp_when_it_is_missing(tmp_path, model_path):
    done = subprocess.run(
        [
            *BENCH,
            "--model",
            str(model_path),
            "--peers",
            "llama.cpp",
            "--llama-cpp-python",
            str(tmp_path / "no-such-python"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "cannot import llama_cpp" in done.stderr and "bench/README.md" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(
    not os.environ.get("LINGCODE_LLAMA_CPP_PYTHON"),
    reason="llama.cpp is a benchmark-only peer: set LINGCODE_LLAMA_CPP_PYTHON (bench/README.md)",
)
def test_bench_runs_llama_cpp_in_its_own_interpreter(tmp_path, model_path):
    _, report = run_bench(
        tmp_path,
        model_path,
        "--workload",
        "code-edit",
        "--speculation",
        "off",
        "--peers",
        "llama.cpp",
        "--requests",
        "1",
        "--max-tokens",
        "8",
    )
    worker = report["workers"]["llama.cpp"]
    assert worker["engine"]["python"] != sys.executable and worker["threads"] == report["threads"]
    peer = [r for r in report["requests"] if r["variant"] == "llama.cpp"]
    assert len(peer) == 1 and 1 <= peer[0]["tokens"] <= 8


def test_bench_daemon_reads_the_daemon_with_each_client(tmp_path, model_path):
    """`lingcode bench daemon` against SGLang's stand-in: a row per client (the openai SDK's typed
    chunks among them), each beside its own floor."""
    out = tmp_path / "daemon"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"messages": [{"role": "user", "content": "Name a sorting algorithm."}]}\n\n'
        '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]}\n'
    )
    temp = tmp_path / "temp"  # where the bench makes the daemon's private home
    temp.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lingcode",
            "bench",
            "daemon",
            "--engine",
            "sglang",
            "--model",
            str(model_path),
            "--workload",
            "chat,stdlib",
            "--prompts",
            str(prompts),
            "--requests",
            "2",
            "--max-tokens",
            "8",
            "--clients",
            "httpx,aiohttp,openai,socket",
            "--pause-ms",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert done.returncode == 0, done.stderr
    assert not any(temp.iterdir())  # the daemon's home, its prepared model with it, is gone
    report = json.loads(out.with_suffix(".json").read_text())
    assert [(row["workload"], row["client"]) for row in report["rows"]] == [
        (workload, client)
        for workload in ("chat", "stdlib", "prompts")
        for client in ("httpx", "aiohttp", "openai", "socket")
    ]
    # the workloads that are not the bench's own change every round, and the report names each input
    stdlib = report["inputs"]["stdlib"]
    assert len(stdlib) == len(set(stdlib)) == 2 and all("." in name for name in stdlib)
    assert report["inputs"]["prompts"] == ["line 3", "line 1"] and "chat" not in report["inputs"]
    assert "- stdlib, one a round: " in out.with_suffix(".md").read_text()
    for row in report["rows"]:
        assert row["same_text"] and row["tokens"] == 8
        assert row["tpot_ratio"] > 0 and row["tpot_ratio_paired"] > 0 and row["client_floor_ms"] > 0
        # the daemon's trace: what came before the engine, and the first body after it
        assert 0 < row["trace_cached_ms"]["until_engine"] < row["trace_cached_ms"]["until_first_body"]
        assert row["trace_cached_ms"]["until_first_body"] <= row["trace_cached_ms"]["until_first_events"]
        # the client's own share on either side, by the clock it shares with the daemon
        assert 0 < row["client_to_daemon_ms"] and 0 < row["client_after_first_events_ms"]
        assert row["client_to_daemon_ms"] + row["client_after_first_events_ms"] < row["ttft_cached_daemon_ms"]
        assert "arrived_at" not in row["trace_cached_ms"]
        # the daemon's own part of the added first-token time: within the whole of it
        assert row["ttft_added_in_daemon_ms"] < row["ttft_cached_daemon_ms"] - row["client_to_daemon_ms"]
    assert {s["client"] for s in report["samples"] if s["side"] == "floor"} == {"httpx", "aiohttp", "openai", "socket"}
    assert "| speculation | workload | client |" in out.with_suffix(".md").read_text()
    # every workload's pairs pooled per client: 2 rounds x (cold, cached) x 3 workloads, first tokens cached only
    assert [(r["client"], r["pairs"], r["ttft_pairs"]) for r in report["pooled"]] == [
        ("httpx", 12, 6),
        ("aiohttp", 12, 6),
        ("openai", 12, 6),
        ("socket", 12, 6),
    ]
    assert all(r["tpot_ratio_paired"] > 0 and r["ttft_added_paired_ms"] is not None for r in report["pooled"])
    assert all(r["ttft_added_in_daemon_ms"] is not None for r in report["pooled"])
    # --report summarizes the saved samples again, measuring nothing: the same figures
    again = tmp_path / "again"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lingcode",
            "bench",
            "daemon",
            "--report",
            str(out.with_suffix(".json")),
            "--out",
            str(again),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    redone = json.loads(again.with_suffix(".json").read_text())
    assert redone["pooled"] == report["pooled"] and redone["commit"] == report["commit"]
    assert [r["tpot_ratio_paired"] for r in redone["rows"]] == [r["tpot_ratio_paired"] for r in report["rows"]]
    assert "All workloads pooled" in again.with_suffix(".md").read_text()
    # several runs' samples pooled: each run's pairs kept as its own, the runs' commands named
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lingcode",
            "bench",
            "daemon",
            "--report",
            str(out.with_suffix(".json")),
            str(out.with_suffix(".json")),
            "--out",
            str(again),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    twice = json.loads(again.with_suffix(".json").read_text())
    assert [(r["client"], r["pairs"], r["ttft_pairs"]) for r in twice["pooled"]] == [
        ("httpx", 24, 12),
        ("aiohttp", 24, 12),
        ("openai", 24, 12),
        ("socket", 24, 12),
    ]
    assert [r["tpot_ratio_paired"] for r in twice["pooled"]] == [r["tpot_ratio_paired"] for r in report["pooled"]]
    assert twice["command"].startswith("2 runs pooled: ") and twice["inputs"]["stdlib"] == stdlib * 2


def test_the_bare_socket_client_reads_a_chunked_stream_however_it_is_cut():
    """The bench's `socket` reader: SSE lines out of a chunked answer that arrives in pieces cut
    anywhere, the connection kept for the next request, and a new one when the server has closed
    the kept one; an error status is an error."""
    import socket
    import threading

    from lingcode.bench.daemon import SocketClient

    events = b'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
    body = (
        b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (events[:7], events[7:30], events[30:])) + b"0\r\n\r\n"
    )
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body
    refusal = b'HTTP/1.1 401 Unauthorized\r\ncontent-length: 12\r\n\r\n{"error": 1}'
    listener = socket.create_server(("127.0.0.1", 0))
    connections, requests = [], []

    def serve():
        for plan in (("cut", "cut", "close"), ("refuse",)):
            conn, _ = listener.accept()
            connections.append(conn)
            for step in plan:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                head, _, got = head.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(got) < length:
                    got += conn.recv(65536)
                requests.append((head, got))
                if step == "close":  # the kept connection closed, unanswered: the client must retry
                    conn.close()
                    break
                for i in range(0, len(answer if step == "cut" else refusal), 5):
                    conn.sendall((answer if step == "cut" else refusal)[i : i + 5])

    threading.Thread(target=serve, daemon=True).start()
    client = SocketClient("http://127.0.0.1:%d" % listener.getsockname()[1], {"Authorization": "Bearer t"})
    lines = [line for line in client.stream("/v1/x", {"a": 1}, {"x-trace": "1"}) if line]
    assert lines == ['data: {"n": 1}', 'data: {"n": 2}', "data: [DONE]"]
    assert [line for line in client.stream("/v1/x", {"a": 2}, {}) if line] == lines
    with pytest.raises(RuntimeError, match="401"):
        list(client.stream("/v1/x", {"a": 3}, {}))
    client.close()
    assert len(connections) == 2  # two requests on the first connection, then a new one
    assert [json.loads(got)["a"] for _, got in requests] == [1, 2, 3, 3]
    assert b"Authorization: Bearer t" in requests[0][0] and b"x-trace: 1" in requests[0][0]


def test_bench_daemon_refuses_a_prompts_file_it_cannot_read(tmp_path, model_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "Hi."}]}\n{"prompt": "no messages"}\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lingcode",
            "bench",
            "daemon",
            "--engine",
            "sglang",
            "--model",
            str(model_path),
            "--workload",
            "",
            "--prompts",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and f"{bad}:2: not a" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "lingcode", "bench", "daemon", "--clients", "httpx,curl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "'httpx,curl': one or more of httpx, aiohttp, openai, socket" in done.stderr


def test_the_paired_ratio_comes_with_its_median_interval():
    """The bootstrap interval holds the median, narrows to a point for equal values, reproduces, and
    tells a clear 10 % overhead from a 2 % goal where the values' spread alone would not."""
    import random
    import statistics

    from lingcode.bench.daemon import median_interval

    assert median_interval([1.0, 1.1, 1.2]) is None  # too few pairs to say anything
    assert median_interval([1.05] * 12) == (1.05, 1.05)
    rng = random.Random(1)
    noisy = [1.10 + rng.gauss(0, 0.06) for _ in range(24)]
    low, high = median_interval(noisy)
    assert low <= statistics.median(noisy) <= high and median_interval(noisy) == (low, high)
    assert min(noisy) < 1.02 and low > 1.02


def test_pooled_pairs_each_daemon_request_with_its_own_direct_one():
    from lingcode.bench.daemon import Sample, pooled

    def sample(side, workload, cached, ttft, tpot):
        return Sample(side, workload, "off", cached, 8, ttft, tpot, client="aiohttp")

    samples = []
    for workload, slow in (("chat", 1.0), ("stdlib", 2.0)):  # the machine twice as slow for one workload
        for r in range(5):
            for cached in (False, True):
                samples += [
                    sample("direct", workload, cached, 10.0 * slow, 4.0 * slow),
                    sample("daemon", workload, cached, 10.0 * slow + 1.5, 4.0 * slow * 1.05),
                    sample("floor", workload, cached, 0.5, None),
                ]
    [row] = pooled(samples)
    assert (row["client"], row["pairs"], row["ttft_pairs"]) == ("aiohttp", 20, 10)
    assert row["tpot_ratio_paired"] == pytest.approx(1.05) and row["ttft_added_paired_ms"] == pytest.approx(1.5)
    assert row["tpot_ratio_paired_interval"] == pytest.approx((1.05, 1.05))


def test_a_result_names_the_commit_and_says_when_the_code_differs_from_it(tmp_path, monkeypatch):
    import lingcode.bench as bench

    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "lingcode").mkdir()
    (tmp_path / "lingcode" / "engine.py").write_text("A = 1\n")
    (tmp_path / "notes.md").write_text("results\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    monkeypatch.setattr(bench, "REPO", tmp_path)
    monkeypatch.delenv("LINGCODE_COMMIT", raising=False)
    commit = bench.source_commit()
    assert commit and "+" not in commit
    (tmp_path / "notes.md").write_text("more results\n")  # not the product's code
    assert bench.source_commit() == commit
    (tmp_path / "lingcode" / "engine.py").write_text("A = 2\n")  # an A/B run's other side
    assert bench.source_commit() == f"{commit}+changes"
    monkeypatch.setenv("LINGCODE_COMMIT", "abc1234")  # the GPU machine's copy has no history
    assert bench.source_commit() == "abc1234"
