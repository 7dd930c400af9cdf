/* test_mtp.c: the Qwen3.5 MTP head (tests/fixtures/qwen3_5_mtp, tools/mkfix_mtp.py).
 * 1. Exactness (internal API): the main model's final-norm hidden states, and the head's
 *    post-norm outputs and logits over the fixture's (h_t, tok_{t+1}) rows against the
 *    generator's PyTorch reference within 2e-3: all rows in one batch, the same rows fed in
 *    chunks (the head's own KV cache), and a four-step draft chain.
 * 2. Greedy identity (public API): anna_mtp_prefill / _draft / _verify give the ids of plain
 *    one-token-at-a-time greedy decoding for draft lengths 1..6 and windows without drafts,
 *    with the acceptance rate printed; errors for models without a head and bad calls.
 * usage: test_mtp FIXTURE_DIR(qwen3_5_mtp) SHARED_FIXTURES */
#include "anna/anna.h"
#include "backends/registry.h"
#include "base/tuning.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/mtp.h"
#include "test_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 64
#define V 1000
#define HID 64
#define NGEN 40

typedef struct fix {
  int32_t ids[MAXR + 1];
  int n_prompt, n_rows, first_logit_row, n_chain;
  int32_t chain_tok[8];
  float hidden[MAXR * HID], out[MAXR * HID], logits[MAXR * V], chain[8 * V];
} fix;

static int read_f32(const char *dir, const char *name, float *buf, size_t n) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "rb");
  if (!f) return -1;
  size_t got = fread(buf, sizeof(float), n, f);
  fclose(f);
  return got == n ? 0 : -1;
}

static int read_fix(const char *dir, fix *x) {
  char p[1024];
  snprintf(p, sizeof p, "%s/expected.json", dir);
  json_error_t je;
  json_t *r = json_load_file(p, 0, &je);
  if (!r) return -1;
  json_t *pi = json_object_get(r, "prompt_ids"), *gi = json_object_get(r, "greedy_ids"), *ct = json_object_get(r, "chain_tokens");
  x->n_prompt = (int)json_array_size(pi);
  x->n_rows = (int)json_integer_value(json_object_get(r, "n_rows"));
  x->first_logit_row = (int)json_integer_value(json_object_get(r, "mtp_logits_first_row"));
  x->n_chain = (int)json_array_size(ct);
  int rc = -1;
  if (x->n_rows < 2 || x->n_rows > MAXR || x->n_chain > 8 || x->n_prompt + (int)json_array_size(gi) != x->n_rows + 1) goto out;
  for (int i = 0; i < x->n_prompt; i++) x->ids[i] = (int32_t)json_integer_value(json_array_get(pi, (size_t)i));
  for (size_t i = 0; i < json_array_size(gi); i++) x->ids[x->n_prompt + (int)i] = (int32_t)json_integer_value(json_array_get(gi, i));
  for (int i = 0; i < x->n_chain; i++) x->chain_tok[i] = (int32_t)json_integer_value(json_array_get(ct, (size_t)i));
  const size_t nl = (size_t)(x->n_rows - x->first_logit_row);
  if (read_f32(dir, "hidden.f32", x->hidden, (size_t)x->n_rows * HID) || read_f32(dir, "mtp_out.f32", x->out, (size_t)x->n_rows * HID) ||
      read_f32(dir, "mtp_logits.f32", x->logits, nl * V) || read_f32(dir, "chain_logits.f32", x->chain, (size_t)x->n_chain * V))
    goto out;
  rc = 0;
out:
  json_decref(r);
  return rc;
}

static double max_abs(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
  return isnan(m) ? INFINITY : m;
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

static void ok(const char *what, int cond) {
  g_checks++;
  if (!cond) {
    printf("  FAIL %s\n", what);
    g_fail++;
  }
}

/* the head over rows [r0, r1) of the fixture: (hidden r, ids[r + 1]) at position r */
static int head_rows(const text_model *m, ops_backend *be, mtp_state *s, const fix *x, int r0, int r1, int want,
                     float *h_out, float *lg, char *err, size_t errlen) {
  int32_t tok[MAXR], seq[MAXR], pos[MAXR];
  int8_t w[MAXR];
  for (int r = r0; r < r1; r++) tok[r - r0] = x->ids[r + 1], seq[r - r0] = 0, pos[r - r0] = r, w[r - r0] = (int8_t)want;
  const anna_batch b = {r1 - r0, tok, seq, pos, w};
  return mtp_run(m, be, s, &b, x->hidden + (size_t)r0 * HID, h_out, want ? lg : NULL, NULL, err, errlen);
}

static void exactness(const char *dir, const char *tag) {
  static fix x;
  char err[512], what[160];
  if (read_fix(dir, &x)) {
    ok("fixture readable", 0);
    return;
  }
  text_model *m = NULL;
  if (model_load_hf(&m, dir, err, sizeof err)) {
    printf("  load %s: %s\n", dir, err);
    ok("load", 0);
    return;
  }
  snprintf(what, sizeof what, "%s: mtp.* loaded as the MTP head", tag);
  ok(what, m->mtp != NULL && m->cfg.hidden == HID && m->cfg.vocab == V);
  if (!m->mtp) {
    model_free(m);
    return;
  }
  anna_tuning t;
  static ops_model_shape shape;
  model_shape_get(m, 256, &shape);
  ops_backend *be = NULL;
  const backend_params bp = {.n_threads = 2, .n_batch = MAXR, .shape = &shape, .tuning = &t};
  fwd_state *fs = NULL;
  mtp_state *ms = NULL;
  if (tuning_from_env(&t, NULL, err, sizeof err) || backend_registry_find("cpu")->create(&bp, &be, err, sizeof err) ||
      fwd_state_create(&fs, m, be, 1, 256, MAXR, &(fwd_state_options){.n_ckpt = 2}, err, sizeof err) ||
      mtp_state_create(&ms, m, be, 1, 256, MAXR, err, sizeof err)) {
    printf("  setup: %s\n", err);
    ok("setup", 0);
    goto done;
  }
  const int T = x.n_rows, F = x.first_logit_row;
  static float hid[MAXR * HID], hout[MAXR * HID], lg[MAXR * V];
  /* the main model's hidden states (what the head reads) */
  {
    int32_t seq[MAXR], pos[MAXR];
    int8_t w[MAXR];
    for (int r = 0; r < T; r++) seq[r] = 0, pos[r] = r, w[r] = 1;
    const anna_batch b = {T, x.ids, seq, pos, w};
    const fwd_mm mm = {.hidden = hid};
    int rc = forward_batch_mm(m, be, fs, &b, &mm, NULL, NULL, err, sizeof err);
    if (rc) printf("  main: %s\n", err);
    snprintf(what, sizeof what, "%s: main final-norm hidden states", tag);
    check(what, rc ? INFINITY : max_abs(hid, x.hidden, (size_t)T * HID), 2e-3);
  }
  /* every row in one batch */
  int rc = head_rows(m, be, ms, &x, 0, T, 1, hout, lg, err, sizeof err);
  if (rc) printf("  head: %s\n", err);
  snprintf(what, sizeof what, "%s: head outputs, %d rows in one batch", tag, T);
  check(what, rc ? INFINITY : max_abs(hout, x.out, (size_t)T * HID), 2e-3);
  snprintf(what, sizeof what, "%s: head logits rows %d..%d", tag, F, T - 1);
  check(what, rc ? INFINITY : max_abs(lg + (size_t)F * V, x.logits, (size_t)(T - F) * V), 2e-3);
  printf("  %s: head outputs max err %.2e, logits %.2e\n", tag, max_abs(hout, x.out, (size_t)T * HID),
         max_abs(lg + (size_t)F * V, x.logits, (size_t)(T - F) * V));
  /* the same rows in chunks of 5: the head's cache carries the earlier rows */
  mtp_seq_reset(ms, 0);
  double eo = 0, el = 0;
  for (int r = 0; r < T && !rc; r += 5) {
    const int e = r + 5 < T ? r + 5 : T;
    rc = head_rows(m, be, ms, &x, r, e, 1, hout, lg, err, sizeof err);
    eo = fmax(eo, max_abs(hout, x.out + (size_t)r * HID, (size_t)(e - r) * HID));
    for (int q = r; q < e; q++)
      if (q >= F) el = fmax(el, max_abs(lg + (size_t)(q - r) * V, x.logits + (size_t)(q - F) * V, V));
  }
  snprintf(what, sizeof what, "%s: head outputs / logits in chunks of 5", tag);
  check(what, rc ? INFINITY : fmax(eo, el), 2e-3);
  /* a chain after the prompt: rows 0 .. P-1 (the last one's next token is greedy_ids[0]), then
   * (previous output, its argmax) at the next positions */
  mtp_seq_reset(ms, 0);
  const int P = x.n_prompt;
  if (!rc) rc = head_rows(m, be, ms, &x, 0, P - 1, 0, NULL, NULL, err, sizeof err);
  if (!rc) rc = head_rows(m, be, ms, &x, P - 1, P, 1, hout, lg, err, sizeof err);
  double ec = rc ? INFINITY : max_abs(lg, x.chain, V);
  int same = !rc && argmax(lg, V) == x.chain_tok[0];
  for (int j = 1; j < x.n_chain && !rc; j++) {
    int32_t tok = argmax(lg, V), seq = 0, pos = P - 1 + j;
    int8_t w = 1;
    const anna_batch b = {1, &tok, &seq, &pos, &w};
    static float h1[HID];
    memcpy(h1, hout, sizeof h1);
    rc = mtp_run(m, be, ms, &b, h1, hout, lg, NULL, err, sizeof err);
    ec = fmax(ec, rc ? INFINITY : max_abs(lg, x.chain + (size_t)j * V, V));
    same &= !rc && argmax(lg, V) == x.chain_tok[j];
  }
  snprintf(what, sizeof what, "%s: %d-step draft chain logits", tag, x.n_chain);
  check(what, ec, 2e-3);
  snprintf(what, sizeof what, "%s: draft chain tokens", tag);
  ok(what, same);
  /* bad input is an error, not a crash */
  {
    int32_t tok = V, seq = 0, pos = 0;
    const anna_batch b = {1, &tok, &seq, &pos, NULL};
    snprintf(what, sizeof what, "%s: token outside the vocabulary is ANNA_EINVAL", tag);
    ok(what, mtp_run(m, be, ms, &b, x.hidden, NULL, NULL, NULL, err, sizeof err) == ANNA_EINVAL);
  }
done:
  mtp_state_free(ms);
  fwd_state_free(fs);
  if (be) be->destroy(be);
  model_free(m);
}

/* plain greedy: prompt, then NGEN tokens one at a time */
static int plain(anna_context *c, const int32_t *prompt, int n, int32_t *ids, char *err, size_t errlen) {
  static float lg[V];
  anna_context_seq_reset(c, 0);
  int32_t seq[MAXR], pos[MAXR];
  int8_t w[MAXR];
  for (int i = 0; i < n; i++) seq[i] = 0, pos[i] = i, w[i] = i == n - 1;
  anna_batch b = {n, (int32_t *)prompt, seq, pos, w};
  int rc = anna_context_decode(c, &b, lg, err, errlen);
  for (int g = 0; g < NGEN && !rc; g++) {
    ids[g] = argmax(lg, V);
    int32_t t = ids[g], s0 = 0, p0 = n + g;
    int8_t w0 = 1;
    const anna_batch b1 = {1, &t, &s0, &p0, &w0};
    if (g + 1 < NGEN) rc = anna_context_decode(c, &b1, lg, err, errlen);
  }
  return rc;
}

/* speculative greedy with the MTP drafter; skip_every > 0: every skip_every-th window has no draft */
static int spec(anna_context *c, anna_mtp *d, const int32_t *prompt, int n, int K, int skip_every, int32_t *ids,
                char *err, size_t errlen) {
  static float lg[V];
  anna_context_seq_reset(c, 0);
  anna_mtp_reset(d, 0);
  int rc = anna_mtp_prefill(d, 0, prompt, n, lg, err, errlen);
  int g = 0, win = 0;
  int32_t t = argmax(lg, V);
  while (!rc && g < NGEN) {
    ids[g++] = t;
    if (g == NGEN) break;
    int32_t draft[ANNA_SPEC_MAX_DRAFT], out[ANNA_SPEC_MAX_DRAFT + 1];
    int room = NGEN - g - 1, k = K < room ? K : room, n_out = 0;
    if (skip_every && ++win % skip_every == 0) k = 0;
    k = anna_mtp_draft(d, 0, t, draft, k, err, errlen);
    if (k < 0) return k;
    if ((rc = anna_mtp_verify(d, 0, t, draft, k, out, &n_out, err, errlen))) break;
    for (int j = 0; j < n_out - 1 && g < NGEN; j++) ids[g++] = out[j];
    t = out[n_out - 1];
  }
  return rc;
}

static void identity(const char *dir, const char *tag) {
  static fix x;
  char err[512], what[160];
  if (read_fix(dir, &x)) {
    ok("fixture readable", 0);
    return;
  }
  anna_model *m = NULL;
  anna_context *c = NULL;
  anna_mtp *d = NULL;
  const anna_context_options co = {.n_seq = 2, .n_ctx = 256, .n_batch = 32, .n_threads = 2, .n_checkpoints = 9};
  if (anna_model_load(&m, dir, NULL, err, sizeof err) || anna_context_create(&c, m, &co, err, sizeof err)) {
    printf("  %s: %s\n", tag, err);
    ok("model / context", 0);
    goto done;
  }
  snprintf(what, sizeof what, "%s: anna_model_has_mtp", tag);
  ok(what, anna_model_has_mtp(m));
  static int32_t ref[NGEN], got[NGEN];
  if (plain(c, x.ids, x.n_prompt, ref, err, sizeof err)) {
    printf("  plain: %s\n", err);
    ok("plain", 0);
    goto done;
  }
  if (anna_mtp_create(&d, c, 6, err, sizeof err)) {
    printf("  mtp: %s\n", err);
    ok("anna_mtp_create", 0);
    goto done;
  }
  for (int K = 1; K <= 6; K++) {
    for (int skip = 0; skip <= (K == 3 ? 2 : 0); skip += 2) {
      anna_spec_stats s0, s1;
      anna_context_spec_stats(c, &s0);
      memset(got, 0xff, sizeof got);
      int rc = spec(c, d, x.ids, x.n_prompt, K, skip, got, err, sizeof err);
      if (rc) printf("  spec K=%d: %s\n", K, err);
      anna_context_spec_stats(c, &s1);
      const long long dr = (long long)(s1.drafted - s0.drafted), ac = (long long)(s1.accepted - s0.accepted);
      snprintf(what, sizeof what, "%s: --speculative mtp K=%d%s: %d greedy ids == plain", tag, K,
               skip ? " (every 2nd window undrafted)" : "", NGEN);
      ok(what, !rc && !memcmp(got, ref, sizeof ref));
      printf("  %s K=%d%s: %lld windows, %lld drafted, %lld accepted (%.1f%%)\n", tag, K, skip ? " skip2" : "",
             (long long)(s1.windows - s0.windows), dr, ac, dr ? 100.0 * (double)ac / (double)dr : 0.0);
    }
  }
  /* the accepted-draft path, deterministically: drafts that are the plain ids must all be
   * accepted (verify then feeds the head a + 1 positions at once) */
  {
    float lg[V];
    anna_context_seq_reset(c, 0);
    anna_mtp_reset(d, 0);
    int rc = anna_mtp_prefill(d, 0, x.ids, x.n_prompt, lg, err, sizeof err);
    int32_t out[8], tmp[8];
    int n_out = 0, g = 0;
    for (int w = 0; w < 6 && !rc; w++) {
      rc = anna_mtp_draft(d, 0, ref[g], tmp, 4, err, sizeof err); /* exercised, then replaced by the oracle */
      if (rc >= 0) rc = anna_mtp_verify(d, 0, ref[g], ref + g + 1, 4, out, &n_out, err, sizeof err);
      if (!rc && (n_out != 5 || memcmp(out, ref + g + 1, 5 * sizeof(int32_t)))) rc = -1;
      g += 5;
    }
    snprintf(what, sizeof what, "%s: oracle drafts accepted whole, head fed 5 positions a window", tag);
    ok(what, !rc);
    /* the head built window by window from the verify's hidden states drafts what a head
     * built by one prefill of the same ids drafts */
    int32_t da[6], db[6], all[MAXR];
    int ka = rc ? -1 : anna_mtp_draft(d, 0, ref[g], da, 6, err, sizeof err);
    memcpy(all, x.ids, sizeof(int32_t) * (size_t)x.n_prompt);
    memcpy(all + x.n_prompt, ref, sizeof(int32_t) * (size_t)g);
    anna_context_seq_reset(c, 0);
    anna_mtp_reset(d, 0);
    rc = anna_mtp_prefill(d, 0, all, x.n_prompt + g, lg, err, sizeof err);
    int kb = rc ? -1 : anna_mtp_draft(d, 0, ref[g], db, 6, err, sizeof err);
    snprintf(what, sizeof what, "%s: drafts after 6 accepted windows == drafts after one prefill", tag);
    ok(what, ka == 6 && kb == 6 && !memcmp(da, db, sizeof da) && argmax(lg, V) == ref[g]);
    /* (API next) anna_mtp_feed: the same prompt in chunks on seq 1 (the last with logits)
     * drafts what the one prefill drafts, with the same last logits */
    const int nall = x.n_prompt + g;
    float lg2[V];
    int32_t dc[6];
    anna_context_seq_reset(c, 1);
    anna_mtp_reset(d, 1);
    rc = 0; /* chunks of 3 but the last (a third of the head's entries pair across chunks) */
    int at = 0;
    for (; !rc && nall - at > 4; at += 3) rc = anna_mtp_feed(d, 1, all + at, 3, NULL, err, sizeof err);
    if (!rc) rc = anna_mtp_feed(d, 1, all + at, nall - at, lg2, err, sizeof err);
    int kc = rc ? -1 : anna_mtp_draft(d, 1, ref[g], dc, 6, err, sizeof err);
    if (rc) printf("  feed: %s\n", err);
    snprintf(what, sizeof what, "%s: anna_mtp_feed in chunks of 3 drafts == one prefill's, logits within 1e-4", tag);
    ok(what, kc == 6 && !memcmp(dc, db, sizeof db) && max_abs(lg, lg2, V) < 1e-4);
    /* anna_mtp_verify_batch: both sequences in one pass (seq 1 three positions ahead, so their
     * rows differ), oracle windows of 4 (seq 0) and 2 (seq 1); each head then drafts what a
     * head built by one prefill of its ids drafts */
    int32_t o0[5], o1[3], d0[6], d1[6], e0[6], e1[6];
    int n1 = 0;
    if (kc == 6) rc = anna_mtp_verify(d, 1, ref[g], ref + g + 1, 2, o1, &n1, err, sizeof err);
    anna_spec_window w[2] = {{.seq = 0, .last = ref[g], .draft = ref + g + 1, .k = 4, .out = o0},
                             {.seq = 1, .last = ref[g + 3], .draft = ref + g + 4, .k = 2, .out = o1}};
    if (!rc && n1 == 3) rc = anna_mtp_verify_batch(d, w, 2, NULL, NULL, err, sizeof err);
    int k0 = -1, k1 = -1, f0 = -1, f1 = -1;
    if (!rc && w[0].n_out == 5 && w[1].n_out == 3) {
      k0 = anna_mtp_draft(d, 0, ref[g + 5], d0, 6, err, sizeof err);
      k1 = anna_mtp_draft(d, 1, ref[g + 6], d1, 6, err, sizeof err);
      memcpy(all + nall, ref + g, 6 * sizeof(int32_t));
      anna_context_seq_reset(c, 0), anna_mtp_reset(d, 0);
      anna_context_seq_reset(c, 1), anna_mtp_reset(d, 1);
      if (!anna_mtp_prefill(d, 0, all, nall + 5, lg, err, sizeof err)) f0 = anna_mtp_draft(d, 0, ref[g + 5], e0, 6, err, sizeof err);
      if (!anna_mtp_prefill(d, 1, all, nall + 6, lg, err, sizeof err)) f1 = anna_mtp_draft(d, 1, ref[g + 6], e1, 6, err, sizeof err);
    } else {
      printf("  verify_batch: rc %d n_out %d %d %s\n", rc, w[0].n_out, w[1].n_out, rc ? err : "");
    }
    snprintf(what, sizeof what, "%s: anna_mtp_verify_batch (windows of 4 and 2): each head drafts as after one prefill", tag);
    ok(what, k0 == 6 && k1 == 6 && f0 == 6 && f1 == 6 && !memcmp(d0, e0, sizeof d0) && !memcmp(d1, e1, sizeof d1));
    /* (API next) anna_mtp_draft_batch over the same two prefills (the sequences listed in
     * reverse, 6 and 3 drafts: chain steps with one and with two rows) drafts as one by one */
    int32_t bd[2 * ANNA_SPEC_MAX_DRAFT];
    int bs[2] = {1, 0}, bk[2] = {6, 3};
    const int32_t bl[2] = {ref[g + 6], ref[g + 5]};
    anna_context_seq_reset(c, 0), anna_mtp_reset(d, 0);
    anna_context_seq_reset(c, 1), anna_mtp_reset(d, 1);
    rc = anna_mtp_prefill(d, 0, all, nall + 5, lg, err, sizeof err);
    if (!rc) rc = anna_mtp_prefill(d, 1, all, nall + 6, lg, err, sizeof err);
    if (!rc) rc = anna_mtp_draft_batch(d, 2, bs, bl, bk, bd, err, sizeof err);
    if (rc) printf("  draft_batch: %s\n", err);
    snprintf(what, sizeof what, "%s: anna_mtp_draft_batch (2 sequences, 6 and 3 drafts) == anna_mtp_draft", tag);
    ok(what, !rc && bk[0] == 6 && bk[1] == 3 && f0 == 6 && f1 == 6 && !memcmp(bd, e1, 6 * sizeof(int32_t)) &&
                 !memcmp(bd + ANNA_SPEC_MAX_DRAFT, e0, 3 * sizeof(int32_t)));
    /* and the heads were rewound to the true positions: after an oracle window of 2 the head
     * drafts what a head built by one prefill of the same ids drafts */
    int32_t ob[4], gd[6], fd[6];
    int nb2 = 0, kg = -1, kf = -1;
    rc = rc ? rc : anna_mtp_verify(d, 1, ref[g + 6], ref + g + 7, 2, ob, &nb2, err, sizeof err);
    if (!rc && nb2 == 3) {
      kg = anna_mtp_draft(d, 1, ref[g + 9], gd, 6, err, sizeof err);
      memcpy(all + nall, ref + g, 9 * sizeof(int32_t));
      anna_context_seq_reset(c, 0), anna_mtp_reset(d, 0);
      if (!anna_mtp_prefill(d, 0, all, nall + 9, lg, err, sizeof err)) kf = anna_mtp_draft(d, 0, ref[g + 9], fd, 6, err, sizeof err);
    }
    snprintf(what, sizeof what, "%s: after anna_mtp_draft_batch and a window, drafts as after one prefill", tag);
    ok(what, kg == 6 && kf == 6 && !memcmp(gd, fd, sizeof gd));
  }
  /* calls out of order / bad arguments */
  {
    float lg[V];
    int32_t dr[4];
    snprintf(what, sizeof what, "%s: prefill of a non-empty sequence is ANNA_EINVAL", tag);
    ok(what, anna_mtp_prefill(d, 0, x.ids, 3, lg, err, sizeof err) == ANNA_EINVAL);
    snprintf(what, sizeof what, "%s: sequence out of range is ANNA_ERANGE", tag);
    ok(what, anna_mtp_draft(d, 7, 1, dr, 2, err, sizeof err) == ANNA_ERANGE);
    anna_context_seq_reset(c, 1);
    anna_mtp_reset(d, 1);
    snprintf(what, sizeof what, "%s: draft before prefill is ANNA_ESTATE", tag);
    ok(what, anna_mtp_draft(d, 1, 1, dr, 2, err, sizeof err) == ANNA_ESTATE);
  }
done:
  anna_mtp_free(d);
  anna_context_free(c);
  anna_model_free(m);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s QWEN3_5_MTP_DIR SHARED_FIXTURES\n", argv[0]);
    return 2;
  }
  char dir[1024];
  const char *tags[2] = {"dense", "moe"};
  for (int i = 0; i < 2; i++) {
    snprintf(dir, sizeof dir, "%s/%s", argv[1], tags[i]);
    exactness(dir, tags[i]);
    identity(dir, tags[i]);
  }
  /* a model without a head */
  {
    char err[256];
    anna_model *m = NULL;
    anna_context *c = NULL;
    anna_mtp *d = NULL;
    snprintf(dir, sizeof dir, "%s/qwen3_5_text", argv[2]);
    const anna_context_options co = {.n_ctx = 64, .n_batch = 8, .n_checkpoints = 4};
    int rc = anna_model_load(&m, dir, NULL, err, sizeof err);
    if (!rc) rc = anna_context_create(&c, m, &co, err, sizeof err);
    ok("qwen3_5_text (no mtp.*): anna_model_has_mtp 0, anna_mtp_create ANNA_EUNSUPPORTED",
       !rc && !anna_model_has_mtp(m) && anna_mtp_create(&d, c, 4, err, sizeof err) == ANNA_EUNSUPPORTED && !d);
    anna_context_free(c);
    anna_model_free(m);
  }
  printf("test_mtp: %d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
