"""Record llama.cpp's token ids for a corpus on Qwen2.5-Coder's GGUF into qwen2_tokens.json (run by hand).

Run with the python of a venv holding llama-cpp-python (0.3.36 made the committed file), on any
Qwen2.5-Coder GGUF (they share one tokenizer):

    .venv-llama-cpp/bin/python tests/data/record_qwen2_tokens.py MODEL.gguf

With --stdin it writes the ids (a JSON list of lists) of the texts read from stdin (a JSON list),
on any GGUF, instead: tests/test_tokenizer_gguf.py runs it so, to compare with llama.cpp live. Only
llama_cpp and the standard library here: that venv has no lingcode.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("qwen2_tokens.json")

PYTHON = '''\
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Job:
    """A unit of work."""

    name: str
    retries: int = 3
    tags: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Job({self.name!r}, retries={self.retries})"


async def run(jobs: list[Job], limit: int = 4) -> dict[str, int]:
    sem = asyncio.Semaphore(limit)
    results: dict[str, int] = {}

    async def one(job: Job) -> None:
        async with sem:
            for attempt in range(job.retries):
                try:
                    results[job.name] = await asyncio.sleep(0.01, result=attempt)
                    break
                except (OSError, ValueError) as e:  # retry
                    print(f"{job.name}: {e}", file=sys.stderr)
            else:
                results[job.name] = -1

    await asyncio.gather(*(one(j) for j in jobs))
    return {k: v for k, v in sorted(results.items()) if v >= 0}


if __name__ == "__main__":
    print(asyncio.run(run([Job("a"), Job("b", 1, ["x"])])))
'''

C = """\
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct node { int key; struct node *next; } node_t;

static node_t *push(node_t *head, int key) {
    node_t *n = malloc(sizeof *n);
    if (!n) { perror("malloc"); exit(1); }
    n->key = key; n->next = head;
    return n;
}

int main(int argc, char **argv) {
    node_t *list = NULL;
    for (int i = 0; i < argc; ++i) list = push(list, atoi(argv[i]));
    for (node_t *p = list; p; p = p->next) printf("%d\\n", p->key);
    unsigned long long big = 0xFFFFFFFFFFFFFFFFULL; /* 18446744073709551615 */
    return big >> 63 ? 0 : 1;
}
"""

RUST = """\
use std::collections::HashMap;
use std::io::{self, BufRead};

#[derive(Debug, Clone, PartialEq)]
pub enum Token<'a> { Word(&'a str), Num(i64), Punct(char) }

fn count<'a>(lines: impl Iterator<Item = &'a str>) -> HashMap<&'a str, usize> {
    let mut m = HashMap::new();
    for l in lines { *m.entry(l.trim()).or_insert(0usize) += 1; }
    m
}

fn main() -> io::Result<()> {
    let stdin = io::stdin();
    let lines: Vec<String> = stdin.lock().lines().collect::<Result<_, _>>()?;
    let counts = count(lines.iter().map(|s| s.as_str()));
    println!("{:?} {:>8.3}", counts.len(), 3.14159_f64);
    Ok(())
}
"""

GO = """\
package main

import (
\t"fmt"
\t"net/http"
\t"time"
)

type Server struct {
\tAddr    string        `json:"addr"`
\tTimeout time.Duration `json:"timeout,omitempty"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
\tif r.Method != http.MethodGet {
\t\thttp.Error(w, "method not allowed", 405)
\t\treturn
\t}
\tfmt.Fprintf(w, "hello, %s\\n", r.URL.Path[1:])
}

func main() {
\ts := &Server{Addr: ":8080", Timeout: 30 * time.Second}
\tgo func() { _ = http.ListenAndServe(s.Addr, s) }()
\tselect {}
}
"""

TYPESCRIPT = """\
// @ts-check
import { readFile } from "node:fs/promises";

export interface User { id: number; name: string; email?: string | null }

const cache = new Map<number, User>();

export async function load(path: string): Promise<User[]> {
  const raw = await readFile(path, "utf8");
  const users: User[] = JSON.parse(raw) ?? [];
  users.forEach((u) => cache.set(u.id, { ...u }));
  return users.filter(({ email }) => email?.endsWith("@example.com"));
}

const sum = [1, 2, 3].reduce((a, b) => a + b, 0) >>> 0;
console.log(`sum=${sum}`, sum === 6 ? "ok" : "bad", 1e21, 0b1010, 0o777, 1_000_000n);
"""

SHELL = """\
#!/usr/bin/env bash
set -euo pipefail
IFS=$'\\n\\t'

for f in "${@:-.}"/*.log; do
  [[ -f "$f" ]] || continue
  n=$(grep -c 'ERROR' "$f" 2>/dev/null || true)
  echo "$f: ${n} errors" >&2
done | sort -k2 -n | tail -n 10
tar czf "backup-$(date +%Y%m%d).tgz" ./data && rm -rf ./tmp/*
"""

JSON_TEXT = """\
{
  "name": "lingcode",
  "version": "0.1.0",
  "scripts": {"test": "pytest -q", "lint": "ruff check ."},
  "numbers": [0, -1, 3.5e-7, 12345678901234567890, true, false, null],
  "nested": {"a": {"b": {"c": []}}},
  "unicode": "caf\\u00e9 \\ud83d\\ude00 日本語"
}
"""

MARKDOWN = """\
# Title

Some *emphasis*, **bold**, `code`, and a [link](https://example.com/a?b=1&c=2#frag).

- item one
- item two
  1. nested
  2. nested again

> A quote with trailing spaces   
> and a hard break.

| col | value |
|-----|------:|
| a   |   1.5 |

```python
print("fenced")
```
"""

SQL = """\
SELECT u.id, u.name, COUNT(o.id) AS orders, SUM(o.total)::numeric(10,2)
FROM users u
LEFT JOIN orders o ON o.user_id = u.id AND o.created_at >= NOW() - INTERVAL '30 days'
WHERE u.name ILIKE '%smith%' OR u.email IS NULL
GROUP BY 1, 2
HAVING COUNT(*) > 3
ORDER BY orders DESC
LIMIT 50;
"""

OTHER_CODE = [
    '<!DOCTYPE html>\n<html lang="en">\n<body><div class="a b" data-x=\'1\'>&amp; &lt;tag&gt;</div></body>\n</html>\n',
    "key: value\nlist:\n  - 1\n  - 'two'\n  - \"three\"\nanchor: &a {x: 1}\nref: *a\n",
    'public class Main {\n    public static void main(String[] args) {\n        System.out.println("Hi" + args.length);\n    }\n}\n',
    "CFLAGS ?= -O2 -Wall\n\nall: main.o util.o\n\t$(CC) $(CFLAGS) -o app $^\n\n%.o: %.c\n\t$(CC) -c $< -o $@\n",
    "diff --git a/x.py b/x.py\n@@ -1,3 +1,4 @@\n-old = 1\n+new = 2\n+# added\n context\n",
    "(defun fact (n) (if (<= n 1) 1 (* n (fact (- n 1)))))\n;; => 120\n",
    "x = re.compile(r'^\\s*(\\w+)\\s*=\\s*(.*?)\\s*$')  # \\d{3}-\\d{4}\n",
]

UNICODE = [
    "中文测试：你好，世界！这是一个分词器的测试。",
    "日本語のテキスト、ひらがなとカタカナ。漢字も。ｱｲｳｴｵ",
    "한국어 텍스트입니다. 안녕하세요!",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🔥💯 🧑🏿‍💻",
    "Combining: e\u0301 a\u0300 n\u0303 o\u0308 Z\u0335\u0321\u034e a\u20dd \u0915\u094d\u0937 Tiếng Việt có dấu",
    "RTL: مرحبا بالعالم! العربية ١٢٣ — עברית שלום עולם\u200f (mixed) abc",
    "Accents: café naïve façade résumé Ångström Straße Œuvre Ærø Łódź İstanbul ǅ ǈ",
    "Greek Ελληνικά αβγ ΣΊΣΥΦΟΣ, Cyrillic Привет мир ЁЖИК, Thai ภาษาไทย, हिन्दी देवनागरी",
    "Math ∑∫∂√∞≠≤≥ ∀x∈ℝ: x²≥0, ½ ⅓ ¼, Ⅻ ⅻ, ① ② ③, ℕ ℤ ℚ, 𝔸𝕓𝒞 𝟘𝟙𝟚",
    "Symbols: © ® ™ § ¶ † ‡ • … ‰ ′ ″ € £ ¥ ₹ ₿ ← → ↔ ⇒ ⌘ ⌥ ☃ ♫ ✓ ✗",
    "Zero width: a\u200bb\u200cc\u200dd\ufeffe, soft\u00adhyphen, nbsp\u00a0here, ideographic\u3000space",
    "Odd spaces: a\u2002b\u2003c\u2009d\u202fe\u205ff\u1680g\u0085h\u2028i\u2029j",
    "Fullwidth: ＡＢＣ１２３！？　ｘｙｚ and halfwidth ﾊﾝｶｸ",
    "Supplementary: 𠀀𠀁 𝄞 🀄 𓀀 𐍈 😀x😀",
    "Private/unassigned: \ue000\uf8ff \U000f0000 \u0378\u0379 \ufffd \uffff",
    "Control chars: \x00\x01\x07\x08\x1b[31mred\x1b[0m\x7f \x1c\x1d\x1e\x1f end \x04\x06\x13\x14\x16 ab\x04cd",
    # Unicode 16.0's letters and digits, neither to llama.cpp (its tables are older); planes 4-11
    "Unicode 16: \U00013460's \U00013461\U00013462x \U00016d70\U00016d71 1\U0001ccf0 \U0001e5d0'S a\U00010d40 \u1c89\u1c8ab",
    "Plane 5: a\U00050000\U00050001's b\U00090000",
]

NUMBERS = [
    "0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "12345678901234567890123456789012345678901234567890",
    "3.14159 2.718281828 -0.5 +7 1e10 6.022e23 1E-9 0x1F 0xdeadBEEF 0b1011 0o17 1_000_000",
    "v1.2.3 2024-01-31T23:59:59Z 192.168.0.1:8080 +1 (555) 123-4567 $1,234.56 99% 3/4",
    "abc123def 4567ghi a1b2c3 x86_64 utf8 ipv6 h264 9am 10pm",
    "Arabic-Indic ٠١٢٣٤٥٦٧٨٩ Devanagari ०१२३ fullwidth ０１２３ superscript ¹²³ fraction ⅞",
]

WHITESPACE = [
    "  leading two",
    "    four spaces then text",
    "trailing spaces   ",
    "\ttab\t\ttabs\t",
    " \t \t mixed\t \t",
    "a\n\nb\n\n\nc\n\n\n\n\nd",
    "\n\n\n\n\n\n\n\n",
    "line one\r\nline two\r\n\r\nline four\r\n",
    "cr only\rhere\r\r",
    "   \n   \n\t\n  x  \n",
    "x" + " " * 40 + "y",
    " " * 17,
    "\t" * 9,
    "end with newline \n",
    "a \n b \r\n c \t\n\t d",
    "form\ffeed vertical\vtab",
    "def f():\n\n    pass\n\n\n\nclass A:\n\tpass\n",
    "  ",
    " ",
    "\n",
    "",
]

CONTRACTIONS = [
    "I'm you're he's she'll we've they'd it's can't don't won't",
    "I'M YOU'RE HE'S SHE'LL WE'VE THEY'D IT'S CAN'T DON'T WON'T",
    "I'm You'Re He'S She'Ll We'vE They'D It'S rock'n'roll",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'rE 'Re 'lL 'Ll",
    "''s ''' 'x 'sa 'ss 'lll 'dd 'tis o'clock 'ſ 'K",
    "l'homme c'est l'été aujourd'hui rock'n' 'quoted' \"double\" `tick`",
    "Jones' house, the 90's, James's book 's's",
]

SPECIAL = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a function.<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>",
    "<|repo_name|>lingcode\n<|file_sep|>src/main.py\nimport os\n<|file_sep|>README.md\n# lingcode\n<|fim_pad|><|endoftext|>",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "<|im_end|><|im_start|><|im_end|><|endoftext|><|endoftext|>",
    "text<|im_start|>text<|im_end|>text <|fim_prefix|> spaced <|fim_middle|>\n\n<|fim_suffix|>\t",
    "almost: <|im_start <|im_end |> <| im_end|> <im_end> <|IM_END|> <|im_start|",
    "nested <|im_<|im_end|>start|> and <<|endoftext|>> and <|<|file_sep|>|>",
    "others: <|object_ref_start|><|box_end|><|quad_start|><|vision_start|><|image_pad|><|video_pad|><|vision_end|>",
    "unused: [PAD151665] [PAD151935] [PAD151700]",
    "<|endoftext|>",
]


def corpus() -> list[str]:
    code = [PYTHON, C, RUST, GO, TYPESCRIPT, SHELL, JSON_TEXT, MARKDOWN, SQL, *OTHER_CODE]
    return [*code, *UNICODE, *NUMBERS, *WHITESPACE, *CONTRACTIONS, *SPECIAL]


def tokenize_all(gguf: str, texts: list[str]) -> list[list[int]]:
    import llama_cpp

    vocab = llama_cpp.Llama(gguf, vocab_only=True, verbose=False)
    return [vocab.tokenize(t.encode(), add_bos=False, special=True) for t in texts]


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--stdin"]:
        json.dump(tokenize_all(args[1], json.load(sys.stdin)), sys.stdout)
        return
    import llama_cpp

    texts = corpus()
    ids = tokenize_all(args[0], texts)
    head = {"llama_cpp_python": llama_cpp.__version__, "gguf": Path(args[0]).name}
    # One text per line: the file stays small and its diffs readable.
    lines = [json.dumps({"text": t, "ids": i}, ensure_ascii=False) for t, i in zip(texts, ids)]
    body = json.dumps(head, ensure_ascii=False)[:-1] + ', "texts": [\n' + ",\n".join(lines) + "\n]}\n"
    OUT.write_text(body, encoding="utf-8")
    print(f"{OUT}: {len(texts)} texts, {sum(map(len, ids))} tokens")


if __name__ == "__main__":
    main()
