#!/bin/sh
# anna-generate --speculative mtp gives the plain greedy ids (tests/fixtures/qwen3_5_mtp/dense),
# and refuses a model without an MTP head.
# usage: mtp_cli.sh ANNA_GENERATE MTP_FIXTURE_DIR NO_MTP_MODEL_DIR
set -u
G=$1 D=$2 N=$3
P="def f(x):\n    return x"
plain=$("$G" --model-dir "$D" --prompt "$P" --max-new-tokens 48 --print-ids --threads 1 --quiet) || exit 1
[ -n "$plain" ] || { echo "no ids"; exit 1; }
for k in 1 2 4 6; do
  got=$("$G" --model-dir "$D" --prompt "$P" --max-new-tokens 48 --print-ids --threads 1 --speculative mtp --draft-max $k 2>/tmp/mtp_cli_$$.err) || { cat /tmp/mtp_cli_$$.err; exit 1; }
  grep "speculative mtp:" /tmp/mtp_cli_$$.err
  [ "$got" = "$plain" ] || { echo "K=$k: ids differ"; echo "plain $plain"; echo "mtp   $got"; exit 1; }
done
rm -f /tmp/mtp_cli_$$.err
if "$G" --model-dir "$N" --prompt "hi" --max-new-tokens 4 --speculative mtp --quiet 2>/tmp/mtp_cli_$$.err; then
  echo "a model without mtp.* was accepted"; exit 1
fi
grep -q "no MTP head" /tmp/mtp_cli_$$.err || { cat /tmp/mtp_cli_$$.err; exit 1; }
rm -f /tmp/mtp_cli_$$.err
echo "mtp_cli: ok"
