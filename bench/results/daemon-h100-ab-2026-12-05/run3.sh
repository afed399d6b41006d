#!/usr/bin/env bash
# scratch: one bench daemon run of a tree: old (.ab/held2 = dc05644) or new (the working tree)
set -uo pipefail
root=$(pwd)
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 LINGCODE_HOME=/tmp/lingcode-home LINGCODE_MODEL=/tmp/m/model.gguf
for d in server lsp tui; do ln -sfn ../$d lingcode/$d; ln -sfn ../$d .ab/held2/lingcode/$d; done
for v in "$@"; do
  dir=$root; c=4f063dd; [ "${v%%[0-9]*}" = old ] && dir=$root/.ab/held2 && c=dc05644
  echo "== $v $(date -u +%T)"
  (cd $dir && LINGCODE_COMMIT=$c timeout 300 python3 -m lingcode bench daemon --device cuda --workload chat,stdlib \
     --prompts $root/.ab/prompts.jsonl --requests 8 --max-tokens 512 --speculation off,ngram --clients httpx,aiohttp \
     --out $OUT/$v > $OUT/$v.log 2>&1; echo rc=$?)
  sed -n '/pooled/,$p' $OUT/$v.md | grep '^| [on]' | head -4
done
