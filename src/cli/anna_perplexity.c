/* anna-perplexity: perplexity of a model over a text file, and KL divergence against saved
 * reference log-probabilities, in llama.cpp's llama-perplexity conventions so the figures
 * compare with it:
 *   - the whole text is tokenized once (the model's BOS added when it adds one, special-token
 *     texts taken as plain text) and cut into non-overlapping chunks of --ctx tokens; a tail
 *     shorter than a chunk is dropped, and at least 2 chunks' worth of tokens are needed;
 *   - each chunk is evaluated from an empty cache, its first token replaced by BOS when the
 *     model adds one;
 *   - only the second half is scored: the logits at positions ctx/2 .. ctx-2 predict the next
 *     token (ctx - 1 - ctx/2 tokens per chunk); PPL = exp(mean NLL), printed as running
 *     "[chunk]ppl," values and "Final estimate: PPL = X +/- Y" (Y as llama.cpp computes it).
 * --save-logits writes llama.cpp's --kl-divergence-base file ("_logits_", uint32 n_ctx, int32
 * n_vocab, int32 n_chunk, int32 tokens[n_chunk * n_ctx], then per scored position float scale,
 * float min_log_prob and uint16 codes of the log-probs within 16 nats of the top, n_vocab
 * rounded up to even), so a base file from either tool is read by the other; --kl-base reads
 * one (its tokens and ctx; --file is not needed) and reports KL(base || this model). */
#include "anna/anna.h"
#include "cli_common.h"

#include <math.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: anna-perplexity --model-dir DIR|--model FILE.gguf|--hf-repo ORG/NAME[:FILE|:TAG] --file TEXT [options]\n"
          "  --file TEXT              the text (UTF-8) to score\n"
          "  --ctx N                  tokens per chunk (default 512, as llama-perplexity -c)\n"
          "  --batch N                tokens per decode call (default min(ctx, 512))\n"
          "  --chunks N               score the first N chunks only (default all)\n"
          "  --save-logits FILE       write the scored log-probs (llama.cpp --kl-divergence-base format)\n"
          "  --kl-base FILE           KL divergence against such a file (its tokens and ctx; no --file)\n"
          "  --threads N  --exact  --dtype f32|bf16  --tuning K=V,...\n"
          CLI_DEVICE_USAGE
          "  --kv-cache-quantization none|f16|q8|q4|turboquant  --weight-quant none|auto|int4\n"
          "  --quiet                  only the final lines\n");
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t k;
  while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  fclose(f);
  if (buf) *len = n;
  return buf;
}

/* llama.cpp's rounding (the float magic-number trick gives round-half-even). */
static int nearest_int(float x) {
  return (int)lrintf(x);
}

/* NLL of tok under logits[V] (double accumulation, as llama.cpp); writes the base-file row
 * (2 floats + V codes) into row when row != NULL. Also returns the argmax and lse. */
static double row_nll(const float *logits, int V, int tok, uint16_t *row, int *argmax, double *lse_out) {
  float mx = logits[0], mn = logits[0];
  int am = 0;
  for (int i = 1; i < V; i++) {
    if (logits[i] > mx) mx = logits[i], am = i;
    if (logits[i] < mn) mn = logits[i];
  }
  double sum = 0;
  for (int i = 0; i < V; i++) sum += expf(logits[i] - mx);
  const float lse = (float)log(sum);
  if (row) {
    if (mn < mx - 16) mn = mx - 16;
    const float scale = (mx - mn) / 65535.f, min_lp = mn - mx - lse;
    memcpy(row, &scale, 4);
    memcpy(row + 2, &min_lp, 4);
    uint16_t *code = row + 4;
    memset(code, 0, sizeof(uint16_t) * (size_t)(V + (V & 1)));
    if (scale != 0) {
      const float inv = 1 / scale;
      for (int i = 0; i < V; i++) code[i] = logits[i] > mn ? (uint16_t)nearest_int(inv * (logits[i] - mn)) : 0;
    }
  }
  *argmax = am;
  *lse_out = (double)mx + lse;
  return (double)mx + lse - logits[tok];
}

typedef struct kld_acc {
  double kld, kld2, nll_base, nll_base2, dp2, kld_max;
  int64_t n, same_top;
} kld_acc;

/* KL(base || q) at one position, base from a base-file row, q = softmax(logits). */
static void row_kld(const float *logits, int V, double lse, int argmax, int tok, const uint16_t *row, double nll,
                    kld_acc *k) {
  float scale, min_lp;
  memcpy(&scale, row, 4);
  memcpy(&min_lp, row + 2, 4);
  const uint16_t *code = row + 4;
  double sum = 0;
  int am_base = 0;
  float best = -INFINITY;
  for (int i = 0; i < V; i++) {
    const float lp_base = scale * code[i] + min_lp;
    if (lp_base > best) best = lp_base, am_base = i;
    if (lp_base > -16.f) sum += expf(lp_base) * (lp_base - (logits[i] - lse));
  }
  const double nll_base = -(scale * code[tok] + min_lp);
  const double dp = exp(-nll) - exp(-nll_base);
  k->kld += sum;
  k->kld2 += sum * sum;
  if (sum > k->kld_max) k->kld_max = sum;
  k->nll_base += nll_base;
  k->nll_base2 += nll_base * nll_base;
  k->dp2 += dp * dp;
  k->same_top += argmax == am_base;
  k->n++;
}

int main(int argc, char **argv) {
  const char *model = NULL, *hf = NULL, *file = NULL, *save = NULL, *base = NULL;
  int tensor_parallel = 0;
  const char *tp_comm = NULL;
  const char *layer_split = NULL, *device = NULL, *dtype = NULL, *tuning = NULL, *kvq = NULL, *wq = NULL;
  int n_ctx = 0, n_batch = 0, max_chunks = -1, threads = 0, exact = 0, quiet = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--model-dir") || !strcmp(a, "--model")) { CLI_NEEDV(); model = v; }
    else if (!strcmp(a, "--hf-repo")) { CLI_NEEDV(); hf = v; }
    else if (!strcmp(a, "--file")) { CLI_NEEDV(); file = v; }
    else if (!strcmp(a, "--ctx") || !strcmp(a, "--ctx-size")) { CLI_NEEDV(); if (cli_int(a, v, 4, 1 << 20, &n_ctx)) return 2; }
    else if (!strcmp(a, "--batch")) { CLI_NEEDV(); if (cli_int(a, v, 1, 1 << 20, &n_batch)) return 2; }
    else if (!strcmp(a, "--chunks")) { CLI_NEEDV(); if (cli_int(a, v, 1, 1 << 30, &max_chunks)) return 2; }
    else if (!strcmp(a, "--save-logits")) { CLI_NEEDV(); save = v; }
    else if (!strcmp(a, "--kl-base")) { CLI_NEEDV(); base = v; }
    else if (!strcmp(a, "--threads")) { CLI_NEEDV(); if (cli_int(a, v, 0, 4096, &threads)) return 2; }
    else if (!strcmp(a, "--device")) { CLI_NEEDV(); device = v; }
    else if (!strcmp(a, "--layer-split")) { CLI_NEEDV(); layer_split = v; }
    else if (!strcmp(a, "--tensor-parallel")) { CLI_NEEDV(); if (cli_int(a, v, 1, 8, &tensor_parallel)) return 2; }
    else if (!strcmp(a, "--tp-comm")) { CLI_NEEDV(); tp_comm = v; }
    else if (!strcmp(a, "--list-devices")) return cli_list_devices();
    else if (!strcmp(a, "--dtype")) { CLI_NEEDV(); dtype = v; }
    else if (!strcmp(a, "--tuning")) { CLI_NEEDV(); tuning = v; }
    else if (!strcmp(a, "--kv-cache-quantization")) { CLI_NEEDV(); kvq = v; }
    else if (!strcmp(a, "--weight-quant")) { CLI_NEEDV(); if (cli_weight_quant(a, v)) return 2; wq = v; }
    else if (!strcmp(a, "--exact")) exact = 1;
    else if (!strcmp(a, "--quiet")) quiet = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
    else { fprintf(stderr, "error: unknown flag '%s'\n", a); usage(stderr); return 2; }
  }
  if (save && base) {
    fprintf(stderr, "error: --save-logits and --kl-base exclude each other\n");
    return 2;
  }
  if (!base && !file) {
    fprintf(stderr, "error: need --file TEXT (or --kl-base FILE)\n");
    usage(stderr);
    return 2;
  }
  if (cli_hf_model(hf, &model)) return 1;
  if (!model) {
    fprintf(stderr, "error: need --model-dir, --model or --hf-repo\n");
    usage(stderr);
    return 2;
  }
  char err[1024] = "";
  int rc = 1;
  anna_model *m = NULL;
  anna_context *ctx = NULL;
  anna_text *text = NULL;
  int32_t *toks = NULL, *btok = NULL, *bseq = NULL, *bpos = NULL, *bos_probe = NULL;
  int8_t *want = NULL;
  float *logits = NULL;
  uint16_t *row = NULL;
  char *buf = NULL;
  FILE *sf = NULL, *bf = NULL;
  size_t n_tok = 0;
  int n_chunk = 0;

  cli_progress prog = {0};
  anna_model_options mo = {.device = device, .dtype = dtype, .tuning = tuning, .weight_quant = wq,
                           .progress = cli_load_progress, .progress_user = &prog};
  if (anna_model_load(&m, model, &mo, err, sizeof err)) goto fail;
  const int V = anna_model_vocab(m);
  if (anna_text_open(&text, model, ANNA_TEXT_NO_TEMPLATE, err, sizeof err)) goto fail;
  /* The BOS llama.cpp puts at each chunk's start: the model's, when tokenizing adds one. */
  size_t nb = 0;
  if (anna_text_tokenize(text, "", 0, ANNA_TOKENIZE_ADD_SPECIAL, &bos_probe, &nb, err, sizeof err)) goto fail;
  const int32_t bos = anna_text_bos(text);
  const int add_bos = nb >= 1 && bos >= 0 && bos_probe[0] == bos;

  if (base) {
    if (!(bf = fopen(base, "rb"))) {
      snprintf(err, sizeof err, "--kl-base %s: cannot open", base);
      goto fail;
    }
    char magic[8];
    uint32_t fctx;
    int32_t fv, fchunk;
    if (fread(magic, 1, 8, bf) != 8 || memcmp(magic, "_logits_", 8) || fread(&fctx, 4, 1, bf) != 1 ||
        fread(&fv, 4, 1, bf) != 1 || fread(&fchunk, 4, 1, bf) != 1) {
      snprintf(err, sizeof err, "--kl-base %s: not a llama.cpp / anna logits file (no _logits_ header)", base);
      goto fail;
    }
    if (fv != V) {
      snprintf(err, sizeof err, "--kl-base %s: vocabulary %d, this model's is %d", base, fv, V);
      goto fail;
    }
    if (fctx < 4 || fctx > (1u << 20) || fchunk < 1 || (int64_t)fctx * fchunk > (1 << 28)) {
      snprintf(err, sizeof err, "--kl-base %s: implausible n_ctx %u / n_chunk %d", base, fctx, fchunk);
      goto fail;
    }
    if (n_ctx && (uint32_t)n_ctx != fctx) {
      snprintf(err, sizeof err, "--ctx %d differs from the base file's %u", n_ctx, fctx);
      goto fail;
    }
    n_ctx = (int)fctx;
    n_tok = (size_t)fctx * (size_t)fchunk;
    if (!(toks = malloc(n_tok * sizeof *toks)) || fread(toks, sizeof *toks, n_tok, bf) != n_tok) {
      snprintf(err, sizeof err, "--kl-base %s: truncated token list", base);
      goto fail;
    }
    for (size_t i = 0; i < n_tok; i++)
      if (toks[i] < 0 || toks[i] >= V) {
        snprintf(err, sizeof err, "--kl-base %s: token %d out of range", base, toks[i]);
        goto fail;
      }
    n_chunk = fchunk;
  } else {
    size_t len = 0;
    if (!(buf = read_all(file, &len))) {
      snprintf(err, sizeof err, "--file %s: cannot read", file);
      goto fail;
    }
    if (!n_ctx) n_ctx = 512;
    if (anna_text_tokenize(text, buf, len, ANNA_TOKENIZE_ADD_SPECIAL | ANNA_TOKENIZE_NO_PARSE_SPECIAL, &toks, &n_tok,
                           err, sizeof err))
      goto fail;
    if (n_tok < 2 * (size_t)n_ctx) {
      snprintf(err, sizeof err, "%s has %zu tokens; --ctx %d needs at least %d (two chunks, as llama-perplexity)",
               file, n_tok, n_ctx, 2 * n_ctx);
      goto fail;
    }
    n_chunk = (int)(n_tok / (size_t)n_ctx);
  }
  if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
  if (!n_batch) n_batch = n_ctx < 512 ? n_ctx : 512;
  if (n_batch > n_ctx) n_batch = n_ctx;
  const int first = n_ctx / 2, n_score = n_ctx - 1 - first;
  const int nv = 2 * ((V + 1) / 2) + 4; /* uint16 words per base-file position */
  anna_context_options co = {.n_seq = 1, .n_ctx = n_ctx, .n_batch = n_batch, .n_threads = threads,
                             .device = device, .layer_split = layer_split,
                             .tensor_parallel = tensor_parallel, .tp_comm = tp_comm, .kv_cache_quantization = kvq, .exact_matmul = exact,
                             .tuning = tuning};
  if (anna_context_create(&ctx, m, &co, err, sizeof err)) goto fail;
  cli_print_stages(ctx);
  btok = malloc(sizeof *btok * (size_t)n_batch);
  bseq = calloc((size_t)n_batch, sizeof *bseq);
  bpos = malloc(sizeof *bpos * (size_t)n_batch);
  want = malloc((size_t)n_batch);
  const int rows = n_batch < n_score ? n_batch : n_score;
  logits = malloc(sizeof(float) * (size_t)V * (size_t)rows);
  row = malloc(sizeof(uint16_t) * (size_t)nv);
  if (!btok || !bseq || !bpos || !want || !logits || !row) {
    snprintf(err, sizeof err, "out of memory (%d logits rows of %d)", rows, V);
    goto fail;
  }
  if (save) {
    if (!(sf = fopen(save, "wb"))) {
      snprintf(err, sizeof err, "--save-logits %s: cannot open for writing", save);
      goto fail;
    }
    const uint32_t c32 = (uint32_t)n_ctx;
    const int32_t v32 = V, k32 = n_chunk;
    if (fwrite("_logits_", 1, 8, sf) != 8 || fwrite(&c32, 4, 1, sf) != 1 || fwrite(&v32, 4, 1, sf) != 1 ||
        fwrite(&k32, 4, 1, sf) != 1 ||
        fwrite(toks, sizeof *toks, (size_t)n_chunk * (size_t)n_ctx, sf) != (size_t)n_chunk * (size_t)n_ctx) {
      snprintf(err, sizeof err, "--save-logits %s: write failed", save);
      goto fail;
    }
  }
  if (!quiet)
    fprintf(stderr, "anna-perplexity: %zu tokens, %d chunks of %d (scoring %d each), batch %d, BOS %s\n", n_tok,
            n_chunk, n_ctx, n_score, n_batch, add_bos ? "at each chunk" : "none");

  double nll = 0, nll2 = 0;
  int64_t count = 0;
  kld_acc k = {0};
  const double t0 = cli_now();
  for (int c = 0; c < n_chunk; c++) {
    const int32_t *ct = toks + (size_t)c * (size_t)n_ctx;
    anna_context_seq_reset(ctx, 0);
    for (int at = 0; at < n_ctx; at += n_batch) {
      const int len = n_ctx - at < n_batch ? n_ctx - at : n_batch;
      for (int i = 0; i < len; i++) {
        const int p = at + i;
        btok[i] = p == 0 && add_bos ? bos : ct[p];
        bpos[i] = p;
        want[i] = p >= first && p <= n_ctx - 2;
      }
      anna_batch b = {len, btok, bseq, bpos, want};
      if (anna_context_decode(ctx, &b, logits, err, sizeof err)) goto fail;
      int r = 0;
      for (int i = 0; i < len; i++) {
        if (!want[i]) continue;
        const int p = at + i;
        const float *lg = logits + (size_t)r++ * (size_t)V;
        int am;
        double lse;
        const double x = row_nll(lg, V, ct[p + 1], sf ? row : NULL, &am, &lse);
        nll += x;
        nll2 += x * x;
        count++;
        if (sf && fwrite(row, sizeof(uint16_t), (size_t)nv, sf) != (size_t)nv) {
          snprintf(err, sizeof err, "--save-logits %s: write failed", save);
          goto fail;
        }
        if (bf) {
          if (fread(row, sizeof(uint16_t), (size_t)nv, bf) != (size_t)nv) {
            snprintf(err, sizeof err, "--kl-base %s: truncated at chunk %d", base, c + 1);
            goto fail;
          }
          row_kld(lg, V, lse, am, ct[p + 1], row, x, &k);
        }
      }
    }
    if (!quiet) {
      if (c == 0) fprintf(stderr, "%.2f seconds per chunk\n", cli_now() - t0);
      printf("[%d]%.4f,", c + 1, exp(nll / (double)count));
      fflush(stdout);
    }
  }
  if (!quiet) printf("\n");
  fflush(stdout);
  {
    const double mean = nll / (double)count, ppl = exp(mean);
    double var = nll2 / (double)count - mean * mean;
    const double sd = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) : 0;
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, sd * ppl);
    if (bf) {
      const double n = (double)k.n, km = k.kld / n;
      double kv = k.kld2 / n - km * km;
      const double ke = kv > 0 && k.n > 1 ? sqrt(kv / (n - 1)) : 0;
      printf("Mean PPL(Q)        : %.6f\n", ppl);
      printf("Mean PPL(base)     : %.6f\n", exp(k.nll_base / n));
      printf("Mean ln(PPL(Q)/PPL(base)): %.6f\n", mean - k.nll_base / n);
      printf("Mean KLD           : %.6f +/- %.6f\n", km, ke);
      printf("Maximum KLD        : %.6f\n", k.kld_max);
      printf("Same top p         : %.3f %%\n", 100.0 * (double)k.same_top / n);
      printf("RMS Delta p        : %.3f %%\n", 100.0 * sqrt(k.dp2 / n));
    }
    fflush(stdout);
    if (!quiet) fprintf(stderr, "%lld tokens scored in %.2f s\n", (long long)count, cli_now() - t0);
  }
  rc = 0;
fail:
  if (rc) fprintf(stderr, "error: %s\n", err);
  if (sf && fclose(sf) && !rc) {
    fprintf(stderr, "error: --save-logits %s: write failed\n", save);
    rc = 1;
  }
  if (bf) fclose(bf);
  free(buf);
  free(toks);
  free(bos_probe);
  free(btok);
  free(bseq);
  free(bpos);
  free(want);
  free(logits);
  free(row);
  anna_text_free(text);
  anna_context_free(ctx);
  anna_model_free(m);
  return rc;
}
