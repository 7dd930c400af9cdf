#!/bin/sh
# spec_real_model.sh ANNA_GENERATE [MODEL]: on the real default model, greedy ids with
# --speculative ngram must equal plain greedy ids on a code-editing prompt (the n-gram
# drafter copies the snippet), and drafts must have been accepted and rejected. Exit 77
# (ctest: skipped) when the model is not downloaded.
gen="$1"
model="${2:-$HOME/.cache/anna/models/qwen2.5-coder-0.5b-instruct.gguf}"
[ -f "$model" ] || { echo "skip: $model not found"; exit 77; }
prompt='Here is a C function:

int sum_positive(const int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (a[i] > 0) s += a[i];
    }
    return s;
}

Rename it to sum_pos and make n a size_t (the loop index too). Reply with the complete function only.'
tmp="${TMPDIR:-/tmp}/spec_real_$$"
"$gen" --model "$model" --prompt "$prompt" --max-new-tokens 96 --threads 2 --print-ids >"$tmp.plain" 2>"$tmp.plain.err" ||
  { cat "$tmp.plain.err"; exit 1; }
"$gen" --model "$model" --prompt "$prompt" --max-new-tokens 96 --threads 2 --print-ids --speculative ngram \
  --draft-max 6 >"$tmp.spec" 2>"$tmp.spec.err" || { cat "$tmp.spec.err"; exit 1; }
cat "$tmp.plain.err" "$tmp.spec.err"
rc=0
cmp -s "$tmp.plain" "$tmp.spec" || { echo "FAIL: ids differ"; echo "plain: $(cat "$tmp.plain")"; echo "spec:  $(cat "$tmp.spec")"; rc=1; }
# "N drafted, M accepted (...), ..., R rollbacks": need M > 0 and R > 0
line=$(grep 'speculative ngram:' "$tmp.spec.err")
acc=$(echo "$line" | sed -n 's/.* \([0-9]*\) accepted.*/\1/p')
rb=$(echo "$line" | sed -n 's/.* \([0-9]*\) rollbacks.*/\1/p')
[ "${acc:-0}" -gt 0 ] && [ "${rb:-0}" -gt 0 ] || { echo "FAIL: need accepted and rejected drafts: $line"; rc=1; }
[ $rc -eq 0 ] && echo "ok: $(tr ',' '\n' <"$tmp.plain" | wc -l) ids identical, $acc drafts accepted, $rb rollbacks"
rm -f "$tmp.plain" "$tmp.spec" "$tmp.plain.err" "$tmp.spec.err"
exit $rc
