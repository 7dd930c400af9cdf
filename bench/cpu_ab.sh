#!/usr/bin/env bash
# cpu_ab.sh: two anna-bench builds on the same model, alternated in one run (base, new, base,
# new, ...), so drift of the machine shows as spread rather than as a difference between them.
# For changes that must land "within noise" (refactors), and for A/B of a kernel.
#
#   bench/cpu_ab.sh BASE_ANNA_BENCH NEW_ANNA_BENCH [MODEL] [ROUNDS]
#
# MODEL defaults to the default model (scripts/fetch_default_model.sh), ROUNDS to 3. Each
# round runs each binary once: prompt 512, 128 tokens decoded, --runs 2 --warmup 1, 2 threads.
# Prints one row per run, then the median of each column per binary and new/base.
set -euo pipefail
BASE=${1:?base anna-bench} NEW=${2:?new anna-bench}
MODEL=${3:-$HOME/.cache/anna/models/qwen2.5-coder-0.5b-instruct.gguf}
ROUNDS=${4:-3}
row() { # prints "pp tg" of one anna-bench run
  "$1" --model "$MODEL" --threads 2 --prompt-lengths 512 --max-new-tokens 128 --runs 2 --warmup 1 2>/dev/null |
    awk -F'|' '/^\| +512 /{split($3,p," "); split($5,g," "); print p[1], g[1]}'
}
: >/tmp/cpu_ab.$$
for r in $(seq "$ROUNDS"); do
  for which in base new; do
    bin=$BASE; [ "$which" = new ] && bin=$NEW
    v=$(row "$bin")
    echo "$which #$r prefill/decode tok/s: $v"
    echo "$which $v" >>/tmp/cpu_ab.$$
  done
done
python3 - /tmp/cpu_ab.$$ <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
med = {w: [statistics.median(float(r[i]) for r in rows if r[0] == w) for i in (1, 2)] for w in ("base", "new")}
print(f"median base: prefill {med['base'][0]:.1f} decode {med['base'][1]:.2f}")
print(f"median new:  prefill {med['new'][0]:.1f} decode {med['new'][1]:.2f}")
print(f"new/base:    prefill {med['new'][0] / med['base'][0]:.3f} decode {med['new'][1] / med['base'][1]:.3f}")
EOF
rm -f /tmp/cpu_ab.$$
