#!/usr/bin/env python3
"""llama.cpp's grammar sampling cost per step on the same schema, replies and vocabulary as
tests/server/bench_structured.c (issue 30's comparison), through llama-cpp-python:
LlamaGrammar.from_json_schema (its json_schema_to_gbnf) -> llama_sampler_init_grammar over the
GGUF's vocabulary (loaded vocab-only: no weights are needed to mask).

For each case, B grammar samplers are set at staggered positions of the tokenized reply (as the
C bench does: sequence b has accepted the reply's first b mod n tokens; "varied" gives each
sequence its own reply, the same generator as the C bench's "person varied"); each step applies
every sampler to a full-vocabulary candidate array (what llama.cpp does when the grammar is
applied before sampling, or when the unconstrained draw was rejected and it resamples) and
accepts the sequence's next token. Reported: thread CPU ms per step for the B applies, per
mask, and the accept; and the single-candidate check llama.cpp's common sampler does first
(grammar_first = false: sample unconstrained, then test that one token) as the best case.
Candidate arrays are reset between applies outside the timed region.

  LLAMA env: source ~/.cache/anna/llama.cpp/env.sh (scripts/setup_llamacpp.sh), then
  PYTHONPATH=$LLAMA_CPP_PYTHONPATH $LLAMA_CPP_PY bench/llamacpp_grammar_cost.py \
      --model ~/.cache/anna/models/qwen2.5-coder-0.5b-instruct.gguf --batch 64 --steps 44
"""
import argparse
import ctypes
import json
import time

import numpy as np

import llama_cpp
from llama_cpp.llama_grammar import json_schema_to_gbnf

PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                  "email": {"type": "string", "format": "email"},
                                                  "tags": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                           "maxItems": 5}},
                 "required": ["name", "age", "email", "tags"], "additionalProperties": False}
PERSON_REPLY = ('{"name": "Ada Lovelace, the first programmer", "age": 36, "email": '
                '"ada@analytical.org", "tags": ["math", "poetry", "engines"]}')

M64 = (1 << 64) - 1


def person_varied(b):
    """bench_structured.c's person_varied, the same LCG and draw order."""
    first = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Margaret", "Ken", "Dennis", "Frances", "John",
             "Radia", "Niklaus", "Sophie", "Tim", "Leslie"]
    last = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Hamilton", "Thompson", "Ritchie", "Allen",
            "Backus", "Perlman", "Wirth", "Wilson"]
    dom = ["example.org", "mail.com", "uni.edu", "lab.io", "acm.org"]
    tag = ["math", "poetry", "compilers", "graphs", "proofs", "networks", "c", "structured programming", "unix",
           "lisp", "types", "ai"]
    r = [(b * 2654435761 + 12345) & M64]

    def rnd(n):
        r[0] = (r[0] * 6364136223846793005 + 1442695040888963407) & M64
        return (r[0] >> 33) % n

    f = first[rnd(16)]
    ln = last[rnd(14)]
    sp = " " if rnd(2) else ""
    num = rnd(100)
    age = 20 + rnd(60)
    d = dom[rnd(5)]
    email = "%s%s%d@%s" % (f[0].lower(), ln, num, d)
    tags = ""
    for k in range(rnd(6)):
        t = tag[rnd(12)]
        sep = (", " if rnd(2) else ",") if k else ""
        tags += '%s"%s"' % (sep, "long" if len(t) > 20 else t)
    return ('{"name":%s"%s %s",%s"age":%s%d,%s"email":%s"%s",%s"tags":%s[%s]}' %
            (sp, f, ln, sp, sp, age, sp, sp, email, sp, sp, tags))


def tokenize(vocab, text):
    b = text.encode()
    buf = (llama_cpp.llama_token * (len(b) + 16))()
    n = llama_cpp.llama_tokenize(vocab, b, len(b), buf, len(buf), False, False)
    assert n >= 0
    return list(buf[:n])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=44)
    ap.add_argument("--cases", default="person,varied")
    a = ap.parse_args()

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(a.model.encode(), mp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    nv = llama_cpp.llama_vocab_n_tokens(vocab)
    t0 = time.thread_time()
    gbnf = json_schema_to_gbnf(json.dumps(PERSON_SCHEMA))
    t_conv = time.thread_time() - t0
    print("llama-cpp-python %s, vocab %d tokens, batch %d, %d steps; schema -> GBNF %.1f ms" %
          (llama_cpp.__version__, nv, a.batch, a.steps, t_conv * 1e3))

    arr_t = llama_cpp.llama_token_data * nv
    data = arr_t()
    view = np.frombuffer(data, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
    ids0 = np.arange(nv, dtype=np.int32)
    one = (llama_cpp.llama_token_data * 1)()

    for case in a.cases.split(","):
        B = a.batch
        replies = [person_varied(b) if case == "varied" else PERSON_REPLY for b in range(B)]
        toks = [tokenize(vocab, r) for r in replies]
        smp, pos = [], []
        t0 = time.thread_time()
        for b in range(B):
            s = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
            assert s, "grammar did not compile"
            smp.append(s)
        t_init = (time.thread_time() - t0) / B
        for b in range(B):
            pos.append(b % len(toks[b]))
            for k in range(pos[b]):
                llama_cpp.llama_sampler_accept(smp[b], toks[b][k])
        apply_sum = acc_sum = chk_sum = 0.0
        worst = 0.0
        allowed = 0
        for st in range(a.steps):
            step = 0.0
            for b in range(B):
                view["id"] = ids0
                view["logit"] = 0.0
                view["p"] = 0.0
                arr = llama_cpp.llama_token_data_array(data, nv, -1, False)
                t0 = time.thread_time()
                llama_cpp.llama_sampler_apply(smp[b], ctypes.byref(arr))
                step += time.thread_time() - t0
                ok = np.isfinite(view["logit"][:arr.size])
                allowed += int(ok.sum())
                tok = toks[b][pos[b]]
                assert ok[tok], "llama.cpp's grammar rejects sequence %d's token %d" % (b, pos[b])
                # the common sampler's first test: the drawn token alone
                one[0].id, one[0].logit, one[0].p = tok, 0.0, 0.0
                arr1 = llama_cpp.llama_token_data_array(one, 1, -1, False)
                t0 = time.thread_time()
                llama_cpp.llama_sampler_apply(smp[b], ctypes.byref(arr1))
                chk_sum += time.thread_time() - t0
                t0 = time.thread_time()
                llama_cpp.llama_sampler_accept(smp[b], tok)
                acc_sum += time.thread_time() - t0
                pos[b] += 1
                if pos[b] == len(toks[b]):
                    pos[b] = 0
                    llama_cpp.llama_sampler_reset(smp[b])
            apply_sum += step
            worst = max(worst, step)
        n = a.steps * B
        print("%-7s reply %5.1f tokens (mean); grammar init %.2f ms; batch-%d full-vocabulary applies %8.2f ms/step "
              "(worst %8.2f), %.3f ms per mask, %d allowed on average; accept %.4f ms per token; single-token "
              "check %.4f ms" %
              (case, sum(len(t) for t in toks) / B, t_init * 1e3, B, apply_sum / a.steps * 1e3, worst * 1e3,
               apply_sum / n * 1e3, allowed // n, acc_sum / n * 1e3, chk_sum / n * 1e3))
        for s in smp:
            llama_cpp.llama_sampler_free(s)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
