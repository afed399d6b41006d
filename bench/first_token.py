"""The first token of a greedy chat answer, and how near its rivals are, per CPU kernel set.

For a question whose greedy answer differs between engines, a near tie at the first token says
why. Run from a checkout with lingcode installed:

    python bench/first_token.py "What is the capital of France?" "What is the capital of Germany?"
"""

import argparse

import torch

from lingcode import models
from lingcode.engine.local import load_engine
from lingcode.text.chat_template import render_chat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", nargs="+")
    parser.add_argument("--kernels", default="native,torch", help="comma-separated CPU kernel sets")
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    for kernels in args.kernels.split(","):
        engine = load_engine(models.ensure(None), device="cpu", kernels=kernels)
        info = engine.info
        for question in args.questions:
            ids = info.tokenizer.encode(render_chat(info.chat_template, [{"role": "user", "content": question}]))
            logits = engine.step(ids, 0).reshape(-1, info.tokenizer.vocab_size)[-1].float()
            probs, tokens = torch.softmax(logits, -1).topk(args.top)
            ranked = ", ".join(f"{info.tokenizer.decode([int(t)])!r} {float(p):.3f}" for p, t in zip(probs, tokens))
            print(f"{kernels}: {question!r} -> {ranked}")


if __name__ == "__main__":
    main()
