#!/bin/sh
# anna-generate --speculative ngram|mtp with sampling (temperature, top-k/p, penalties): one seed
# gives the ids of plain sampling (speculative sampling spends one random draw per emitted
# token, as plain decoding), on the hybrid GDN fixture and the MTP fixture.
# usage: spec_sample_cli.sh ANNA_GENERATE GDN_FIXTURE_DIR MTP_FIXTURE_DIR
set -u
G=$1 D=$2 M=$3
E=/tmp/spec_sample_cli_$$.err
ids="1,2,3,4,5,6,1,2,3,4,5,6,1,2,3,4,5"
for opts in "--temperature 0.7 --top-k 20 --seed 3" "--temperature 1.0 --top-p 0.9 --repetition-penalty 1.2 --seed 11" \
            "--temperature 0.5 --min-p 0.05 --presence-penalty 0.5 --frequency-penalty 0.3 --seed 5"; do
  for spec in "$D ngram" "$M mtp"; do
    set -- $spec
    plain=$("$G" --model-dir "$1" --prompt-ids $ids --max-new-tokens 40 --print-ids --threads 1 --quiet $opts) || exit 1
    [ -n "$plain" ] || { echo "no ids"; exit 1; }
    for k in 1 3 6; do
      got=$("$G" --model-dir "$1" --prompt-ids $ids --max-new-tokens 40 --print-ids --threads 1 $opts \
            --speculative $2 --draft-max $k 2>$E) || { cat $E; exit 1; }
      grep "speculative $2:" $E
      [ "$got" = "$plain" ] || { echo "$2 K=$k [$opts]: ids differ"; echo "plain $plain"; echo "spec  $got"; exit 1; }
    done
  done
done
rm -f $E
echo "spec_sample_cli: ok"
