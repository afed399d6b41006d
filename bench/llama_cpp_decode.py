"""llama.cpp's own decode step, without Python around it: is `lingcode bench --peers llama.cpp`
measuring llama.cpp or llama-cpp-python?

Times Llama.eval (one token) and the bare llama_decode call on the same GGUF and thread count,
after a prompt, as medians. Run with the peer's Python (make llama-cpp-peer):

    .venv-llama-cpp/bin/python bench/llama_cpp_decode.py MODEL.gguf [--threads 2] [--tokens 128]

--ask QUESTION also prints llama.cpp's greedy chat answer to it (30 tokens), to compare with
lingcode's on the same file.
"""

import argparse
import statistics
import time

import llama_cpp
from llama_cpp import Llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ask", action="append", default=[], metavar="QUESTION")
    args = parser.parse_args()
    llm = Llama(args.model, n_threads=args.threads, n_threads_batch=args.threads, n_ctx=2048, verbose=False)
    for question in args.ask:
        reply = llm.create_chat_completion(
            messages=[{"role": "user", "content": question}], temperature=0, max_tokens=30
        )
        print(f"{question!r} -> {reply['choices'][0]['message']['content']!r}")
    llm.reset()
    prompt = llm.tokenize(b"def fibonacci(n):\n    " * 10)
    llm.eval(prompt)

    def median_ms(step) -> float:
        times = []
        for i in range(args.tokens):
            started = time.perf_counter()
            step(prompt[i % len(prompt)])
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    print(f"Llama.eval, one token: {median_ms(lambda t: llm.eval([t])):.3f} ms")
    ctx = llm._ctx.ctx
    print(
        f"llama_decode, one token: "
        f"{median_ms(lambda t: llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(t), 1))):.3f} ms"
    )
    print(
        f"llama-cpp-python {llama_cpp.__version__}, {args.threads} threads; {llama_cpp.llama_print_system_info().decode().strip()}"
    )


if __name__ == "__main__":
    main()
