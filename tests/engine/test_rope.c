/* test_rope.c: rope scaling configs without a reference model: how config_parse_hf reads
 * yarn from rope_parameters, the legacy rope_scaling and both (transformers 5's
 * convert_rope_params_to_dict: a legacy dict replaces rope_parameters, Gemma3 merges it into
 * full_attention), where the YaRN attention factor goes (score scale or q/k norm weights),
 * the inv_freq table against an independent double-precision YaRN, factor 1 against the
 * default table, and the refusals (dynamic, longrope, unknown types, a factor with nowhere to
 * go). The numerics against transformers itself are the qwen3_yarn / qwen3_5_yarn fixtures.
 */
#include "base/error.h"
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#define EXPECT(cond, ...)                                                                                              \
  do {                                                                                                                 \
    g_checks++;                                                                                                        \
    if (!(cond)) {                                                                                                     \
      printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                                                    \
      printf(__VA_ARGS__);                                                                                             \
      printf("\n");                                                                                                    \
      g_fail++;                                                                                                        \
    }                                                                                                                  \
  } while (0)

static char g_path[256];
static model_config g_cfg;
static char g_err[512];

/* Writes json to a temporary config.json and parses it into g_cfg; the return code. */
static int parse(const char *json) {
  FILE *f = fopen(g_path, "w");
  if (!f) return -1;
  fputs(json, f);
  fclose(f);
  g_err[0] = 0;
  return config_parse_hf(&g_cfg, g_path, g_err, sizeof g_err);
}

#define QWEN3_HEAD                                                                                                     \
  "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "                  \
  "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"max_position_embeddings\": 256, "

static double mscale(double f) { return f <= 1 ? 1.0 : 0.1 * log(f) + 1.0; }

/* Independent YaRN inv_freq in double (transformers _compute_yarn_parameters, truncate on). */
static double yarn_ref(int i, int dim, double base, double factor, double orig, double bf, double bs) {
  double lo = floor(dim * log(orig / (bf * 2 * M_PI)) / (2 * log(base)));
  double hi = ceil(dim * log(orig / (bs * 2 * M_PI)) / (2 * log(base)));
  if (lo < 0) lo = 0;
  if (hi > dim - 1) hi = dim - 1;
  if (lo == hi) hi += 0.001;
  double ramp = (i - lo) / (hi - lo);
  ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
  double pos = pow(base, 2.0 * i / dim), extra = 1 / pos, inter = 1 / (factor * pos);
  return inter * ramp + extra * (1 - ramp);
}

static void test_yarn_full_rotary(void) {
  printf("yarn, full rotary (qwen3)\n");
  const char *forms[] = {
      /* transformers 5 rope_parameters */
      QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, "
                 "\"original_max_position_embeddings\": 64}}",
      /* legacy: top-level rope_theta + rope_scaling spelled with "type" */
      QWEN3_HEAD "\"rope_theta\": 10000.0, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
                 "\"original_max_position_embeddings\": 64}}",
      /* both: the legacy dict replaces rope_parameters whole (rope_theta from the top level) */
      QWEN3_HEAD "\"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5.0}, "
                 "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4, \"original_max_position_embeddings\": 64}}",
      /* original_max_position_embeddings at the top level wins over the dict's (standardize_rope_params) */
      QWEN3_HEAD "\"original_max_position_embeddings\": 64, \"rope_parameters\": {\"rope_type\": \"yarn\", "
                 "\"rope_theta\": 10000.0, \"factor\": 4.0, \"original_max_position_embeddings\": 999}}",
      /* factor absent: max_position_embeddings / original (256 / 64) */
      QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, "
                 "\"original_max_position_embeddings\": 64}}",
  };
  for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
    int rc = parse(forms[k]);
    EXPECT(rc == 0, "form %zu: %s", k, g_err);
    if (rc) continue;
    const layer_config *l = &g_cfg.layers[1];
    EXPECT(l->rope_type == ROPE_KIND_YARN && l->rope_factor == 4.0 && l->rope_orig_max_pos == 64 &&
               l->rope_theta == 10000.0 && l->rope_beta_fast == 32 && l->rope_beta_slow == 1 && l->rope_truncate,
           "form %zu: type %d factor %g orig %g theta %g beta %g/%g", k, l->rope_type, l->rope_factor,
           l->rope_orig_max_pos, l->rope_theta, l->rope_beta_fast, l->rope_beta_slow);
    const double af = mscale(4.0);
    check("attention factor 0.1 ln 4 + 1", fabs(l->rope_attn_factor - af), 1e-12);
    EXPECT(l->rope_fold == ROPE_FOLD_SCALE, "form %zu: fold %d", k, l->rope_fold);
    check("attn_scale = 1/sqrt(D) * af^2", fabs(g_cfg.attn_scale - (float)(af * af / sqrt(32.0))), 1e-7);
    float inv[17];
    config_rope_inv_freq(l, inv);
    double worst = 0;
    for (int i = 0; i < 16; i++) {
      double r = yarn_ref(i, 32, 10000.0, 4.0, 64, 32, 1);
      worst = fmax(worst, fabs(inv[i] - r) / r);
    }
    check("yarn inv_freq vs double reference (rel)", worst, 2e-6);
  }
  /* beta, attention_factor and mscale pairs */
  EXPECT(parse(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8, \"rope_theta\": 1e6, "
                          "\"original_max_position_embeddings\": 32, \"beta_fast\": 16, \"beta_slow\": 2, "
                          "\"attention_factor\": 1.25}}") == 0,
         "%s", g_err);
  EXPECT(g_cfg.layers[0].rope_beta_fast == 16 && g_cfg.layers[0].rope_beta_slow == 2 &&
             g_cfg.layers[0].rope_attn_factor == 1.25,
         "beta / attention_factor read");
  float inv[17];
  config_rope_inv_freq(&g_cfg.layers[0], inv);
  double worst = 0;
  for (int i = 0; i < 16; i++) {
    double r = yarn_ref(i, 32, 1e6, 8, 32, 16, 2);
    worst = fmax(worst, fabs(inv[i] - r) / r);
  }
  check("yarn inv_freq with betas 16/2 (rel)", worst, 2e-6);
  EXPECT(parse(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 40, \"rope_theta\": 1e4, "
                          "\"original_max_position_embeddings\": 64, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}}") == 0,
         "%s", g_err);
  check("mscale / mscale_all_dim", fabs(g_cfg.layers[0].rope_attn_factor - (0.1 * log(40) + 1) / (0.05 * log(40) + 1)),
        1e-12);
  EXPECT(parse(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4, \"rope_theta\": 1e4, "
                          "\"original_max_position_embeddings\": 64, \"truncate\": false}}") == 0,
         "%s", g_err);
  EXPECT(!g_cfg.layers[0].rope_truncate, "truncate false read");
}

static void test_factor_one(void) {
  printf("factor 1 gives the default table\n");
  EXPECT(parse(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}") == 0, "%s",
         g_err);
  float def[17], yarn[17], lin[17];
  const float scale0 = g_cfg.attn_scale;
  config_rope_inv_freq(&g_cfg.layers[0], def);
  EXPECT(parse(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 1.0, "
                          "\"original_max_position_embeddings\": 64}}") == 0,
         "%s", g_err);
  config_rope_inv_freq(&g_cfg.layers[0], yarn);
  EXPECT(g_cfg.layers[0].rope_attn_factor == 1.0 && g_cfg.layers[0].rope_fold == ROPE_FOLD_NONE &&
             g_cfg.attn_scale == scale0,
         "yarn factor 1: attention factor %g, fold %d", g_cfg.layers[0].rope_attn_factor, g_cfg.layers[0].rope_fold);
  double worst = 0;
  for (int i = 0; i < 16; i++) worst = fmax(worst, fabs(yarn[i] - def[i]) / def[i]);
  check("yarn factor 1 vs default (rel, the blend's own rounding)", worst, 2.5e-7);
  EXPECT(parse(QWEN3_HEAD "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 1.0}, \"rope_theta\": 10000.0}") == 0,
         "%s", g_err);
  config_rope_inv_freq(&g_cfg.layers[0], lin);
  EXPECT(!memcmp(lin, def, sizeof(float) * 16), "linear factor 1 is the default table bit for bit");
}

static void test_partial_rotary(void) {
  printf("yarn, partial rotary with q/k norms (qwen3_5_text)\n");
  const char *q35 =
      "{\"model_type\": \"qwen3_5_text\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
      "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"max_position_embeddings\": 256, "
      "\"layer_types\": [\"linear_attention\", \"full_attention\"], \"linear_num_key_heads\": 1, "
      "\"linear_num_value_heads\": 2, \"linear_key_head_dim\": 16, \"linear_value_head_dim\": 16, "
      "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25, "
      "\"factor\": 4.0, \"original_max_position_embeddings\": 64, \"mrope_section\": [2, 1, 1], "
      "\"mrope_interleaved\": true}}";
  EXPECT(parse(q35) == 0, "%s", g_err);
  const layer_config *l = &g_cfg.layers[1];
  EXPECT(l->rope_type == ROPE_KIND_YARN && l->rope_dims == 8 && l->rope_fold == ROPE_FOLD_NORM,
         "type %d dims %d fold %d", l->rope_type, l->rope_dims, l->rope_fold);
  check("attn_scale untouched", fabs(g_cfg.attn_scale - 1 / sqrtf(32.0f)), 0);
  /* the fold: (1 + w') = (1 + w) f on the rotated dims, the rest unchanged */
  float w[32];
  for (int i = 0; i < 32; i++) w[i] = 0.01f * (float)i - 0.1f;
  float w0[32];
  memcpy(w0, w, sizeof w);
  config_rope_fold_norm(&g_cfg, l, w);
  double worst = 0;
  for (int i = 0; i < 32; i++) {
    double want = i < 8 ? (1.0 + w0[i]) * l->rope_attn_factor : 1.0 + w0[i];
    worst = fmax(worst, fabs((1.0 + w[i]) - want));
  }
  check("1+w norm fold on the rotated dims", worst, 1e-6);
  config_rope_fold_norm(&g_cfg, &g_cfg.layers[0], w); /* GDN layer: no fold */
  config_rope_fold_norm(&g_cfg, l, NULL);
  /* plain x*w norms scale directly */
  model_config c2 = g_cfg;
  c2.norm = NORM_KIND_W;
  for (int i = 0; i < 32; i++) w[i] = w0[i];
  config_rope_fold_norm(&c2, l, w);
  worst = 0;
  for (int i = 0; i < 32; i++) worst = fmax(worst, fabs(w[i] - (i < 8 ? w0[i] * l->rope_attn_factor : w0[i])));
  check("x*w norm fold on the rotated dims", worst, 1e-7);
}

static void test_gemma3_merge(void) {
  printf("gemma3: legacy rope_scaling merges into full_attention\n");
  const char *g3 =
      "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
      "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"max_position_embeddings\": 256, "
      "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"rope_local_base_freq\": 12345.0, "
      "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, "
      "\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}, "
      "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}}";
  EXPECT(parse(g3) == 0, "%s", g_err);
  EXPECT(g_cfg.layers[1].rope_type == ROPE_KIND_LINEAR && g_cfg.layers[1].rope_factor == 8.0 &&
             g_cfg.layers[1].rope_theta == 1e6,
         "full layer: type %d factor %g theta %g", g_cfg.layers[1].rope_type, g_cfg.layers[1].rope_factor,
         g_cfg.layers[1].rope_theta);
  EXPECT(g_cfg.layers[0].rope_type == ROPE_KIND_DEFAULT && g_cfg.layers[0].rope_theta == 1e4,
         "sliding layer: type %d theta %g", g_cfg.layers[0].rope_type, g_cfg.layers[0].rope_theta);
  /* yarn on the global layers only: factors differ per layer, so the q/k norms carry it */
  const char *g3y =
      "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
      "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"max_position_embeddings\": 256, "
      "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"rope_theta\": 1000000.0, "
      "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 64}}";
  EXPECT(parse(g3y) == 0, "%s", g_err);
  EXPECT(g_cfg.layers[1].rope_type == ROPE_KIND_YARN && g_cfg.layers[1].rope_fold == ROPE_FOLD_NORM &&
             g_cfg.layers[0].rope_type == ROPE_KIND_DEFAULT && g_cfg.layers[0].rope_fold == ROPE_FOLD_NONE &&
             g_cfg.layers[0].rope_theta == 1e4,
         "gemma3 yarn: types %d/%d folds %d/%d", g_cfg.layers[0].rope_type, g_cfg.layers[1].rope_type,
         g_cfg.layers[0].rope_fold, g_cfg.layers[1].rope_fold);
}

static void refused(const char *json, const char *needle) {
  int rc = parse(json);
  EXPECT(rc == ANNA_EUNSUPPORTED && strstr(g_err, needle) && strstr(g_err, g_path),
         "want ANNA_EUNSUPPORTED naming '%s' and the file, got %d: %s", needle, rc, g_err);
  printf("  refused: %s\n", g_err);
}

static void test_refusals(void) {
  printf("refusals\n");
  refused(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}}", "'dynamic'");
  refused(QWEN3_HEAD "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1], \"long_factor\": [1]}}",
          "'longrope'");
  refused(QWEN3_HEAD "\"rope_scaling\": {\"rope_type\": \"su\", \"factor\": 2.0}}", "'su'");
  /* both: a legacy dict of an unknown type is not hidden by a valid rope_parameters */
  refused(QWEN3_HEAD "\"rope_parameters\": {\"rope_type\": \"default\"}, \"rope_scaling\": {\"type\": \"ntk\"}}",
          "'ntk'");
  /* llama with partial rotary has no q/k norm and no single score scale for the factor */
  refused("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
          "\"num_attention_heads\": 2, \"partial_rotary_factor\": 0.5, \"max_position_embeddings\": 256, "
          "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 64}}",
          "'yarn'");
  refused("{\"model_type\": \"gemma4_text\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
          "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, "
          "\"layer_types\": [\"sliding_attention\", \"full_attention\"], "
          "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 64}}",
          "rope_scaling");
  /* yarn without any original length is a format error, not a guess */
  int rc = parse("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 512, "
                 "\"num_attention_heads\": 2, \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}");
  EXPECT(rc == ANNA_EFORMAT && strstr(g_err, "original_max_position_embeddings"), "yarn without lengths: %d %s", rc,
         g_err);
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_path, sizeof g_path, "%s/anna_test_rope_%d.json", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  test_yarn_full_rotary();
  test_factor_one();
  test_partial_rotary();
  test_gemma3_merge();
  test_refusals();
  remove(g_path);
  printf("%d checks, %d failed\n", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
