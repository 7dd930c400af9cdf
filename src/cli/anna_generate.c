/* anna-generate: one-shot generation from a prompt (chat-templated by default) or from
 * token ids, with the testing hooks --print-ids and --dump-logits. */
#include "anna/anna.h"
#include "cli_common.h"
#include "cli_image.h"

#include <jansson.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: anna-generate --model-dir DIR|--model FILE.gguf (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
          "  --hf-repo ORG/NAME[:FILE|:TAG]  a Hugging Face Hub model (downloaded into the\n"
          "                           huggingface_hub cache; HF_ENDPOINT, HF_TOKEN; anna-pull --help)\n"
          "  --prompt TEXT            user message, rendered with the model's chat template\n"
          "  --system TEXT            system message (with --prompt)\n"
          "  --raw                    tokenize --prompt as is (no chat template)\n"
          "  --no-think               chat template kwarg enable_thinking=false\n"
          "  --prompt-ids LIST        token ids instead of text\n"
          "  --image FILE             (repeatable, vision models) an image before the --prompt text in\n"
          "                           the user message (JPEG, PNG, WebP, GIF)\n"
          "  --video FILE             (vision models) a video after the images, before the text (MP4,\n"
          "                           WebM, MKV; frames sampled as the model's video processor does)\n"
          "  --max-new-tokens N       default 256 (0: prompt only)\n"
          "  --temperature T          default 0 (greedy)\n"
          "  --top-k K  --top-p P  --min-p P  --repetition-penalty R\n"
          "  --presence-penalty P  --frequency-penalty P  --seed S\n"
          "  --ctx-size N             context length (default: prompt + max-new-tokens)\n"
          "  --kv-cache-quantization none|f16|q8|q4|turboquant   --kv-cache-quant-bits 2|3|4\n"
          "  --kv-cache-residual-len N  quantized KV: the newest N positions are attended in f32\n"
          CLI_OFFLOAD_USAGE
          "  --exact                  f32 activations everywhere (exact, slower; CPU default:\n"
          "                           8-bit activations as llama.cpp; CUDA default: tensor cores)\n"
          "  --threads N              default: one per core\n"
          CLI_DEVICE_USAGE
          "  --mmproj FILE            vision tower from a llama.cpp mmproj GGUF (or an HF folder with\n"
          "                           model.visual.*) beside a GGUF text model (replaces a folder's tower)\n"
          "  --weight-quant none|auto|int4  int4: quantize an HF folder to Q4_K_M at load (cached\n"
          "                           under ${ANNA_CACHE:-~/.cache/anna}/quant; see anna-quantize);\n"
          "                           auto = none (GGUF files load as stored)\n"
          "  --dtype f32|bf16         compute dtype (default f32; bf16, cuda only: prefill GEMMs on\n"
          "                           activations rounded to bf16, as llama.cpp; faster, less exact)\n"
          "  --tuning K=V,...         runtime switches (after the environment's ANNA_TUNING; keys:\n"
          "                           src/base/tuning.h)\n"
          "  --verbose                print the resolved runtime switches on stderr\n"
          "  --print-ids              print generated ids as one comma-separated line\n"
          "  --dump-logits FILE       write float32 logits of every prompt position [n, vocab]\n"
          "  --quiet                  no statistics on stderr\n"
          "  --host-sampling          download every logits row and sample it on the host (default: the\n"
          "                           backend returns the few candidates the sampling parameters need)\n"
          "  --speculative ngram      speculative decoding with prompt-lookup drafts: greedy gives the ids\n"
          "                           of plain greedy; sampling (--temperature > 0, penalties) keeps the\n"
          "                           target distribution exactly and, with one --seed, plain sampling's ids\n"
          "  --speculative mtp        the same with drafts from the checkpoint's MTP head (Qwen3.5 mtp.*),\n"
          "                           chained --draft-max times\n"
          "  --speculative draft --draft-model PATH  drafts from a smaller model with the same vocabulary\n"
          "                           (greedy, from its own context; --draft-model alone implies it)\n"
          "  --draft-max K            most drafted tokens per verify window (1..16, default 6)\n"
          "  --draft-fixed            always draft --draft-max tokens (default: the length adapts to the\n"
          "                           acceptance rate, anna_spec_adapt)\n"
          "  --ngram-min N  --ngram-max N  suffix lengths the drafter matches (default 1 and 4)\n");
}

int main(int argc, char **argv) {
  const char *model = NULL, *prompt = NULL, *system = NULL, *ids_arg = NULL, *dump = NULL, *hf = NULL;
  int tensor_parallel = 0;
  const char *tp_comm = NULL;
  const char *layer_split = NULL, *device = NULL, *dtype = NULL, *kvq = NULL, *tuning = NULL, *wq = NULL, *mmproj = NULL;
  int verbose = 0;
  int kv_bits = 0, exact_matmul = 0, kv_resid = 0;
  int max_new = 256, threads = 0, ctx_size = 0, raw = 0, no_think = 0, print_ids = 0, quiet = 0;
  int host_sampling = 0;
  const char *spec = NULL;
  int draft_max = 6, ngram_min = 1, ngram_max = 4, draft_fixed = 0;
  const char *draft_path = NULL;
  const char *images[CLI_MAX_IMAGES];
  int n_img = 0;
  const char *video = NULL; /* --video: after the images, media[n_img] */
  anna_media *media[CLI_MAX_IMAGES + 1] = {0};
  anna_media_ref refs[CLI_MAX_IMAGES + 1];
  anna_sampler_params sp = anna_sampler_params_default();
  cli_offload off = {0};
  int off_rc = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() CLI_NEEDV()
    if (!strcmp(a, "--model-dir") || !strcmp(a, "--model")) { NEEDV(); model = v; }
    else if (!strcmp(a, "--hf-repo")) { NEEDV(); hf = v; }
    else if (!strcmp(a, "--prompt")) { NEEDV(); prompt = v; }
    else if (!strcmp(a, "--system")) { NEEDV(); system = v; }
    else if (!strcmp(a, "--prompt-ids")) { NEEDV(); ids_arg = v; }
    else if (!strcmp(a, "--image")) {
      NEEDV();
      if (n_img == CLI_MAX_IMAGES) {
        fprintf(stderr, "error: more than %d --image flags\n", CLI_MAX_IMAGES);
        return 2;
      }
      images[n_img++] = v;
    }
    else if (!strcmp(a, "--video")) {
      NEEDV();
      if (video) {
        fprintf(stderr, "error: more than one --video flag\n");
        return 2;
      }
      video = v;
    }
    else if (!strcmp(a, "--dump-logits")) { NEEDV(); dump = v; }
    else if (!strcmp(a, "--device")) { NEEDV(); device = v; }
    else if (!strcmp(a, "--layer-split")) { NEEDV(); layer_split = v; }
    else if (!strcmp(a, "--tensor-parallel")) { NEEDV(); if (cli_int(a, v, 1, 8, &tensor_parallel)) return 2; }
    else if (!strcmp(a, "--tp-comm")) { NEEDV(); tp_comm = v; }
    else if (!strcmp(a, "--list-devices")) return cli_list_devices();
    else if (!strcmp(a, "--dtype")) { NEEDV(); dtype = v; }
    else if (!strcmp(a, "--weight-quant")) { NEEDV(); if (cli_weight_quant(a, v)) return 2; wq = v; }
    else if (!strcmp(a, "--mmproj")) { NEEDV(); mmproj = v; }
    else if (!strcmp(a, "--tuning")) { NEEDV(); tuning = v; }
    else if (!strcmp(a, "--verbose")) verbose = 1;
    else if (!strcmp(a, "--kv-cache-quantization")) { NEEDV(); kvq = v; }
    else if (!strcmp(a, "--kv-cache-quant-bits")) { NEEDV(); if (cli_int(a, v, 2, 4, &kv_bits)) return 2; }
    else if (!strcmp(a, "--kv-cache-residual-len")) { NEEDV(); if (cli_int(a, v, 0, 1 << 20, &kv_resid)) return 2; }
    else if ((off_rc = cli_offload_arg(&off, argc, argv, &i)) != 0) { if (off_rc < 0) return 2; }
    else if (!strcmp(a, "--raw")) raw = 1;
    else if (!strcmp(a, "--exact")) exact_matmul = 1;
    else if (!strcmp(a, "--int8-prefill")) exact_matmul = 0; /* old flag: now the default */
    else if (!strcmp(a, "--no-think")) no_think = 1;
    else if (!strcmp(a, "--print-ids")) print_ids = 1;
    else if (!strcmp(a, "--quiet")) quiet = 1;
    else if (!strcmp(a, "--host-sampling")) host_sampling = 1;
    else if (!strcmp(a, "--speculative")) { NEEDV(); spec = v; }
    else if (!strcmp(a, "--draft-fixed")) draft_fixed = 1;
    else if (!strcmp(a, "--draft-model")) { NEEDV(); draft_path = v; }
    else if (!strcmp(a, "--draft-max")) { NEEDV(); if (cli_int(a, v, 1, ANNA_SPEC_MAX_DRAFT, &draft_max)) return 2; }
    else if (!strcmp(a, "--ngram-min")) { NEEDV(); if (cli_int(a, v, 1, ANNA_NGRAM_MAX_N, &ngram_min)) return 2; }
    else if (!strcmp(a, "--ngram-max")) { NEEDV(); if (cli_int(a, v, 1, ANNA_NGRAM_MAX_N, &ngram_max)) return 2; }
    else if (!strcmp(a, "--max-new-tokens")) { NEEDV(); if (cli_int(a, v, 0, 1 << 24, &max_new)) return 2; }
    else if (!strcmp(a, "--threads")) { NEEDV(); if (cli_int(a, v, 0, 1024, &threads)) return 2; }
    else if (!strcmp(a, "--ctx-size")) { NEEDV(); if (cli_int(a, v, 1, 1 << 24, &ctx_size)) return 2; }
    else if (!strcmp(a, "--temperature")) { NEEDV(); if (cli_float(a, v, 0, 100, &sp.temperature)) return 2; }
    else if (!strcmp(a, "--top-p")) { NEEDV(); if (cli_float(a, v, 0, 1, &sp.top_p)) return 2; }
    else if (!strcmp(a, "--min-p")) { NEEDV(); if (cli_float(a, v, 0, 1, &sp.min_p)) return 2; }
    else if (!strcmp(a, "--repetition-penalty")) { NEEDV(); if (cli_float(a, v, 0.01, 100, &sp.repetition_penalty)) return 2; }
    else if (!strcmp(a, "--presence-penalty")) { NEEDV(); if (cli_float(a, v, -2, 2, &sp.presence_penalty)) return 2; }
    else if (!strcmp(a, "--frequency-penalty")) { NEEDV(); if (cli_float(a, v, -2, 2, &sp.frequency_penalty)) return 2; }
    else if (!strcmp(a, "--top-k")) { NEEDV(); if (cli_int(a, v, 0, 1 << 24, &sp.top_k)) return 2; }
    else if (!strcmp(a, "--seed")) { NEEDV(); int s; if (cli_int(a, v, 0, INT32_MAX, &s)) return 2; sp.seed = (uint64_t)s; }
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
    else {
      fprintf(stderr, "error: unknown flag '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDV
  }
  if (cli_hf_model(hf, &model)) return 1;
  if (!model || (!prompt && !ids_arg) || (prompt && ids_arg)) {
    fprintf(stderr, "error: need --model-dir (or --model) and exactly one of --prompt / --prompt-ids\n");
    usage(stderr);
    return 2;
  }
  if (draft_path && !spec) spec = "draft";
  if (spec) {
    if (strcmp(spec, "ngram") && strcmp(spec, "mtp") && strcmp(spec, "draft")) {
      fprintf(stderr, "error: --speculative '%s' is not supported (have: ngram, mtp, draft)\n", spec);
      return 2;
    }
    if (!strcmp(spec, "draft") != (draft_path != NULL)) {
      fprintf(stderr, "error: --draft-model goes with --speculative draft (and it needs one)\n");
      return 2;
    }
    if (ngram_min > ngram_max) {
      fprintf(stderr, "error: --ngram-min %d exceeds --ngram-max %d\n", ngram_min, ngram_max);
      return 2;
    }
    if (n_img || video) {
      fprintf(stderr, "error: --speculative does not take --image or --video yet\n");
      return 2;
    }
    if (dump && !strcmp(spec, "mtp")) {
      fprintf(stderr, "error: --speculative mtp does not take --dump-logits (its prefill keeps the last row only)\n");
      return 2;
    }
  }
  if ((n_img || video) && (!prompt || raw || dump)) {
    fprintf(stderr, "error: --image and --video need --prompt (chat template), not --prompt-ids, --raw or "
                    "--dump-logits\n");
    return 2;
  }
  int32_t *ids = NULL;
  size_t n = 0;
  if (ids_arg) { /* a malformed id list is a flag error: report it before loading anything */
    long k = cli_ids("--prompt-ids", ids_arg, &ids);
    if (k < 0) return 2;
    n = (size_t)k;
  }
  char err[512] = "";
  int rc = 1;
  anna_model *m = NULL;
  anna_context *ctx = NULL;
  anna_text *text = NULL;
  anna_sampler *smp = NULL;
  anna_text_stream *stream = NULL;
  anna_ngram *drafter = NULL;
  anna_mtp *mtpd = NULL;
  anna_model *dmodel = NULL;
  anna_draft *dd = NULL;
  const int use_mtp = spec && !strcmp(spec, "mtp");
  int32_t *gen = NULL;
  float *logits = NULL, *wlogits = NULL; /* wlogits: a sampled verify window's rows */
  FILE *df = NULL;
  double t0 = cli_now();
  cli_progress prog = {0};
  anna_model_options mo = {.device = device, .dtype = dtype, .tuning = tuning, .weight_quant = wq, .mmproj = mmproj,
                           .progress = cli_load_progress, .progress_user = &prog};
  if (anna_model_load(&m, model, &mo, err, sizeof err)) goto fail;
  double t_load = cli_now() - t0;
  const int V = anna_model_vocab(m);
  if (prompt || !ids_arg) {
    if (anna_text_open(&text, model, 0, err, sizeof err)) goto fail;
  } else if (anna_text_open(&text, model, 0, err, sizeof err)) {
    text = NULL; /* ids in, ids out: the text side is optional */
    err[0] = '\0';
  }
  double t_img = cli_now();
  if (n_img || video) {
    if (cli_image_prompt(m, text, prompt, system, no_think, images, n_img, video, media, refs, &ids, &n, err,
                         sizeof err))
      goto fail;
  } else if (!ids_arg && anna_text_encode_prompt(text, prompt, system, raw, no_think, &ids, &n, err, sizeof err)) {
    goto fail;
  }
  t_img = cli_now() - t_img;
  if (n == 0) {
    snprintf(err, sizeof err, "the prompt is empty after tokenization");
    goto fail;
  }
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V) {
      snprintf(err, sizeof err, "prompt token id %d out of range (vocab %d)", ids[i], V);
      goto fail;
    }
  int n_ctx = ctx_size ? ctx_size : (int)n + max_new + 1;
  if ((long)n + max_new > n_ctx) {
    snprintf(err, sizeof err, "prompt (%zu tokens) + --max-new-tokens %d exceeds --ctx-size %d", n, max_new, n_ctx);
    goto fail;
  }
  int n_batch = n < 512 ? (int)n : 512;
  if (spec && n_batch < draft_max + 1) n_batch = draft_max + 1; /* one window is one batch */
  anna_context_options co = {.n_seq = 1, .n_ctx = n_ctx, .n_batch = n_batch, .n_threads = threads, .device = device,
                             /* hybrid models: the window's per-drafted-token states, the
                              * checkpoint before it and two block snapshots (anna.h) */
                             .n_checkpoints = spec ? draft_max + 3 : 0,
                             .kv_cache_quantization = kvq, .kv_cache_quant_bits = kv_bits,
                             .kv_cache_residual_len = kv_resid, .exact_matmul = exact_matmul, .tuning = tuning};
  cli_offload_apply(&off, &co);
  co.layer_split = layer_split;
  co.tensor_parallel = tensor_parallel;
  co.tp_comm = tp_comm;
  if (anna_context_create(&ctx, m, &co, err, sizeof err)) goto fail;
  cli_print_stages(ctx);
  if (verbose) {
    char tb[2048];
    anna_context_tuning(ctx, tb, sizeof tb);
    fprintf(stderr, "[anna-generate] tuning:\n%s", tb);
    anna_kv_stats ks;
    anna_context_kv_stats(ctx, &ks);
    fprintf(stderr, "[anna-generate] kv cache: %s\n", anna_kv_type_name(ks.kv_type));
  }
  if (use_mtp && anna_mtp_create(&mtpd, ctx, draft_max, err, sizeof err)) goto fail;
  if (draft_path && (anna_model_load(&dmodel, draft_path, &mo, err, sizeof err) ||
                     anna_draft_create(&dd, dmodel, m, &co, draft_max, err, sizeof err)))
    goto fail;
  if (anna_sampler_create(&smp, V, &sp, err, sizeof err)) goto fail;
  if (text && anna_text_stream_new(&stream, text, ANNA_DETOKENIZE_SKIP_SPECIAL, err, sizeof err)) goto fail;
  logits = malloc(sizeof(float) * (size_t)V * (dump ? (size_t)n_batch : 1));
  gen = malloc(sizeof(int32_t) * (size_t)(max_new + 1));
  if (!logits || !gen) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  if (dump && !(df = fopen(dump, "wb"))) {
    snprintf(err, sizeof err, "%s: cannot open for writing", dump);
    goto fail;
  }
  for (size_t i = 0; i < n; i++) anna_sampler_accept(smp, ids[i]);
  /* Prefill in n_batch pieces; keep the last position's logits (all of them with --dump-logits). */
  double t1 = cli_now();
  int32_t *seq = calloc((size_t)n_batch, sizeof *seq), *pos = malloc((size_t)n_batch * sizeof *pos);
  int8_t *want = malloc((size_t)n_batch);
  if (!seq || !pos || !want) {
    free(seq), free(pos), free(want);
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  const int n_media = n_img + (video != NULL);
  if (n_media) { /* the tower, then the prompt with its rows over the pads (anna_context_prefill) */
    const anna_prompt pr = {ids, (int32_t)n, refs, n_media};
    if (anna_context_prefill(ctx, 0, &pr, logits, err, sizeof err)) {
      free(seq), free(pos), free(want);
      goto fail;
    }
  }
  if (use_mtp && anna_mtp_prefill(mtpd, 0, ids, (int32_t)n, logits, err, sizeof err)) {
    free(seq), free(pos), free(want);
    goto fail;
  }
  for (size_t at = n_media || use_mtp ? n : 0; at < n;) {
    int len = (int)(n - at < (size_t)n_batch ? n - at : (size_t)n_batch);
    for (int i = 0; i < len; i++) pos[i] = (int32_t)(at + i), want[i] = dump || at + i == n - 1;
    anna_batch b = {len, ids + at, seq, pos, want};
    if (anna_context_decode(ctx, &b, logits, err, sizeof err)) {
      free(seq), free(pos), free(want);
      goto fail;
    }
    if (df && fwrite(logits, sizeof(float) * (size_t)V, (size_t)len, df) != (size_t)len) {
      free(seq), free(pos), free(want);
      snprintf(err, sizeof err, "%s: write failed", dump);
      goto fail;
    }
    at += (size_t)len;
  }
  free(seq), free(pos), free(want);
  if (dump) memmove(logits, logits + (size_t)((n - 1) % (size_t)n_batch) * V, sizeof(float) * (size_t)V);
  double t_prefill = cli_now() - t1;
  /* Decode. Each step returns the candidates the sampling parameters need (kc of them; 0:
   * they need the full row) instead of the logits; a row the candidates do not decide (e.g.
   * a top-p nucleus longer than them) is fetched in full and sampled as before. */
  double t2 = cli_now();
  int n_gen = 0;
  char piece[256];
  size_t plen;
  float ktemp = 0.0f;
  const int kc = host_sampling ? 0 : anna_sampler_candidates_k(smp, &ktemp);
  int32_t cidx[ANNA_TOPK_MAX];
  float cval[ANNA_TOPK_MAX];
  double cst[2];
  int have_cand = 0; /* the last step returned candidates, not logits */
  if (dd && anna_draft_prefill(dd, 0, ids, (int32_t)n, err, sizeof err)) goto fail;
  if (spec && !use_mtp && !dd) {
    anna_ngram_params np = {.n_min = ngram_min, .n_max = ngram_max, .k_max = draft_max};
    if (anna_ngram_create(&drafter, &np, (int32_t)(n + (size_t)max_new + 1), err, sizeof err) ||
        anna_ngram_accept(drafter, ids, (int32_t)n, err, sizeof err))
      goto fail;
  }
  /* Speculative: the pending token t is emitted, then one verify window (t + drafts) yields
   * the accepted drafts (emitted in turn) and the next pending token. */
  int32_t sout[ANNA_SPEC_MAX_DRAFT + 1];
  int n_sout = 0, i_sout = 0;
  anna_spec_adapt adapt; /* the draft length (the server's p_min, engine.c SPEC_ADAPT_P_MIN) */
  anna_spec_adapt_init(&adapt, draft_max, draft_fixed ? 0.0f : 0.3f);
  /* sampled (or penalised) windows draw every row with the sampler (anna_context_verify_sampled),
   * which records the tokens it emits; greedy ones keep the argmax-only window */
  const int spec_sampled = sp.temperature > 0 || sp.repetition_penalty != 1.0f || sp.presence_penalty != 0 ||
                           sp.frequency_penalty != 0;
  if (spec && spec_sampled && !(wlogits = malloc(sizeof(float) * (size_t)V * (size_t)(draft_max + 1)))) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  for (; spec && n_gen < max_new; n_gen++) {
    int32_t t = n_gen == 0 ? anna_sampler_sample(smp, logits) : sout[i_sout++];
    gen[n_gen] = t;
    if (n_gen == 0 || !spec_sampled) anna_sampler_accept(smp, t); /* a sampled window recorded its own */
    if (text && anna_text_is_eog(text, t)) {
      n_gen++;
      break;
    }
    if (stream && !print_ids && anna_text_stream_feed(stream, t, piece, sizeof piece, &plen, err, sizeof err) == 0) {
      fwrite(piece, 1, plen, stdout);
      fflush(stdout);
    }
    if (n_gen + 1 == max_new) {
      n_gen++;
      break;
    }
    if (drafter && anna_ngram_accept(drafter, &t, 1, err, sizeof err)) goto fail;
    if (i_sout < n_sout) continue; /* accepted drafts of the last window still to emit */
    /* drafts past max_new would be thrown away: cap them (the bonus token also counts) */
    int room = max_new - n_gen - 2;
    if (room > anna_spec_adapt_next(&adapt)) room = anna_spec_adapt_next(&adapt);
    int32_t draft[ANNA_SPEC_MAX_DRAFT];
    int k = 0;
    if (use_mtp) {
      if ((k = anna_mtp_draft(mtpd, 0, t, draft, room, err, sizeof err)) < 0 ||
          (spec_sampled ? anna_mtp_verify_sampled(mtpd, 0, t, draft, k, smp, wlogits, sout, &n_sout, err, sizeof err)
                        : anna_mtp_verify(mtpd, 0, t, draft, k, sout, &n_sout, err, sizeof err)))
        goto fail;
    } else {
      if (dd) {
        if ((k = anna_draft_draft(dd, 0, t, draft, room, err, sizeof err)) < 0) goto fail;
      } else {
        k = room > 0 ? anna_ngram_draft(drafter, draft, room) : 0;
      }
      anna_spec_window w = {.seq = 0, .last = t, .draft = draft, .k = k, .out = sout};
      if (spec_sampled ? anna_context_verify_sampled(ctx, &w, &smp, 1, wlogits, err, sizeof err)
                       : anna_context_verify(ctx, &w, 1, err, sizeof err))
        goto fail;
      n_sout = w.n_out;
      if (dd && anna_draft_commit(dd, 0, t, draft, k, sout, n_sout, err, sizeof err)) goto fail;
    }
    anna_spec_adapt_update(&adapt, k, n_sout - 1);
    i_sout = 0;
  }
  for (; !spec && n_gen < max_new; n_gen++) {
    int32_t t;
    if (!have_cand || anna_sampler_sample_candidates(smp, cidx, cval, kc, cst, &t)) {
      if (have_cand && anna_context_logits_row(ctx, 0, logits, err, sizeof err)) goto fail;
      t = anna_sampler_sample(smp, logits);
    }
    gen[n_gen] = t;
    anna_sampler_accept(smp, t);
    if (text && anna_text_is_eog(text, t)) {
      n_gen++;
      break;
    }
    if (stream && !print_ids && anna_text_stream_feed(stream, t, piece, sizeof piece, &plen, err, sizeof err) == 0) {
      fwrite(piece, 1, plen, stdout);
      fflush(stdout);
    }
    if (n_gen + 1 == max_new) {
      n_gen++;
      break;
    }
    int32_t s0 = 0, p0 = (int32_t)(n + (size_t)n_gen);
    int8_t w = 1;
    anna_batch b = {1, &t, &s0, &p0, &w};
    if (kc > 0 ? anna_context_decode_topk(ctx, &b, kc, ktemp, cidx, cval, cst, err, sizeof err)
               : anna_context_decode(ctx, &b, logits, err, sizeof err))
      goto fail;
    have_cand = kc > 0;
  }
  double t_decode = cli_now() - t2;
  if (stream && !print_ids && anna_text_stream_flush(stream, piece, sizeof piece, &plen, err, sizeof err) == 0)
    fwrite(piece, 1, plen, stdout);
  if (print_ids) {
    for (int i = 0; i < n_gen; i++) printf(i ? ",%d" : "%d", gen[i]);
    printf("\n");
  } else if (n_gen > 0) {
    printf("\n");
  }
  fflush(stdout); /* the text before the statistics line, also when both go to one pipe */
  if (!quiet)
    fprintf(stderr, "[anna] %s | load %.2f s | prompt %zu tok, %.1f tok/s | generated %d tok, %.1f tok/s | KV %lld B/token\n",
            anna_model_describe(m), t_load, n, (double)n / t_prefill, n_gen,
            n_gen > 1 ? (double)(n_gen - 1) / t_decode : 0.0, (long long)anna_context_kv_bytes_per_token(ctx));
  anna_offload_stats os;
  anna_context_offload_stats(ctx, &os);
  if (os.on && !quiet)
    fprintf(stderr, "[anna] %s\n[anna] expert offload: %lld routed, hit rate %.3f, %lld swaps, %.1f MiB from the "
                    "host mirror, %.1f MiB from the file mapping\n",
            os.summary ? os.summary : "expert offload", (long long)os.routed,
            os.routed ? (double)os.hits / (double)os.routed : 0.0, (long long)os.swaps, os.bytes_mirror / 1048576.0,
            os.bytes_file / 1048576.0);
  if (spec && !quiet) {
    anna_spec_stats ss;
    anna_context_spec_stats(ctx, &ss);
    fprintf(stderr, "[anna] speculative %s: %lld windows, %lld drafted, %lld accepted (%.1f%%), %.2f tok/window, "
            "%lld rollbacks, %lld tokens re-run\n", spec, (long long)ss.windows, (long long)ss.drafted,
            (long long)ss.accepted, ss.drafted ? 100.0 * (double)ss.accepted / (double)ss.drafted : 0.0,
            ss.windows ? (double)(ss.windows + ss.accepted) / (double)ss.windows : 0.0, (long long)ss.rollbacks,
            (long long)ss.rerun_tokens);
  }
  if (!quiet && (n_img || video)) {
    long vt = 0;
    for (int i = 0; i < n_img + (video != NULL); i++) vt += anna_media_n_tokens(media[i]);
    anna_vision_stats vs;
    anna_context_vision_stats(ctx, &vs);
    fprintf(stderr, "[anna] %d image(s)%s, %ld visual tokens | decode + preprocess + template %.1f ms | tower %.1f ms "
            "(%lld runs) | tower + prefill %.1f ms\n", n_img, video ? " + 1 video" : "", vt, t_img * 1e3,
            vs.tower_s * 1e3, (long long)vs.tower_runs, t_prefill * 1e3);
  }
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "error: %s\n", err);
  rc = 1;
done:
  if (df) fclose(df);
  free(logits);
  free(gen);
  free(ids);
  for (int i = 0; i < n_img + (video != NULL); i++) anna_media_free(media[i]);
  anna_text_stream_free(stream);
  free(wlogits);
  anna_ngram_free(drafter);
  anna_mtp_free(mtpd);
  anna_draft_free(dd);
  anna_model_free(dmodel);
  anna_sampler_free(smp);
  anna_text_free(text);
  anna_context_free(ctx);
  anna_model_free(m);
  return rc;
}
