/* anna-bench: prefill / TTFT / decode throughput of one model, over one prompt or a sweep of
 * synthetic prompt lengths (benchy-style PP / TTFT / TG table), with --json for harnesses
 * (bench/compare_llamacpp.py reads "prefill_tok_s" and "decode_tok_s", one value per run).
 *
 * Method: one context sized for the longest prompt; every run (warm-up or measured) starts
 * from a fresh sequence (anna_context_seq_reset), prefills in n_batch pieces asking only for
 * the last position's logits, samples greedily, then decodes exactly --max-new-tokens tokens
 * (EOS ignored, so every run does the same work). Figures per run:
 *   prefill tok/s = prompt tokens / prefill time
 *   TTFT          = prefill time + sampling of the first token
 *   decode tok/s  = (max_new - 1) / time from the first token to the last one (each step is
 *                   one forward of the previous token plus sampling)
 * Warm-up runs are excluded; median, min and max are over the measured runs. */
#include "anna/anna.h"
#include "cli_common.h"
#include "cli_image.h"

#include <jansson.h>
#include <sys/resource.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: anna-bench --model-dir DIR|--model FILE.gguf [prompt] [options]\n"
          "  --hf-repo ORG/NAME[:FILE|:TAG]  a Hugging Face Hub model (downloaded into the\n"
          "                           huggingface_hub cache; HF_ENDPOINT, HF_TOKEN; anna-pull --help)\n"
          "prompt (one of; default --prompt-len 512):\n"
          "  --prompt TEXT            user message, rendered with the model's chat template\n"
          "  --system TEXT  --raw  --no-think   as in anna-generate (with --prompt)\n"
          "  --prompt-len N           N synthetic token ids (deterministic, no special/eog ids)\n"
          "  --prompt-lengths A,B,..  sweep of synthetic prompt lengths, one table row each\n"
          "  --image FILE             (repeatable, vision models, with --prompt) images before the text;\n"
          "                           each run decodes, preprocesses and encodes them again (TTFT)\n"
          "  --video FILE             (vision models, with --prompt) a video after the images (MP4, WebM,\n"
          "                           MKV); every run decodes, samples and encodes it again\n"
          "options:\n"
          "  --warmup N               unmeasured runs per prompt (default 1)\n"
          "  --runs N                 measured runs per prompt (default 3)\n"
          "  --max-new-tokens N       decoded tokens per run, EOS ignored (default 128)\n"
          "  --threads N              default: one per core\n"
          "  --batch N                prefill tokens per decode call (default 512)\n"
          "  --ctx-size N             context length (default: longest prompt + max-new-tokens)\n"
          "  --seed S                 synthetic prompt seed (default 1234)\n"
          CLI_DEVICE_USAGE
          "  --mmproj FILE            vision tower from a llama.cpp mmproj GGUF (or an HF folder with\n"
          "                           model.visual.*) beside a GGUF text model (replaces a folder's tower)\n"
          "  --weight-quant none|auto|int4  int4: quantize an HF folder to Q4_K_M at load (cached\n"
          "                           under ${ANNA_CACHE:-~/.cache/anna}/quant; see anna-quantize);\n"
          "                           auto = none (GGUF files load as stored)\n"
          "  --dtype f32|bf16         compute dtype (default f32; bf16, cuda only: prefill GEMMs on\n"
          "                           activations rounded to bf16, as llama.cpp; faster, less exact)\n"
          "  --json                   one JSON object on stdout instead of the table\n"
          "  --profile-runtime        per-op-family time (matmul, lm_head, attention, gdn, moe, other; CUDA: synced ops)\n"
          "  --verbose                one line per run and the resolved runtime switches on stderr\n"
          "  --tuning K=V,...         runtime switches (after the environment's ANNA_TUNING; keys:\n"
          "                           src/base/tuning.h)\n"
          "  --kv-cache-quantization none|f16|q8|q4|turboquant  --kv-cache-quant-bits 2|3|4\n"
          "  --kv-cache-residual-len N  quantized KV: the newest N positions are attended in f32\n"
          CLI_OFFLOAD_USAGE
          "  --exact                  f32 activations everywhere (exact, slower; CPU default:\n"
          "                           8-bit activations as llama.cpp; CUDA default: tensor cores)\n"
          "  --host-sampling          download each step's logits and take the argmax on the host (default:\n"
          "                           the backend's top-1 candidate, a few bytes)\n"
          "  --parallel N             decode N sequences per step (the prompt prefilled once, then\n"
          "                           shared by N sequences as anna-serve's n choices are); TG tok/s\n"
          "                           is then the aggregate of the N (default 1)\n");
}

/* "512,8192" -> lengths (caller frees). Returns the count, or -1 with the message printed. */
static long parse_lengths(const char *v, int64_t **out) {
  *out = NULL;
  size_t cap = 1;
  for (const char *p = v; *p; p++) cap += *p == ',';
  int64_t *l = malloc(cap * sizeof *l);
  if (!l) return -1;
  long n = 0;
  for (const char *p = v;;) {
    char *end;
    errno = 0;
    long long x = strtoll(p, &end, 10);
    if (errno || end == p || x < 1 || x > (1 << 24) || (*end && *end != ',')) {
      fprintf(stderr, "error: --prompt-lengths expects comma-separated lengths in [1, %d], bad at '%s'\n",
              1 << 24, p);
      free(l);
      return -1;
    }
    l[n++] = x;
    if (!*end) break;
    p = end + 1;
  }
  *out = l;
  return n;
}

typedef struct bench_run {
  double prefill_s, ttft_s, decode_s;
  int n_decoded; /* forwards timed in decode_s */
  double sample_s; /* time spent in the sampler over the whole run */
  double cpu_s;    /* process CPU time (user + system) over the run */
  double wall_s;
} bench_run;

typedef struct bench_case {
  int64_t n_prompt;
  bench_run *runs; /* [n_runs] */
  double rss_mib;  /* peak RSS after this case */
  int n_prof;      /* --profile-runtime: op families timed over the measured runs */
  double prof_s[8];
  const char *prof_names[8];
  anna_step_stats st; /* CUDA graph steps over the measured runs (zero on the CPU) */
} bench_case;

typedef struct bench_stat {
  double med, min, max;
} bench_stat;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* vals is reordered. */
static bench_stat stat_of(double *vals, int n) {
  bench_stat s = {0, 0, 0};
  if (n <= 0) return s;
  qsort(vals, (size_t)n, sizeof *vals, cmp_double);
  s.min = vals[0];
  s.max = vals[n - 1];
  s.med = n % 2 ? vals[n / 2] : 0.5 * (vals[n / 2 - 1] + vals[n / 2]);
  return s;
}

static double peak_rss_mib(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)ru.ru_maxrss / 1024.0; /* Linux: KiB */
}

static double cpu_seconds(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

/* 1-minute load average, to print next to the figures: on a shared machine it says how much
 * of the spread is other work. -1 when unknown. */
static double load_avg(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A token a real prompt could contain: not a control/special token and not end-of-generation,
 * so the synthetic prompt exercises the same paths as text. Without a tokenizer every id is. */
static int id_is_plain(const anna_text *text, int32_t id) {
  if (!text) return 1;
  return !anna_text_token_is_special(text, id) && !anna_text_is_eog(text, id) && id != anna_text_bos(text) &&
         id != anna_text_eos(text) && id != anna_text_pad(text);
}

/* n ids drawn uniformly from the plain ids below min(model vocab, tokenizer vocab); a longer
 * prompt extends a shorter one with the same seed. ids: caller frees. */
static int synth_prompt(int32_t **ids, int64_t n, int vocab, const anna_text *text, uint64_t seed, char *err,
                        size_t errlen) {
  *ids = NULL;
  int64_t range = vocab;
  if (text) {
    int32_t tv = anna_text_vocab(text);
    if (tv > 0 && tv < range) range = tv;
  }
  if (range <= 0) {
    snprintf(err, errlen, "empty vocabulary");
    return -1;
  }
  int32_t *out = malloc((size_t)n * sizeof *out);
  if (!out) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i++) {
    int tries = 0;
    int32_t id;
    do {
      id = (int32_t)(splitmix64(&s) % (uint64_t)range);
    } while (!id_is_plain(text, id) && ++tries < 1000);
    if (tries >= 1000) {
      free(out);
      snprintf(err, errlen, "could not draw a non-special token id (vocab %lld)", (long long)range);
      return -1;
    }
    out[i] = id;
  }
  *ids = out;
  return 0;
}

/* One run from an empty sequence. seq/pos/want: [n_batch] scratch. */
/* --parallel: sequences decoded per step (1: the single-sequence loop below). */
static int g_parallel = 1;
/* --image: the files' bytes, decoded again by every run into g_media (TTFT includes decoding,
 * preprocessing and the tower: the encoder cache is emptied first). */
static int g_n_img;
/* --video: one more entry after the images (index g_n_img); g_n_media counts both */
static const char *g_video;
static int g_n_media;
static const char *g_img_path[CLI_MAX_IMAGES + 1];
static uint8_t *g_img_buf[CLI_MAX_IMAGES + 1];
static size_t g_img_len[CLI_MAX_IMAGES + 1];
static anna_media *g_media[CLI_MAX_IMAGES + 1];
static anna_media_ref g_refs[CLI_MAX_IMAGES + 1];
static const anna_model *g_model;

/* The image prompt's prefill on sequence 0: decode, preprocess, tower, text. */
static int bench_image_prefill(anna_context *ctx, const int32_t *ids, int64_t n, float *logits, char *err,
                               size_t errlen) {
  for (int i = 0; i < g_n_media; i++) {
    anna_media_free(g_media[i]);
    g_media[i] = NULL;
    if (cli_media_decode(g_model, g_img_path[i], i == g_n_img, g_img_buf[i], g_img_len[i], &g_media[i], err,
                         errlen))
      return -1;
    g_refs[i].media = g_media[i];
  }
  anna_context_vision_cache_clear(ctx);
  const anna_prompt p = {ids, (int32_t)n, g_refs, g_n_media};
  return anna_context_prefill(ctx, 0, &p, logits, err, errlen) ? -1 : 0;
}

/* The decode phase of --parallel N: sequences 1..N-1 become copies of sequence 0's prompt
 * (blocks shared, copied on the first write), then every step decodes one token of each,
 * greedy from the backend's top-1 candidate. Buffers: seq/pos/want/toks hold N entries. */
static int bench_parallel_decode(anna_context *ctx, int32_t first, int64_t n, int max_new, int32_t *seq, int32_t *pos,
                                 int8_t *want, int32_t *toks, float *cval, double *cst, char *err, size_t errlen) {
  const int P = g_parallel;
  for (int q = 1; q < P; q++)
    if (anna_context_seq_copy(ctx, q, 0, (int32_t)n, err, errlen)) return -1;
  for (int q = 0; q < P; q++) toks[q] = first;
  for (int i = 1; i < max_new; i++) {
    for (int q = 0; q < P; q++) seq[q] = q, pos[q] = (int32_t)(n + i - 1), want[q] = 1;
    anna_batch b = {P, toks, seq, pos, want};
    /* the candidates overwrite toks only after the batch was read: the call copies its inputs first */
    if (anna_context_decode_topk(ctx, &b, 1, 0.0f, toks, cval, cst, err, errlen)) return -1;
  }
  return 0;
}

static int bench_one(anna_context *ctx, anna_sampler *smp, const int32_t *ids, int64_t n, int n_batch, int max_new,
                     float *logits, int32_t *seq, int32_t *pos, int8_t *want, int host_sampling, bench_run *r,
                     char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  for (int q = 0; q < g_parallel; q++) anna_context_seq_reset(ctx, q);
  anna_sampler_reset(smp);
  double c0 = cpu_seconds();
  double t0 = cli_now();
  if (g_n_media && bench_image_prefill(ctx, ids, n, logits, err, errlen)) return -1;
  for (int64_t at = g_n_media ? n : 0; at < n;) {
    int len = (int)(n - at < n_batch ? n - at : n_batch);
    for (int i = 0; i < len; i++) seq[i] = 0, pos[i] = (int32_t)(at + i), want[i] = at + i == n - 1;
    anna_batch b = {len, ids + at, seq, pos, want};
    if (anna_context_decode(ctx, &b, logits, err, errlen)) return -1;
    at += len;
  }
  double t1 = cli_now();
  r->prefill_s = t1 - t0;
  r->ttft_s = r->prefill_s;
  if (max_new <= 0) {
    r->wall_s = cli_now() - t0;
    r->cpu_s = cpu_seconds() - c0;
    return 0;
  }
  int32_t t = anna_sampler_sample(smp, logits);
  double t2 = cli_now();
  r->sample_s += t2 - t1;
  r->ttft_s = t2 - t0;
  double ts = 0;
  if (g_parallel > 1) {
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)g_parallel);
    float *cv = malloc(sizeof(float) * (size_t)g_parallel);
    double *cs = malloc(sizeof(double) * 2 * (size_t)g_parallel);
    int rc = !toks || !cv || !cs ? (snprintf(err, errlen, "out of memory"), -1)
                                 : bench_parallel_decode(ctx, t, n, max_new, seq, pos, want, toks, cv, cs, err, errlen);
    free(toks);
    free(cv);
    free(cs);
    if (rc) return -1;
    r->decode_s = cli_now() - t2;
    r->n_decoded = (max_new - 1) * g_parallel;
    r->wall_s = cli_now() - t0;
    r->cpu_s = cpu_seconds() - c0;
    return 0;
  }
  /* Decode steps return the candidates the sampler needs (greedy: the top 1) unless
   * --host-sampling; a row they do not decide is fetched in full (anna-generate's loop). */
  float ktemp = 0.0f;
  const int kc = host_sampling ? 0 : anna_sampler_candidates_k(smp, &ktemp);
  int32_t cidx[ANNA_TOPK_MAX];
  float cval[ANNA_TOPK_MAX];
  double cst[2];
  for (int i = 1; i < max_new; i++) {
    int32_t s0 = 0, p0 = (int32_t)(n + i - 1);
    int8_t w = 1;
    anna_batch b = {1, &t, &s0, &p0, &w};
    if (kc > 0) {
      if (anna_context_decode_topk(ctx, &b, kc, ktemp, cidx, cval, cst, err, errlen)) return -1;
      double a = cli_now();
      if (anna_sampler_sample_candidates(smp, cidx, cval, kc, cst, &t)) {
        if (anna_context_logits_row(ctx, 0, logits, err, errlen)) return -1;
        t = anna_sampler_sample(smp, logits);
      }
      ts += cli_now() - a;
      continue;
    }
    if (anna_context_decode(ctx, &b, logits, err, errlen)) return -1;
    double a = cli_now();
    t = anna_sampler_sample(smp, logits);
    ts += cli_now() - a;
  }
  r->decode_s = cli_now() - t2;
  r->sample_s += ts;
  r->n_decoded = max_new - 1;
  r->wall_s = cli_now() - t0;
  r->cpu_s = cpu_seconds() - c0;
  return 0;
}

static double run_prefill_tps(const bench_run *r, int64_t n) {
  return r->prefill_s > 0 ? (double)n / r->prefill_s : 0;
}
static double run_decode_tps(const bench_run *r) {
  return r->n_decoded > 0 && r->decode_s > 0 ? (double)r->n_decoded / r->decode_s : 0;
}

enum { FIG_PP = 0, FIG_TTFT, FIG_TG, FIG_N };
static const char *const fig_json[FIG_N] = {"prefill_tok_s", "ttft_ms", "decode_tok_s"};

static double fig_value(const bench_run *r, int64_t n, int fig) {
  switch (fig) {
  case FIG_PP: return run_prefill_tps(r, n);
  case FIG_TTFT: return r->ttft_s * 1e3;
  default: return run_decode_tps(r);
  }
}

static bench_stat case_stat(const bench_case *c, int n_runs, int fig, double *tmp) {
  for (int i = 0; i < n_runs; i++) tmp[i] = fig_value(&c->runs[i], c->n_prompt, fig);
  return stat_of(tmp, n_runs);
}

/* Per-case JSON: arrays of per-run values and median/min/max objects. */
static json_t *case_json(const bench_case *c, int n_runs, double *tmp) {
  json_t *o = json_object(), *med = json_object(), *mn = json_object(), *mx = json_object();
  json_object_set_new(o, "prompt_tokens", json_integer(c->n_prompt));
  for (int f = 0; f < FIG_N; f++) {
    json_t *arr = json_array();
    for (int i = 0; i < n_runs; i++) json_array_append_new(arr, json_real(fig_value(&c->runs[i], c->n_prompt, f)));
    json_object_set_new(o, fig_json[f], arr);
    bench_stat s = case_stat(c, n_runs, f, tmp);
    json_object_set_new(med, fig_json[f], json_real(s.med));
    json_object_set_new(mn, fig_json[f], json_real(s.min));
    json_object_set_new(mx, fig_json[f], json_real(s.max));
  }
  json_t *smp = json_array();
  for (int i = 0; i < n_runs; i++) json_array_append_new(smp, json_real(c->runs[i].sample_s * 1e3));
  json_object_set_new(o, "sampling_ms", smp);
  json_t *cpu = json_array();
  for (int i = 0; i < n_runs; i++)
    json_array_append_new(cpu, json_real(c->runs[i].wall_s > 0 ? c->runs[i].cpu_s / c->runs[i].wall_s : 0));
  json_object_set_new(o, "cpu_per_wall", cpu);
  json_object_set_new(o, "median", med);
  json_object_set_new(o, "min", mn);
  json_object_set_new(o, "max", mx);
  json_object_set_new(o, "peak_rss_mib", json_real(c->rss_mib));
  return o;
}

static void fmt_stat(char *buf, size_t cap, bench_stat s, int prec) {
  snprintf(buf, cap, "%.*f (%.*f-%.*f)", prec, s.med, prec, s.min, prec, s.max);
}

int main(int argc, char **argv) {
  const char *model = NULL, *prompt = NULL, *system = NULL, *lengths_arg = NULL, *hf = NULL;
  int tensor_parallel = 0;
  const char *tp_comm = NULL;
  const char *layer_split = NULL, *device = NULL, *dtype = NULL, *kvq = NULL, *tuning = NULL, *wq = NULL, *mmproj = NULL;
  int kv_bits = 0, kv_resid = 0;
  int prompt_len = 0, warmup = 1, n_runs = 3, max_new = 128, threads = 0, batch = 512, ctx_size = 0;
  int raw = 0, no_think = 0, as_json = 0, profile = 0, verbose = 0, seed = 1234, exact_matmul = 0;
  int host_sampling = 0;
  cli_offload off = {0};
  int off_rc = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() CLI_NEEDV()
    if (!strcmp(a, "--model-dir") || !strcmp(a, "--model")) { NEEDV(); model = v; }
    else if (!strcmp(a, "--hf-repo")) { NEEDV(); hf = v; }
    else if (!strcmp(a, "--prompt")) { NEEDV(); prompt = v; }
    else if (!strcmp(a, "--system")) { NEEDV(); system = v; }
    else if (!strcmp(a, "--prompt-lengths")) { NEEDV(); lengths_arg = v; }
    else if (!strcmp(a, "--device")) { NEEDV(); device = v; }
    else if (!strcmp(a, "--layer-split")) { NEEDV(); layer_split = v; }
    else if (!strcmp(a, "--tensor-parallel")) { NEEDV(); if (cli_int(a, v, 1, 8, &tensor_parallel)) return 2; }
    else if (!strcmp(a, "--tp-comm")) { NEEDV(); tp_comm = v; }
    else if (!strcmp(a, "--list-devices")) return cli_list_devices();
    else if (!strcmp(a, "--dtype")) { NEEDV(); dtype = v; }
    else if (!strcmp(a, "--weight-quant")) { NEEDV(); if (cli_weight_quant(a, v)) return 2; wq = v; }
    else if (!strcmp(a, "--mmproj")) { NEEDV(); mmproj = v; }
    else if (!strcmp(a, "--kv-cache-quantization")) { NEEDV(); kvq = v; }
    else if (!strcmp(a, "--kv-cache-quant-bits")) { NEEDV(); if (cli_int(a, v, 2, 4, &kv_bits)) return 2; }
    else if (!strcmp(a, "--kv-cache-residual-len")) { NEEDV(); if (cli_int(a, v, 0, 1 << 20, &kv_resid)) return 2; }
    else if ((off_rc = cli_offload_arg(&off, argc, argv, &i)) != 0) { if (off_rc < 0) return 2; }
    else if (!strcmp(a, "--raw")) raw = 1;
    else if (!strcmp(a, "--no-think")) no_think = 1;
    else if (!strcmp(a, "--json")) as_json = 1;
    else if (!strcmp(a, "--profile-runtime")) profile = 1;
    else if (!strcmp(a, "--verbose")) verbose = 1;
    else if (!strcmp(a, "--tuning")) { NEEDV(); tuning = v; }
    else if (!strcmp(a, "--exact")) exact_matmul = 1;
    else if (!strcmp(a, "--host-sampling")) host_sampling = 1;
    else if (!strcmp(a, "--parallel")) { NEEDV(); if (cli_int(a, v, 1, 4096, &g_parallel)) return 2; }
    else if (!strcmp(a, "--image")) {
      NEEDV();
      if (g_n_img == CLI_MAX_IMAGES) {
        fprintf(stderr, "error: more than %d --image flags\n", CLI_MAX_IMAGES);
        return 2;
      }
      g_img_path[g_n_img++] = v;
    }
    else if (!strcmp(a, "--video")) {
      NEEDV();
      if (g_video) {
        fprintf(stderr, "error: more than one --video flag\n");
        return 2;
      }
      g_video = v;
    }
    else if (!strcmp(a, "--int8-prefill")) exact_matmul = 0; /* old flag: now the default */
    else if (!strcmp(a, "--prompt-len")) { NEEDV(); if (cli_int(a, v, 1, 1 << 24, &prompt_len)) return 2; }
    else if (!strcmp(a, "--warmup")) { NEEDV(); if (cli_int(a, v, 0, 1000, &warmup)) return 2; }
    else if (!strcmp(a, "--runs")) { NEEDV(); if (cli_int(a, v, 1, 100000, &n_runs)) return 2; }
    else if (!strcmp(a, "--max-new-tokens")) { NEEDV(); if (cli_int(a, v, 0, 1 << 24, &max_new)) return 2; }
    else if (!strcmp(a, "--threads")) { NEEDV(); if (cli_int(a, v, 0, 1024, &threads)) return 2; }
    else if (!strcmp(a, "--batch")) { NEEDV(); if (cli_int(a, v, 1, 1 << 20, &batch)) return 2; }
    else if (!strcmp(a, "--ctx-size")) { NEEDV(); if (cli_int(a, v, 1, 1 << 24, &ctx_size)) return 2; }
    else if (!strcmp(a, "--seed")) { NEEDV(); if (cli_int(a, v, 0, INT32_MAX, &seed)) return 2; }
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "error: unknown flag '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDV
  }
  if (cli_hf_model(hf, &model)) return 1;
  if (!model) {
    fprintf(stderr, "error: need --model-dir (or --model)\n");
    usage(stderr);
    return 2;
  }
  if ((g_n_img || g_video) && (!prompt || raw)) {
    fprintf(stderr, "error: --image and --video need --prompt (chat template), not --raw or synthetic prompts\n");
    return 2;
  }
  g_n_media = g_n_img + (g_video != NULL);
  if (g_video) g_img_path[g_n_img] = g_video;
  if ((prompt != NULL) + (prompt_len > 0) + (lengths_arg != NULL) > 1) {
    fprintf(stderr, "error: --prompt, --prompt-len and --prompt-lengths are mutually exclusive\n");
    return 2;
  }
  char err[512] = "";
  int rc = 1;
  anna_model *m = NULL;
  anna_context *ctx = NULL;
  anna_text *text = NULL;
  anna_sampler *smp = NULL;
  int32_t *ids = NULL, *seq = NULL, *pos = NULL;
  int8_t *want = NULL;
  float *logits = NULL;
  double *tmp = NULL;
  bench_case *cases = NULL;
  int n_cases = 0;
  int64_t n_ids = 0;

  /* Prompt lengths first: a bad list should fail before a long model load. */
  int64_t *lens = NULL;
  if (lengths_arg) {
    long k = parse_lengths(lengths_arg, &lens);
    if (k <= 0) return 2;
    n_cases = (int)k;
  } else {
    n_cases = 1;
    lens = malloc(sizeof *lens);
    if (lens) lens[0] = prompt_len > 0 ? prompt_len : 512;
  }
  cases = calloc((size_t)n_cases, sizeof *cases);
  tmp = calloc((size_t)n_runs, sizeof *tmp);
  if (!lens || !cases || !tmp) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }

  double t0 = cli_now();
  anna_model_options mo = {.device = device, .dtype = dtype, .tuning = tuning, .weight_quant = wq, .mmproj = mmproj};
  if (anna_model_load(&m, model, &mo, err, sizeof err)) goto fail;
  double t_load = cli_now() - t0;
  const int V = anna_model_vocab(m);
  if (anna_text_open(&text, model, 0, err, sizeof err)) {
    if (prompt) goto fail;
    text = NULL; /* synthetic ids need no tokenizer; without one no id counts as special */
    err[0] = '\0';
  }

  if (prompt) {
    size_t n = 0;
    g_model = m;
    for (int i = 0; i < g_n_media; i++)
      if (cli_read_file(g_img_path[i], &g_img_buf[i], &g_img_len[i], err, sizeof err)) goto fail;
    if (g_n_media ? cli_image_prompt(m, text, prompt, system, no_think, g_img_path, g_n_img, g_video, g_media, g_refs,
                                     &ids, &n, err, sizeof err)
                : anna_text_encode_prompt(text, prompt, system, raw, no_think, &ids, &n, err, sizeof err))
      goto fail;
    n_ids = (int64_t)n;
    lens[0] = n_ids;
    for (int64_t i = 0; i < n_ids; i++)
      if (ids[i] < 0 || ids[i] >= V) {
        snprintf(err, sizeof err, "prompt token id %d out of range (vocab %d)", ids[i], V);
        goto fail;
      }
  } else {
    for (int i = 0; i < n_cases; i++) n_ids = lens[i] > n_ids ? lens[i] : n_ids;
    if (synth_prompt(&ids, n_ids, V, text, (uint64_t)seed, err, sizeof err)) goto fail;
  }

  int64_t need = n_ids + max_new + 1;
  if (need > INT32_MAX) {
    snprintf(err, sizeof err, "prompt + --max-new-tokens too long");
    goto fail;
  }
  int n_ctx = ctx_size ? ctx_size : (int)need;
  if (n_ids + max_new > n_ctx) {
    snprintf(err, sizeof err, "longest prompt (%lld tokens) + --max-new-tokens %d exceeds --ctx-size %d",
             (long long)n_ids, max_new, n_ctx);
    goto fail;
  }
  int n_batch = n_ids < batch ? (int)n_ids : batch;
  if (n_batch < g_parallel) n_batch = g_parallel; /* a decode step holds one token of each sequence */
  anna_context_options co = {.n_seq = g_parallel, .n_ctx = n_ctx, .n_batch = n_batch, .n_threads = threads, .device = device,
                             .exact_matmul = exact_matmul, .profile = profile, .kv_cache_quantization = kvq,
                             .kv_cache_quant_bits = kv_bits, .kv_cache_residual_len = kv_resid, .tuning = tuning};
  cli_offload_apply(&off, &co);
  co.layer_split = layer_split;
  co.tensor_parallel = tensor_parallel;
  co.tp_comm = tp_comm;
  if (anna_context_create(&ctx, m, &co, err, sizeof err)) goto fail;
  cli_print_stages(ctx);
  if (verbose) {
    char tb[2048];
    anna_context_tuning(ctx, tb, sizeof tb);
    fprintf(stderr, "[anna-bench] tuning:\n%s", tb);
  }
  anna_sampler_params sp = anna_sampler_params_default(); /* greedy: the sampler's cheapest honest path */
  if (anna_sampler_create(&smp, V, &sp, err, sizeof err)) goto fail;
  logits = malloc(sizeof(float) * (size_t)V);
  seq = malloc(sizeof(int32_t) * (size_t)n_batch);
  pos = malloc(sizeof(int32_t) * (size_t)n_batch);
  want = malloc((size_t)n_batch);
  if (!logits || !seq || !pos || !want) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  double rss_loaded = peak_rss_mib();
  double tower_ms = 0; /* --image: mean tower time of a measured run */
  long image_tokens = 0, video_tokens = 0;
  for (int i = 0; i < g_n_img; i++) image_tokens += anna_media_n_tokens(g_media[i]);
  if (g_video) video_tokens = anna_media_n_tokens(g_media[g_n_img]);
  double load_start = load_avg();

  for (int c = 0; c < n_cases; c++) {
    bench_case *bc = &cases[c];
    bc->n_prompt = lens[c];
    bc->runs = calloc((size_t)n_runs, sizeof *bc->runs);
    if (!bc->runs) {
      snprintf(err, sizeof err, "out of memory");
      goto fail;
    }
    anna_step_stats st0 = {0};
    anna_vision_stats vs0 = {0};
    for (int r = 0; r < warmup + n_runs; r++) {
      bench_run run;
      if (r == warmup) {
        anna_context_vision_stats(ctx, &vs0);
        anna_context_profile_reset(ctx); /* op times of measured runs only */
        anna_context_step_stats(ctx, &st0);
      }
      if (bench_one(ctx, smp, ids, bc->n_prompt, n_batch, max_new, logits, seq, pos, want, host_sampling, &run, err,
                    sizeof err))
        goto fail;
      if (verbose)
        fprintf(stderr, "[anna-bench] pp %lld %s %d: prefill %.1f tok/s, ttft %.1f ms, decode %.2f tok/s\n",
                (long long)bc->n_prompt, r < warmup ? "warmup" : "run", r < warmup ? r + 1 : r - warmup + 1,
                run_prefill_tps(&run, bc->n_prompt), run.ttft_s * 1e3, run_decode_tps(&run));
      if (r >= warmup) bc->runs[r - warmup] = run;
    }
    if (g_n_media) { /* images and video come with --prompt: one case */
      anna_vision_stats vs1;
      anna_context_vision_stats(ctx, &vs1);
      tower_ms = (vs1.tower_s - vs0.tower_s) / n_runs * 1e3;
    }
    bc->n_prof = anna_context_profile(ctx, bc->prof_s, bc->prof_names, 8);
    anna_context_step_stats(ctx, &bc->st);
    bc->st.steps -= st0.steps, bc->st.builds -= st0.builds, bc->st.updates -= st0.updates;
    bc->st.capture_s -= st0.capture_s, bc->st.update_s -= st0.update_s, bc->st.gpu_s -= st0.gpu_s;
    bc->rss_mib = peak_rss_mib();
  }
  double rss_peak = peak_rss_mib();
  const char *prof_note = "per-op-family wall time over the measured runs (on CUDA: each op synced, graphs off)";

  if (as_json) {
    json_t *o = json_object();
    json_object_set_new(o, "tool", json_string("anna-bench"));
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "describe", json_string(anna_model_describe(m)));
    json_object_set_new(o, "device", json_string(device ? device : "cpu"));
    json_object_set_new(o, "dtype", json_string(dtype ? dtype : "f32"));
    {
      json_t *pl = json_array();
      for (int i = 0; i < anna_context_stage_count(ctx); i++) {
        anna_stage_info si;
        if (anna_context_stage_info(ctx, i, &si, NULL, 0)) continue;
        json_array_append_new(pl, json_pack("{s:s,s:i,s:i,s:I,s:I}", "device", si.device, "layer_begin",
                                            si.layer_begin, "layer_end", si.layer_end, "weight_bytes",
                                            (json_int_t)si.weight_bytes, "kv_bytes", (json_int_t)si.kv_bytes));
      }
      json_object_set_new(o, "layer_split", layer_split ? json_string(layer_split) : json_null());
      json_object_set_new(o, "tensor_parallel", json_integer(tensor_parallel > 1 ? tensor_parallel : 1));
      json_object_set_new(o, "placement", pl);
    }
    json_object_set_new(o, "weight_quant", json_string(wq ? wq : "none"));
    json_object_set_new(o, "parallel", json_integer(g_parallel));
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "n_batch", json_integer(n_batch));
    json_object_set_new(o, "n_ctx", json_integer(n_ctx));
    json_object_set_new(o, "warmup", json_integer(warmup));
    json_object_set_new(o, "runs", json_integer(n_runs));
    json_object_set_new(o, "max_new_tokens", json_integer(max_new));
    json_object_set_new(o, "prompt_source", json_string(prompt ? "text" : "synthetic"));
    if (g_n_media) { /* ttft_ms then covers decoding, preprocessing, the tower and the prompt */
      json_object_set_new(o, "images", json_integer(g_n_img));
      json_object_set_new(o, "image_tokens", json_integer(image_tokens));
      if (g_video) {
        anna_video_info vinf;
        anna_media_video_info(g_media[g_n_img], &vinf);
        json_object_set_new(o, "videos", json_integer(1));
        json_object_set_new(o, "video_tokens", json_integer(video_tokens));
        json_object_set_new(o, "video_frames", json_integer(vinf.n_frames));
        json_object_set_new(o, "video_seconds", json_real(vinf.seconds));
      }
      json_object_set_new(o, "tower_ms", json_real(tower_ms));
    }
    json_object_set_new(o, "load_s", json_real(t_load));
    json_object_set_new(o, "rss_after_load_mib", json_real(rss_loaded));
    json_object_set_new(o, "peak_rss_mib", json_real(rss_peak));
    json_object_set_new(o, "peak_device_mib", json_null());
    json_object_set_new(o, "loadavg_start", json_real(load_start));
    json_object_set_new(o, "loadavg_end", json_real(load_avg()));
    /* The first prompt length's figures sit at the top level too: harnesses that run one
     * length (compare_llamacpp.py) read them there. */
    json_t *first = case_json(&cases[0], n_runs, tmp);
    const char *keys[] = {"prompt_tokens", "prefill_tok_s", "ttft_ms", "decode_tok_s", "sampling_ms",
                          "cpu_per_wall", "median", "min", "max"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
      json_object_set(o, keys[k], json_object_get(first, keys[k]));
    json_decref(first);
    json_t *sweep = json_array();
    for (int c = 0; c < n_cases; c++) json_array_append_new(sweep, case_json(&cases[c], n_runs, tmp));
    json_object_set_new(o, "sweep", sweep);
    json_object_set_new(o, "profile", profile ? json_string(prof_note) : json_null());
    {
      anna_offload_stats os;
      anna_context_offload_stats(ctx, &os);
      json_t *oj = json_null();
      if (os.on) {
        oj = json_object();
        json_object_set_new(oj, "cache_per_layer", json_integer(os.cache_per_layer));
        json_object_set_new(oj, "staging_slots", json_integer(os.staging_slots));
        json_object_set_new(oj, "mirrored_experts", json_integer(os.mirrored));
        json_object_set_new(oj, "routed", json_integer(os.routed));
        json_object_set_new(oj, "hits", json_integer(os.hits));
        json_object_set_new(oj, "swaps", json_integer(os.swaps));
        json_object_set_new(oj, "bytes_from_mirror", json_integer(os.bytes_mirror));
        json_object_set_new(oj, "bytes_from_file", json_integer(os.bytes_file));
        json_object_set_new(oj, "device_bytes", json_integer(os.device_bytes));
        json_object_set_new(oj, "summary", os.summary ? json_string(os.summary) : json_null());
      }
      json_object_set_new(o, "offload", oj);
    }
    char *s = json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!s) {
      snprintf(err, sizeof err, "out of memory");
      goto fail;
    }
    printf("%s\n", s);
    free(s);
  } else {
    printf("anna-bench | %s | %s\n", anna_model_describe(m), model);
    char th[16];
    snprintf(th, sizeof th, threads > 0 ? "%d" : "auto", threads);
    printf("device %s, dtype %s, threads %s, batch %d, parallel %d | load %.3f s | peak RSS %.1f MiB (after load %.1f)\n",
           device ? device : "cpu", dtype ? dtype : "f32", th, n_batch, g_parallel, t_load, rss_peak, rss_loaded);
    printf("warmup %d, runs %d, max-new-tokens %d (EOS ignored) | %s prompt | median (min-max)\n", warmup,
           n_runs, max_new, prompt ? "chat-templated" : "synthetic");
    anna_offload_stats os;
    anna_context_offload_stats(ctx, &os);
    if (os.on)
      printf("%s\nexpert offload, whole run: %lld routed, hit rate %.3f, %lld swaps, %.1f MiB from the host mirror, %.1f "
             "MiB from the file mapping\n",
             os.summary ? os.summary : "expert offload", (long long)os.routed,
             os.routed ? (double)os.hits / (double)os.routed : 0.0, (long long)os.swaps, os.bytes_mirror / 1048576.0,
             os.bytes_file / 1048576.0);
    if (g_n_media)
      printf("%d image(s)%s, %ld visual tokens in the prompt: TTFT includes decode, preprocess and the tower (%.1f ms "
             "mean)\n", g_n_img, g_video ? " + 1 video" : "", image_tokens + video_tokens, tower_ms);
    printf("\n");
    printf("| %8s | %-28s | %-24s | %-26s | %8s |\n", "prompt", "PP tok/s", "TTFT ms", "TG tok/s", "CPU/wall");
    printf("|---------:|:-----------------------------|:-------------------------|:---------------------------|---------:|\n");
    for (int c = 0; c < n_cases; c++) {
      char b[3][64];
      int prec[FIG_N] = {1, 1, 2};
      for (int f = 0; f < FIG_N; f++) fmt_stat(b[f], sizeof b[f], case_stat(&cases[c], n_runs, f, tmp), prec[f]);
      for (int r = 0; r < n_runs; r++)
        tmp[r] = cases[c].runs[r].wall_s > 0 ? cases[c].runs[r].cpu_s / cases[c].runs[r].wall_s : 0;
      bench_stat cw = stat_of(tmp, n_runs);
      printf("| %8lld | %-28s | %-24s | %-26s | %8.2f |\n", (long long)cases[c].n_prompt, b[0], b[1], b[2], cw.med);
    }
    printf("\nCPU/wall: process CPU seconds per wall second over a run (median). With --threads N, a model\n"
           "big enough to keep the threads busy and an idle machine it approaches N; less means shared cores\n"
           "(or idle workers on a tiny model). Load average %.2f at start, %.2f at end.\n",
           load_start, load_avg());
    for (int c = 0; c < n_cases; c++) {
      const anna_step_stats *s = &cases[c].st;
      if (s->steps <= 0) continue;
      double dec = 0;
      int64_t toks = 0;
      for (int r = 0; r < n_runs; r++) dec += cases[c].runs[r].decode_s, toks += cases[c].runs[r].n_decoded;
      if (toks < 1) toks = 1;
      if (c == 0)
        printf("\nCUDA decode steps as graphs, per step (measured runs): host recording the ops (capture),\n"
               "updating the executable graph, device time of the replay, and the decode wall time per token\n");
      printf("  prompt %lld: %lld steps (%lld graph builds, %lld updated): capture %.0f us, update %.0f us, "
             "replay %.0f us; wall %.0f us/token\n",
             (long long)cases[c].n_prompt, (long long)s->steps, (long long)s->builds, (long long)s->updates,
             1e6 * s->capture_s / s->steps,
             1e6 * s->update_s / s->steps, 1e6 * s->gpu_s / s->steps, 1e6 * dec / (double)toks);
    }
    if (profile) {
      printf("\nprofile-runtime: %s\n", prof_note);
      for (int c = 0; c < n_cases; c++) {
        double tot = 0, smpt = 0;
        for (int r = 0; r < n_runs; r++) {
          tot += cases[c].runs[r].ttft_s + cases[c].runs[r].decode_s;
          smpt += cases[c].runs[r].sample_s;
        }
        printf("  prompt %lld: sampling %.2f ms/run (%.2f%% of run time)\n", (long long)cases[c].n_prompt,
               smpt * 1e3 / n_runs, tot > 0 ? 100.0 * smpt / tot : 0.0);
        for (int f = 0; f < cases[c].n_prof; f++)
          printf("    %-10s %9.2f ms/run (%5.1f%%)\n", cases[c].prof_names[f], cases[c].prof_s[f] * 1e3 / n_runs,
                 tot > 0 ? 100.0 * cases[c].prof_s[f] / tot : 0.0);
      }
    }
  }
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "error: %s\n", err);
  rc = 1;
done:
  if (cases)
    for (int c = 0; c < n_cases; c++) free(cases[c].runs);
  free(cases);
  free(lens);
  free(tmp);
  free(ids);
  free(logits);
  free(seq);
  free(pos);
  free(want);
  anna_sampler_free(smp);
  for (int i = 0; i < g_n_media; i++) {
    anna_media_free(g_media[i]);
    free(g_img_buf[i]);
  }
  anna_text_free(text);
  anna_context_free(ctx);
  anna_model_free(m);
  return rc;
}
