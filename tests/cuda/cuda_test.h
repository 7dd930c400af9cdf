/* cuda_test.h: the harness the test_cuda_ops binary's files share (cuda_test.c). One CUDA
 * backend (g_gpu, exact numerics unless a test switches) and one CPU backend (g_cpu, the
 * reference) live for the whole run; every test draws its inputs from one xorshift stream
 * (rnd), so a run's inputs depend on which tests ran before it: the registry in cuda_test.c
 * runs them in a fixed order. A check is one call of cmp / cmpd / bound_check or one
 * "g_checks++" with its own comparison; a failed check prints "  FAIL ..." and counts in
 * g_fail; a sticky CUDA error ends the run (gpu_status). The last line of a run is
 * "OK: N check(s), 0 failure(s)" or "FAILED: ..." (scripts/gpu_check.sh, gpu_session.sh read it).
 * Tests and benchmarks are plain void functions, one file per op family (test_cuda_*.c). */
#ifndef ANNA_TESTS_CUDA_TEST_H
#define ANNA_TESTS_CUDA_TEST_H

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "base/threadpool.h"
#include "formats/dtype.h"
#include "formats/quant.h"
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern int g_fail, g_checks;      /* failed checks, checks run */
extern ops_backend *g_cpu, *g_gpu; /* the reference backend and the one under test */

/* ---- random inputs (one stream for the whole run) ---- */
uint64_t rnd(void);
float frand(void);                  /* uniform in [-1, 1) */
float *hrand(int64_t n, float scale); /* n floats frand() * scale; caller frees with free */
/* Random weight of type [rows, cols] (block scales kept sane); *ref gets its f32 values
 * (ref may be NULL: the values are dropped). Caller frees both with free. */
void *make_weight(int type, int64_t rows, int64_t cols, float **ref);

/* ---- device buffers (g_gpu) ---- */
void *dput(const void *h, size_t bytes);  /* device copy of bytes; caller frees with dfree */
float *dnan(int64_t n);                   /* n floats, all NaN; caller frees with dfree */
float *dget(const float *d, int64_t n);   /* host copy of n device floats; caller frees with free */
void dfree(void *d);
float *hcopy(const float *x, int64_t n);  /* host copy; caller frees with free */

/* ---- checks ---- */
/* Exits (status 1) on a sticky CUDA error: it would fail everything after. */
void gpu_status(const char *what);
/* One check: max |g - ref| over max |ref| within tol; NaN or inf anywhere fails. */
void cmp(const char *what, const float *g, const float *ref, int64_t n, double tol);
/* cmp of device floats d (downloaded) against host ref. */
void cmpd(const char *what, const float *d, const float *ref, int64_t n, double tol);
double now_s(void); /* monotonic seconds, for the benchmarks */

/* ---- tests (run in the registry's order, cuda_test.c) and benchmarks, by file ---- */
/* test_cuda_matmul.c */
void test_matmul(void);
void test_matvec_int8(void);
void test_batch_invariant(void);
void bench_gemm(void);
void test_mmq_v2(void); /* cuda_mmq's 256-thread kernel vs the 128-thread one (bits) and the reference */
void bench_mmq(void);   /* --bench=mmq: the two, Q4_K / Q6_K of the 9B shape at 16..64 tokens */
/* test_cuda_mmq_bf16.c */
void test_mmq_bf16(void);  /* the bf16 decode kernel (tuning cuda_mmq_bf16) vs bf16-rounded and f32 references */
void bench_mmq_bf16(void); /* --bench=mmq (after bench_mmq) or --bench=mmq_bf16: it vs the int8 kernel, 9B shapes */
/* test_cuda_group.c */
void test_matmul_group(void);
void test_matmul_group_route(void);
void bench_matmul_group(void);
/* test_cuda_fused.c */
void test_norm_fused(void);
void test_act_matmul(void);
void test_act_matmul_gated_add(void);
void test_fused(void);
/* The unfused GDN decode sequence on one backend (what gdn_step replaces); device buffers
 * conv [n, cd], qkv2 [n, cd], gates [2n, hv], o [n, Vd] given by the caller. */
void gdn_unfused(ops_backend *be, const ops_gdn_step_args *a, float *conv, float *qkv2, float *gates, float *o);
/* test_cuda_misc.c */
void test_embed(void);
void test_norms(void);
void test_elementwise(void);
void test_rope(void);
void test_conv_gates(void);
/* test_cuda_attn.c */
void test_attention(void);
void bench_attention(int len0);       /* 512-token prefill chunk after len0 cached positions */
void bench_attention_decode(int len); /* one token after len keys */
/* test_cuda_kv.c (quantized KV caches, tuning key cuda_kv_quant) */
void test_kv_store(void);
void test_attention_kv(void);
/* test_cuda_gdn.c */
void test_gdn(void);
void test_gdn_step(void);
void test_gdn_step_batched(void);
void test_gdn_chunked(void);
void bench_gdn(void);
/* test_cuda_moe.c */
void test_moe(void);
void test_moe_grouped(void);
void test_moe_offload(void); /* test_cuda_offload.c: expert offload vs the CPU and the all-resident path */
void bench_moe(void);
/* test_cuda_graph.c */
void test_graph_pieces(void);
void test_graphs(void);
/* test_cuda_sample.c */
void test_topk(void);
void test_sample_tail(void); /* sample_tail and mask_rows against the CPU ops (issue 29) */
void bench_topk(void);
/* test_cuda_encoder.c: the encoder and waveform decoder ops (vision, ASR, codec) */
void test_encoder(void);
void bench_encoder(void);
/* test_cuda_bench.c */
void bench_ops(void);
void bench_matvec_iq(void); /* --bench=matvec_iq: IQ2_XXS..IQ3_S matvecs beside Q4_K, IQ4_XS */

#endif
