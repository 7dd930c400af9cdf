#!/bin/sh
# anna-generate --draft-model: drafts from a second model with the same vocabulary.
# - the target itself as its draft model, greedy: every draft accepted (the draft context
#   follows the target's exactly), ids equal plain greedy (dense and hybrid GDN);
# - sampled (same seed): plain sampling's ids, with rejected windows rolled back in the draft
#   context too (a GDN draft model goes back to its checkpoint and re-runs);
# - a draft model of another vocabulary is refused, naming both sizes.
# usage: draft_model_cli.sh ANNA_GENERATE FIXTURES_DIR MISMATCHED_MODEL_DIR
set -u
G=$1 F=$2 X=$3
E=/tmp/draft_model_cli_$$.err
ids="1,2,3,4,5,6,1,2,3,4,5,6,1,2,3"
for m in qwen3 qwen3_5; do
  P="--model-dir $F/$m --prompt-ids $ids --max-new-tokens 40 --print-ids --threads 1"
  plain=$("$G" $P --quiet) || exit 1
  got=$("$G" $P --draft-model "$F/$m" --draft-max 4 2>$E) || { cat $E; exit 1; }
  grep "speculative draft:" $E
  [ "$got" = "$plain" ] || { echo "$m greedy: ids differ"; exit 1; }
  grep -q "(100.0%)" $E || { echo "$m drafting itself: not every draft accepted"; exit 1; }
  P="$P --temperature 0.5 --top-k 3 --seed 9 --max-new-tokens 60"
  plain=$("$G" $P --quiet) || exit 1
  got=$("$G" $P --draft-model "$F/$m" --draft-max 4 --draft-fixed 2>$E) || { cat $E; exit 1; }
  grep "speculative draft:" $E
  [ "$got" = "$plain" ] || { echo "$m sampled: ids differ"; echo "plain $plain"; echo "draft $got"; exit 1; }
  grep -q " 0 rollbacks" $E && { echo "$m sampled: no window was rejected"; exit 1; }
  grep -q " 0 accepted" $E && { echo "$m sampled: no draft accepted"; exit 1; }
done
if "$G" --model-dir "$F/qwen3" --prompt-ids 1,2 --max-new-tokens 2 --draft-model "$X" --quiet 2>$E; then
  echo "a draft model of another vocabulary was accepted"; exit 1
fi
grep -q "vocabulary of" $E || { cat $E; exit 1; }
cat $E
rm -f $E
echo "draft_model_cli: ok"
