"""Deterministic training text for the demo tokenizer (generated, so nothing has to be shipped)."""

from __future__ import annotations

import random

_SUBJECTS = ["the server", "a model", "the kernel", "this port", "the cache", "a request", "the GPU",
             "the CPU", "an expert", "the scheduler", "a token", "the window"]
_VERBS = ["loads", "reads", "writes", "serves", "routes", "checks", "answers", "compresses", "stores",
          "measures", "streams", "quantizes"]
_OBJECTS = ["weights", "tokens", "experts", "pages", "blocks", "logits", "prompts", "tensors", "files",
            "replies", "scales", "layers"]
_CODE = ["def main():", "return x + y", "for i in range(10):", "import torch", "print('hello')",
         "class Model:", "if x is None:", "x = torch.zeros(4)", "while True:", "{\"role\": \"user\"}"]
_WORDS = ["hello", "world", "windows", "linux", "deepseek", "flash", "attention", "sparse", "memory",
          "fast", "slow", "correct", "number", "seven", "answer", "question", "please", "thanks"]


def demo_corpus(lines: int = 4000, seed: int = 1234) -> list[str]:
    """Lines of simple English, code and numbers from a fixed seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.5:
            out.append(f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} "
                       f"{rng.randint(2, 999)} {rng.choice(_OBJECTS)}.")
        elif kind < 0.75:
            out.append(rng.choice(_CODE))
        else:
            out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 9))) + "?")
    return out
