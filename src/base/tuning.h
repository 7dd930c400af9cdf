/* tuning.h: every runtime switch of anna in one struct, and the one way to set them.
 *
 * A switch selects between implementations that are all correct (A/B variants kept for
 * side-by-side benchmarks) or turns an optimisation off; none is needed to run a model.
 * They are set by one environment variable and one options string, both "key=value,..."
 * with the field names below as keys:
 *     ANNA_TUNING="cuda_gemm=split,prefix_kv_share=0"
 *     anna_context_options.tuning / anna_model_options.tuning (applied after ANNA_TUNING)
 * Unknown keys and bad values are errors naming them, never ignored. The variables this
 * replaced (ANNA_PREFIX_KV_SHARE, ANNA_MOE_SHARED_SLOT, ANNA_HOST_SAMPLING, ANNA_CUDA_*) are
 * errors too when set, naming the key to use instead, so an old script cannot silently run
 * the default. getenv is called here and nowhere else in src/.
 *
 * Who reads what: model loading (anna_model_load) moe_shared_slot; context creation
 * prefix_kv_share; the CUDA backend the cuda_* fields at creation (backend_params.tuning);
 * the server engine host_sampling. Plain data: copy freely.
 */
#ifndef ANNA_BASE_TUNING_H
#define ANNA_BASE_TUNING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cuda_gemm values (prefill GEMMs of quantized / bf16 weights, exact mode off). */
enum tuning_cuda_gemm {
  TUNING_CUDA_GEMM_BF16 = 0,   /* "bf16": bf16 weight tiles x split (hi + lo) bf16 activations for bf16
                                  weights, activations rounded once for quantized ones */
  TUNING_CUDA_GEMM_INT8,       /* "int8": int8 tensor cores, activations quantized per 32-block */
  TUNING_CUDA_GEMM_BF16X1,     /* "bf16x1": activations rounded once to bf16 for every weight (--dtype bf16) */
  TUNING_CUDA_GEMM_SPLIT,      /* "split": the hi + lo split for every weight type */
};
/* cuda_moe values (MoE expert FFN paths). */
enum tuning_cuda_moe {
  TUNING_CUDA_MOE_DEFAULT = 0, /* "default": shape-picked device paths */
  TUNING_CUDA_MOE_DECODE_F32,  /* "decode_f32": decode on f32-activation kernels */
  TUNING_CUDA_MOE_CUBLAS,      /* "cublas": cuBLAS grouped GEMM whenever it can */
  TUNING_CUDA_MOE_CUBLAS_LOOP, /* "cublas_loop": cuBLAS, one call per expert */
  TUNING_CUDA_MOE_PIPE,        /* "pipe": pipelined tile kernel on pre-dequantized experts */
  TUNING_CUDA_MOE_PREDEQ,      /* "predeq": plain tile kernel on pre-dequantized experts */
  TUNING_CUDA_MOE_TILES,       /* "tiles": in-loop dequantizing tile kernels, automatic tile */
};
enum tuning_cuda_gdn { TUNING_CUDA_GDN_HEAD = 0, TUNING_CUDA_GDN_CLUSTER };   /* "head", "cluster" */
enum tuning_cuda_attn { TUNING_CUDA_ATTN_DEFAULT = 0, TUNING_CUDA_ATTN_PER_HEAD }; /* "default", "per_head" */
enum tuning_cuda_flash { TUNING_CUDA_FLASH_MMA = 0, TUNING_CUDA_FLASH_WMMA };  /* "mma", "wmma" */

/* Field by field: key (= field name), default, what it selects, and for A/B variants the
 * measurement behind the default (bench/notes/gpu.md, bench/RESULTS.md). Booleans take 0/1. */
typedef struct anna_tuning {
  /* prefix_kv_share = 1: the prefix block pool (anna_context_prefix_attach) reuses cached KV
   * blocks and GDN snapshots across sequences; 0 turns reuse off (anna_context_options.
   * prefix_share < 0 does the same per context). Read at context creation. */
  int prefix_kv_share;
  /* moe_shared_slot = 1: a MoE shared expert with the routed experts' shape runs as routed
   * expert E of E + 1 (model_link_shared_experts); 0 keeps its own ops. A/B: gpu.md
   * "ANNA_MOE_SHARED_SLOT" (35B-A3B decode). Read at model load only. */
  int moe_shared_slot;
  /* host_sampling = 0: the server samples from the backend's top-k candidates; 1 downloads
   * every logits row and samples on the host (the reference path). Read by the server engine. */
  int host_sampling;
  /* cuda_gemm = bf16 (enum tuning_cuda_gemm): prefill GEMM numerics/kernels. bf16 default:
   * fixtures within 5e-3; int8 (gpu.md "Int8 tensor-core prefill GEMM") and bf16x1
   * (RESULTS.md: 1.41x prefill, outside 5e-3) are A/B; --dtype bf16 forces bf16x1. */
  int cuda_gemm;
  /* cuda_gemm_tile_mb = 0: MiB of bf16 weight tile a quantized prefill GEMM dequantizes at a
   * time (0: the whole 64 MiB scratch). A/B: gpu.md session 11 call 4 (16/24 MiB slower). */
  int cuda_gemm_tile_mb;
  /* cuda_moe = default (enum tuning_cuda_moe): MoE expert path. A/B: gpu.md MoE prefill. */
  int cuda_moe;
  /* cuda_moe_deq_mb = 2048: cap (MiB, >= 1) of the dequantized-experts buffer of MoE
   * prefill (the 35B-A3B layer needs 1.5 GiB). */
  int cuda_moe_deq_mb;
  /* cuda_gdn = head (enum tuning_cuda_gdn): fused GDN decode step, one block per v-head;
   * cluster: 8-block clusters per k-head group. H200 decode after 512: 35B-A3B 353.7 ->
   * 360.3 tok/s, 9B 370.8 -> 378.9 with head (gpu.md session 10). */
  int cuda_gdn;
  /* cuda_gdn_scan = 0: state columns per block (0 auto, 16, 32) of the chunked GDN prefill's
   * sequential phase. Auto: 32 when its blocks cover 3/4 of the SMs (gpu.md session 11
   * call 1: hv 32 3708 vs 4016 us, hv 16 1532 vs 1253 us at 8192 tokens). */
  int cuda_gdn_scan;
  /* cuda_attn = default (enum tuning_cuda_attn): grouped-query decode attention reads each
   * K/V row once per kv head; per_head re-reads per query head (gpu.md session 5: 4x less
   * traffic after 8k keys on the 9B). */
  int cuda_attn;
  /* cuda_flash = mma (enum tuning_cuda_flash): flash prefill attention on mma.sync for head
   * dims 32-256; wmma sends every dim to the WMMA kernel (gpu.md "flash prefill on mma.sync"). */
  int cuda_flash;
  /* cuda_pdl = 1: programmatic dependent launch inside decode graphs (sm_90+; ignored
   * without it). A/B: gpu.md session 4. */
  int cuda_pdl;
  /* cuda_fuse_norm = 1: a one-row add_rmsnorm is deferred into the next int8 matvec's
   * prologue; 0: its own kernel. A/B: RESULTS.md, 9B decode 351.6 -> 365.8 tok/s. */
  int cuda_fuse_norm;
  /* cuda_graph_piece = 48: a decode step's first N recorded nodes launch as a graph of
   * their own while the host records the rest (0: one graph per step). A/B: RESULTS.md
   * (main 7bb89a7, call 6). */
  int64_t cuda_graph_piece;
  /* cuda_route_fold = 1: the MoE router's top-k runs inside the router group's launch
   * (matmul_group_route); 0: the model routes with its own launch. A/B: gpu.md session 11
   * call 3. */
  int cuda_route_fold;
} anna_tuning;

/* The defaults above. */
void tuning_defaults(anna_tuning *t);

/* Applies spec ("k=v,k=v"; NULL or "" changes nothing; spaces around keys and values are
 * ignored) on top of *t. Unknown key, bad value or a malformed pair: ANNA_EINVAL naming it,
 * and *t is left unchanged. */
int tuning_parse(anna_tuning *t, const char *spec, char *err, size_t errlen);

/* tuning_defaults, then $ANNA_TUNING, then extra_spec (may be NULL). Also ANNA_EINVAL when
 * one of the retired variables (ANNA_CUDA_GEMM, ...) is set, naming the key that replaced it. */
int tuning_from_env(anna_tuning *t, const char *extra_spec, char *err, size_t errlen);

/* One "key=value\n" line per field, in declaration order (what --verbose prints; tuning_parse
 * of the text with newlines read as commas gives *t back). Returns the length the full text
 * needs, excluding the NUL (snprintf's convention: truncated when >= len). */
size_t tuning_format(const anna_tuning *t, char *buf, size_t len);

/* Keys, for tests and help text: the i-th key, NULL past the last. */
const char *tuning_key(int i);

#ifdef __cplusplus
}
#endif
#endif
