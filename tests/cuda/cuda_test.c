/* cuda_test.c: the harness of test_cuda_ops (cuda_test.h): every op of the CUDA backend
 * against the CPU backend on fresh random inputs (several shapes, odd sizes, long sequences),
 * and the quantized matmuls against a dequantize-then-dot reference. Outputs start as NaN on
 * the device so an element the kernel never writes fails the check. Exits 77 ("skipped")
 * without a CUDA device. The tests live one file per op family (test_cuda_*.c); this file
 * holds the shared state, inputs, checks, the registry of tests and benchmarks, and main.
 * Usage: test_cuda_ops [FIXTURES_DIR] [--tests=NAME,...] [--bench | --bench=NAME] (NAME alone, no
 * tests); test names are those of the test_* functions without the prefix. */
#include "cuda_test.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

int g_fail, g_checks;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
ops_backend *g_cpu, *g_gpu;

uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

float frand(void) {
  return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

float *hrand(int64_t n, float scale) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) x[i] = frand() * scale;
  return x;
}

/* Device copy of host floats / bytes. */
void *dput(const void *h, size_t bytes) {
  void *d = g_gpu->alloc(g_gpu, bytes);
  if (d && bytes) g_gpu->upload(g_gpu, d, h, bytes);
  return d;
}

/* Device buffer of n floats, all NaN (to catch unwritten outputs). */
float *dnan(int64_t n) {
  float *h = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  float *d = dput(h, sizeof(float) * (size_t)n);
  free(h);
  return d;
}

float *dget(const float *d, int64_t n) {
  float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  g_gpu->download(g_gpu, h, d, sizeof(float) * (size_t)n);
  return h;
}

void gpu_status(const char *what) {
  char err[256];
  if (cuda_backend_error(g_gpu, err, sizeof err)) {
    printf("  FAIL %s: cuda error: %s\n", what, err);
    g_fail++;
    exit(1); /* the sticky error would fail everything after */
  }
}

/* Max |gpu - ref| over max |ref|; NaN anywhere fails. */
void cmp(const char *what, const float *g, const float *ref, int64_t n, double tol) {
  gpu_status(what);
  double m = 0, scale = 1e-6;
  int nan = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    if (isnan(g[i]) || isinf(g[i])) nan = 1;
    m = fmax(m, fabs((double)g[i] - ref[i]) / scale);
  }
  g_checks++;
  if (nan || !(m <= tol)) {
    printf("  FAIL %-58s rel err %.3g (tol %.1g)%s\n", what, m, tol, nan ? " NaN/unwritten" : "");
    g_fail++;
  }
}

/* Compares device result d with host ref and frees d's host copy. */
void cmpd(const char *what, const float *d, const float *ref, int64_t n, double tol) {
  float *g = dget(d, n);
  cmp(what, g, ref, n, tol);
  free(g);
}

void dfree(void *d) {
  g_gpu->free(g_gpu, d);
}

float *hcopy(const float *x, int64_t n) {
  float *y = malloc(sizeof(float) * (size_t)n);
  memcpy(y, x, sizeof(float) * (size_t)n);
  return y;
}

/* ---- weights ---- */

/* Offsets of the f16 scale fields per block, set to sane values after random fill. */
static void fix_scales(int type, uint8_t *blk) {
  const int off[][3] = {
      {ANNA_DTYPE_Q4_0, 0, -1}, {ANNA_DTYPE_Q4_1, 0, 2},  {ANNA_DTYPE_Q5_0, 0, -1}, {ANNA_DTYPE_Q5_1, 0, 2},
      {ANNA_DTYPE_Q8_0, 0, -1}, {ANNA_DTYPE_IQ4_NL, 0, -1}, {ANNA_DTYPE_Q2_K, 80, 82}, {ANNA_DTYPE_Q3_K, 108, -1},
      {ANNA_DTYPE_Q4_K, 0, 2},  {ANNA_DTYPE_Q5_K, 0, 2},  {ANNA_DTYPE_Q6_K, 208, -1}, {ANNA_DTYPE_IQ4_XS, 0, -1},
      {ANNA_DTYPE_IQ2_XXS, 0, -1}, {ANNA_DTYPE_IQ2_XS, 0, -1}, {ANNA_DTYPE_IQ2_S, 0, -1}, {ANNA_DTYPE_IQ3_XXS, 0, -1},
      {ANNA_DTYPE_IQ3_S, 0, -1},
  };
  for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
    if (off[i][0] != type) continue;
    for (int j = 1; j < 3; j++) {
      if (off[i][j] < 0) continue;
      uint16_t h = quant_f32_to_f16(0.002f + 0.01f * (frand() + 1.0f));
      memcpy(blk + off[i][j], &h, 2);
    }
  }
}

/* Random weight of type; *ref gets its f32 values [rows, cols] (ref NULL: not kept). */
void *make_weight(int type, int64_t rows, int64_t cols, float **ref) {
  const int64_t rb = dtype_row_bytes(type, cols);
  uint8_t *w = malloc((size_t)(rb * rows));
  float *f = malloc(sizeof(float) * (size_t)(rows * cols));
  if (type == ANNA_DTYPE_F32 || type == ANNA_DTYPE_F16 || type == ANNA_DTYPE_BF16) {
    for (int64_t i = 0; i < rows * cols; i++) {
      float v = frand() * 0.5f;
      if (type == ANNA_DTYPE_F32) {
        memcpy(w + 4 * i, &v, 4);
      } else {
        uint16_t h;
        if (type == ANNA_DTYPE_F16) h = quant_f32_to_f16(v);
        else {
          uint32_t u;
          memcpy(&u, &v, 4);
          h = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
        memcpy(w + 2 * i, &h, 2);
      }
    }
  } else {
    for (int64_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)rnd();
    const int64_t bb = dtype_block_bytes(type), nb = rb * rows / bb;
    for (int64_t b = 0; b < nb; b++) fix_scales(type, w + b * bb);
  }
  for (int64_t r = 0; r < rows; r++) quant_dequantize_row(type, w + r * rb, f + r * cols, cols);
  /* the offload tests want only the bytes (their reference is the CPU op on the same weight) */
  if (ref) *ref = f;
  else free(f);
  return w;
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* A crash prints the return addresses (binary(+offset): addr2line -e on the unstripped build
 * names the lines), since the device machine has no debugger to rerun it under. */
static void on_fatal(int sig) {
  void *frames[48];
  const int n = backtrace(frames, 48);
  static const char msg[] = "FATAL signal: backtrace\n";
  if (write(STDOUT_FILENO, msg, sizeof msg - 1) < 0) _exit(128 + sig);
  backtrace_symbols_fd(frames, n, STDOUT_FILENO);
  _exit(128 + sig);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a crash keeps the lines before it, also through a pipe */
  signal(SIGSEGV, on_fatal);
  signal(SIGBUS, on_fatal);
  signal(SIGFPE, on_fatal);
  int do_bench = 0;
  const char *only = NULL; /* --bench=NAME: that benchmark alone, no tests (gdn, gemm, mmq, mmq_bf16, moe, group, topk, attn, ops, encoder) */
  const char *pick = NULL; /* --tests=a,b: those tests only */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bench")) do_bench = 1;
    if (!strncmp(argv[i], "--bench=", 8)) only = argv[i] + 8;
    if (!strncmp(argv[i], "--tests=", 8)) pick = argv[i] + 8;
  }
  if (!cuda_backend_available()) {
    printf("skipped: no CUDA device\n");
    return 77;
  }
  char err[256];
  threadpool *tp = NULL;
  int64_t sf = cpu_matmul_scratch_floats(8192);
  if (sf < 64 + 64 * 64 + 64 * 512 + 1024) sf = 64 + 64 * 64 + 64 * 512 + 1024;
  if (threadpool_create(&tp, 2, err, sizeof err) ||
      cpu_backend_create(&g_cpu, tp, sf, (size_t)128 * 8192 * 4, err, sizeof err) ||
      cuda_backend_create(&g_gpu, 1024, err, sizeof err)) {
    printf("FAILED: setup: %s\n", err);
    return 1;
  }
  printf("device: %s\n", cuda_backend_device_name());
  /* Exact (f32) numerics unless a test switches to the tensor-core paths on purpose. */
  cuda_backend_set_exact(g_gpu, 1);
  if (only) {
    if (!strcmp(only, "gdn")) bench_gdn();
    else if (!strcmp(only, "gemm")) bench_gemm();
    else if (!strcmp(only, "mmq")) bench_mmq(), bench_mmq_bf16();
    else if (!strcmp(only, "mmq_bf16")) bench_mmq_bf16();
    else if (!strcmp(only, "moe")) bench_moe();
    else if (!strcmp(only, "group")) bench_matmul_group();
    else if (!strcmp(only, "topk")) bench_topk();
    else if (!strcmp(only, "attn")) bench_attention(0), bench_attention(2048 - 512), bench_attention(8192 - 512);
    else if (!strcmp(only, "ops")) bench_ops();
    else if (!strcmp(only, "matvec_iq")) bench_matvec_iq();
    else if (!strcmp(only, "encoder")) bench_encoder();
    else {
      printf("FAILED: unknown benchmark %s (gdn, gemm, mmq, mmq_bf16, moe, group, topk, attn, ops, matvec_iq, encoder)\n", only);
      g_fail = 1;
    }
    cuda_backend_free(g_gpu);
    cpu_backend_free(g_cpu);
    threadpool_free(tp);
    return g_fail ? 1 : 0;
  }
  /* every test, in this order; --tests=a,b runs the named ones (e.g. under compute-sanitizer) */
  static const struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
      {"matmul", test_matmul},
      {"matvec_int8", test_matvec_int8},
      {"batch_invariant", test_batch_invariant},
      {"matmul_group", test_matmul_group},
      {"matmul_group_route", test_matmul_group_route},
      {"norm_fused", test_norm_fused},
      {"act_matmul", test_act_matmul},
      {"act_matmul_gated_add", test_act_matmul_gated_add},
      {"embed", test_embed},
      {"norms", test_norms},
      {"elementwise", test_elementwise},
      {"rope", test_rope},
      {"attention", test_attention},
      {"conv_gates", test_conv_gates},
      {"gdn", test_gdn},
      {"fused", test_fused},
      {"gdn_step", test_gdn_step},
      {"gdn_chunked", test_gdn_chunked},
      {"moe", test_moe},
      {"graph_pieces", test_graph_pieces},
      {"moe_grouped", test_moe_grouped},
      {"graphs", test_graphs},
      {"topk", test_topk},
      {"sample_tail", test_sample_tail},
      {"gdn_step_batched", test_gdn_step_batched}, /* the others' inputs stay as they were */
      {"kv_store", test_kv_store},                 /* after it: the same, for the older families */
      {"attention_kv", test_attention_kv},
      {"moe_offload", test_moe_offload},
      {"encoder", test_encoder}, /* the others' inputs stay as they were */
      {"mmq_v2", test_mmq_v2},   /* last: the others' inputs stay as they were */
      {"mmq_bf16", test_mmq_bf16}, /* after it: the same */
  };
  int ran = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (pick) {
      const size_t len = strlen(tests[i].name);
      const char *p = pick;
      int hit = 0;
      while (*p && !hit) {
        const char *e = strchr(p, ',');
        const size_t l = e ? (size_t)(e - p) : strlen(p);
        hit = l == len && !strncmp(p, tests[i].name, len);
        p = e ? e + 1 : p + l;
      }
      if (!hit) continue;
    }
    tests[i].fn();
    ran++;
  }
  if (ran == 0) {
    printf("FAILED: no test named in --tests=%s\n", pick);
    g_fail++;
  }
  if (do_bench) {
    bench_topk();
    bench_ops();
    bench_gemm();
    bench_mmq();
    bench_mmq_bf16();
    bench_gdn();
    bench_moe();
    bench_matmul_group();
  }
  cuda_backend_free(g_gpu);
  cpu_backend_free(g_cpu);
  threadpool_free(tp);
  printf("%s: %d check(s), %d failure(s)\n", g_fail ? "FAILED" : "OK", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
