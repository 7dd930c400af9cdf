/* cuda_backend.h: the CUDA op table (ops.h) over device memory on one stream.
 *
 * Owns: a cuBLAS handle, one non-blocking stream, a scratch arena (weight-tile
 * dequantization for GEMMs, pinned + device rings for the host pointer arrays some ops
 * take) and the weight mirror: host weights and the model's small f32 vectors passed to
 * ops are copied to the device on first use and cached, keyed by host address, until the
 * backend is freed (the model must not change a mirrored buffer meanwhile).
 *
 * Errors never abort: a failed CUDA/cuBLAS call or an unsupported argument sets a sticky
 * error; every later op becomes a no-op and cuda_backend_error reports the first failure.
 * alloc returns NULL when device memory is exhausted.
 *
 * Kernels are picked automatically (by shape, type and exact mode). The cuda_backend_set_*
 * "variant" setters below are test hooks: tests/cuda force each automatic path at small
 * sizes to check it against the CPU reference, and test_cuda_ops --bench times them. They
 * are not runtime switches (the A/B variants they once selected were retired: bench/
 * RESULTS.md, "Variants retired"); the runtime ones are anna_tuning's (base/tuning.h).
 */
#ifndef ANNA_BACKENDS_CUDA_H
#define ANNA_BACKENDS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "base/tuning.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when a usable CUDA device is present (never fails loudly; 0 otherwise). */
int cuda_backend_available(void);

/* max_batch: most rows any op gets per call (sizes the pointer rings); t: the runtime
 * switches (cuda_moe_deq_mb), applied here, borrowed for the call (NULL: the defaults). The
 * table's lifecycle entries (ops.h: destroy, error, step_begin/end, set_graphs, step_stats)
 * are the functions below, and mem_info (cudaMemGetInfo, static); graphs start off. Caller frees with cuda_backend_free (= destroy).
 * Returns 0, ANNA_EUNSUPPORTED (no device), ANNA_ENOMEM or ANNA_EIO. */
int cuda_backend_create_tuned(ops_backend **out, int64_t max_batch, const anna_tuning *t, char *err,
                              size_t errlen);
/* The same on device ordinal `device` (of the devices CUDA_VISIBLE_DEVICES leaves visible):
 * every allocation, stream and handle of the backend is made there, and its bind entry makes
 * it current again on another thread. ANNA_EUNSUPPORTED naming the count when out of range. */
int cuda_backend_create_device(ops_backend **out, int device, int64_t max_batch, const anna_tuning *t, char *err,
                               size_t errlen);
/* Visible CUDA devices (0 without any), and device i's name and total memory (0 or
 * ANNA_ERANGE). */
int cuda_backend_device_count(void);
int cuda_backend_describe(int i, char *name, size_t len, int64_t *mem_bytes);
/* The same with the switches of the environment (tuning_from_env: ANNA_TUNING); also
 * ANNA_EINVAL for a bad ANNA_TUNING. Defined in backends/registry.c, on the C side, so that
 * this library needs nothing from anna's objects at link time. */
int cuda_backend_create(ops_backend **out, int64_t max_batch, char *err, size_t errlen);
void cuda_backend_free(ops_backend *be);

/* MoE expert offload (cuda_offload.cu, issue #27). The routed experts of shape's MoE layers
 * (ops_layer_shape.exp_*) are not mirrored: each layer gets cache slots in one device arena
 * (the policy is src/cache/expert_store.h), the rest of a step's routed experts are copied
 * into staging slots from a pinned host mirror (host_memory_limit bytes; 0: all, < 0: none)
 * or from the weights' host memory (the model's mapping of its file), and every swap_every
 * steps the hottest experts by routing count move into the cache. The store is sized at the
 * first MoE call, once the KV cache exists: gpu_memory_limit (0: the device's free memory
 * at creation) minus the dense weights, what this backend allocated meanwhile and
 * reserve_bytes; expert_cache_bytes (< 0 auto) or cached_experts_per_layer (> 0) set the
 * cache. When every expert fits the host mirror (and the device has unified addressing), the
 * kernels read a missed expert from the pinned mirror over PCIe themselves ("zero-copy"):
 * nothing is read back, decode steps stay graphs, and routing counts come from a device
 * counter. Otherwise decode batches read the routed ids back and copy the misses into staging
 * slots (the rest of that step runs eagerly, not as a graph). Larger batches (prefill) are
 * streamed: routed once, each routed miss copied once per layer chunk in groups of half the
 * staging slots (double-buffered against the grouped GEMMs); exact mode and types the
 * grouped path does not take run as batches of CUDA_MOE_DECODE_MAX_TOK tokens through the
 * decode kernels. ANNA_EINVAL when gpu_memory_limit is below the dense weights (naming the bytes),
 * ANNA_EUNSUPPORTED when no layer has experts. Call once, right after creation. */
typedef struct cuda_offload_params {
  int64_t gpu_memory_limit, expert_cache_bytes, host_memory_limit, reserve_bytes;
  int cached_experts_per_layer, swap_every;
  int no_zero_copy; /* test hook: copy misses into staging even when every expert is mirrored */
  int no_prefill_stream; /* test hook: prefill through the decode batches (the pre-streaming path) */
} cuda_offload_params;
int cuda_backend_set_offload(ops_backend *be, const ops_model_shape *shape, const cuda_offload_params *p, char *err,
                             size_t errlen);
/* Offload counters (zeros when off): cache slots per layer, staging slots, experts mirrored
 * in host memory, routed experts (distinct per layer step), cache hits, swaps, and the bytes
 * copied to the device from the host mirror and from the weights' file mapping. */
typedef struct cuda_offload_stats {
  int on, cache_per_layer, staging_slots;
  int64_t mirrored, routed, hits, swaps, bytes_mirror, bytes_file, device_bytes;
  int64_t prefill_bytes, prefill_tokens; /* expert bytes the prefill streaming copied, tokens it ran */
  const char *summary; /* one line: what went where (borrowed; NULL before the first MoE call) */
} cuda_offload_stats;
void cuda_backend_offload_stats(ops_backend *be, cuda_offload_stats *out);

/* Waits for queued work, then returns 0 or the sticky error (message into err). */
int cuda_backend_error(ops_backend *be, char *err, size_t errlen);

/* Forgets every mirrored weight (frees their device copies): for callers that reuse host
 * buffers with new contents at the same address (tests). */
void cuda_backend_drop_mirrors(ops_backend *be);

/* Exact mode (anna_context_options.exact_matmul, --exact): every op keeps f32 inputs and
 * f32 arithmetic (SGEMM without TF32, CUDA-core attention and delta rule), matching the CPU
 * reference to f32 rounding. Off (default): prefill GEMMs, attention and the chunked delta
 * rule may run on tensor cores with bf16/f16/TF32 inputs and f32 accumulation. */
void cuda_backend_set_exact(ops_backend *be, int on);

/* Decode matvecs (n <= 8 tokens) of Q4_0, IQ4_NL, IQ4_XS, Q8_0, Q4_K, Q5_K, Q6_K, IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S weights
 * quantize the activations to int8 per 32-element block (dp4a dots, f32 scales) unless
 * exact mode is on. Test hooks (f32-bound tests and the --bench rows):
 * CUDA_MV_DEFAULT (that), CUDA_MV_F32 (f32 activations always: the kernels exact mode
 * uses), CUDA_MV_INT8_R4 (int8 with 4 rows per warp instead of 2 for 1-2 tokens). */
enum { CUDA_MV_DEFAULT = 0, CUDA_MV_F32 = 1, CUDA_MV_INT8_R4 = 2 };
void cuda_backend_set_matvec_variant(ops_backend *be, int variant);

/* MoE prefill (moe_ffn above the decode range, exact mode off) runs as grouped GEMMs on the
 * device: from 32 pairs per expert quantized experts are dequantized to bf16 first and
 * multiplied by a pipelined tile kernel, from 192 by cuBLAS's grouped GEMM (the pair counts
 * read back once per call; a loop of one GEMM per expert where this cuBLAS refuses the
 * grouped call); below 32 the tile kernels dequantize inside their K loop. Tiles are picked
 * from the batch shape. MoE decode (exact mode off) quantizes the activations to int8 for
 * experts of the int8 matvec types. The tuning key cuda_moe_deq_mb caps the
 * dequantized-experts buffer (default 2048 MiB: the pipelined kernel needs a whole layer's
 * experts in it, the cuBLAS path takes them in chunks that fit).
 * Test hooks, each forcing one automatic path: CUDA_MOE_DEFAULT (the automatic choice),
 * CUDA_MOE_HOST (the exact mode's host-grouped path: ids read back, per-expert matmuls),
 * CUDA_MOE_T16 / T32 / T64 (in-loop dequantizing tile kernels, tiles of 16 / 32 / 64 pairs),
 * CUDA_MOE_TILES (those, automatic tile), CUDA_MOE_PIPE (the pipelined tile kernel on
 * experts dequantized first, whenever it can), CUDA_MOE_CUBLAS (the cuBLAS path whenever it
 * can take the weights), CUDA_MOE_CUBLAS_LOOP (that path's per-expert fallback loop). */
enum {
  CUDA_MOE_DEFAULT = 0,
  CUDA_MOE_HOST = 1,
  CUDA_MOE_CUBLAS = 3,
  CUDA_MOE_TILES = 4,
  CUDA_MOE_CUBLAS_LOOP = 5,
  CUDA_MOE_PIPE = 6,
  CUDA_MOE_T16 = 16,
  CUDA_MOE_T32 = 32,
  CUDA_MOE_T64 = 64
};
void cuda_backend_set_moe_variant(ops_backend *be, int variant);
/* The fused GDN decode step (gdn_step): one block per v-head (CUDA_GDN_HEAD, the default)
 * for dk, dv <= 128 and 1, 2 or 4 v-heads per k-head; other shapes take the cluster kernel,
 * which splits each k-head group's state columns over a cluster of 8 blocks. Test hook:
 * CUDA_GDN_CLUSTER sends every shape to the cluster kernel. */
enum { CUDA_GDN_CLUSTER = 0, CUDA_GDN_HEAD = 1 };
void cuda_backend_set_gdn_variant(ops_backend *be, int variant);
/* The chunked GDN prefill's sequential phase keeps 16 or 32 state columns per block: 32 reads
 * each chunk's W, Q, K and P half as often (one 512-thread block per SM), 16 gives twice the
 * blocks; picked by shape (32 when its blocks still cover 3/4 of the SMs). Test hook: cols 16
 * or 32 forces one, 0 the automatic choice. */
void cuda_backend_set_gdn_scan_cols(ops_backend *be, int cols);

/* Decode steps as CUDA graphs: between step_begin and step_end the ops of a batch of at
 * most 8 tokens are recorded (not launched) and run as one graph. A step whose recorded
 * nodes match a cached graph's relaunches it, with only the changed arguments updated in
 * place: consecutive decode steps of the same sequences change none (their varying inputs
 * are device or ring memory at fixed addresses), so they cost no capture and no update.
 * Every op of a decode-sized batch stays on the device (MoE included); default off. */
void cuda_backend_set_graphs(ops_backend *be, int on);

/* Tuning cuda_decode_mmq after creation (tests, benches): on sends quantized matmuls of
 * 9..64 tokens through the int8 tensor-core kernel and records steps of up to 64 tokens. */
void cuda_backend_set_decode_mmq(ops_backend *be, int on);
/* Tuning cuda_batch_invariant after creation (tests): on, a token's matmul result does not
 * depend on the other tokens of the call (base/tuning.h says how). */
void cuda_backend_set_batch_invariant(ops_backend *be, int on);
/* Tuning cuda_mmq_split_k after creation (tests, benches): K slices in the int8 decode kernel. */
void cuda_backend_set_mmq_split_k(ops_backend *be, int on);
/* Tuning cuda_mmq_v2 after creation (tests, benches): the int8 decode kernel's form, 0 the
 * 128-thread one, 1 256 threads, 2 256 threads and 128-column steps, 3 form 2 with packed
 * scales (the same bits; other values mean 0). */
void cuda_backend_set_mmq_v2(ops_backend *be, int mode);
/* Tuning cuda_mmq_bf16 after creation (tests, benches): 1 or 2 send Q4_K / Q6_K matmuls of
 * 9..64 tokens (with cuda_decode_mmq on, default numerics) through the bf16 tensor-core
 * kernel (cuda_mmq_bf.cu) instead of the int8 one, 1 with 256-row blocks at 32 and 64
 * tokens, 2 with 128-row blocks at every size (the same bits); other values: off. */
void cuda_backend_set_mmq_bf16(ops_backend *be, int mode);

void cuda_backend_step_begin(ops_backend *be, int64_t n_tokens);
void cuda_backend_step_end(ops_backend *be);
/* Early launch: once a recorded step holds `nodes` launches it runs them as a graph of their
 * own and records the rest of the step as a second graph, so the GPU works while the host
 * records (CUDA_GRAPH_PIECE, 48, at creation). Test hook: other piece sizes, 0 for one graph
 * per step (what a step of fewer nodes gets anyway). The results are the same either way. */
void cuda_backend_set_graph_piece(ops_backend *be, int64_t nodes);
/* Programmatic dependent launch inside decode graphs (sm_90 and newer; on wherever the device
 * has it): kernels written for it may launch while the kernel before them finishes, hiding
 * the per-kernel launch gap. Test and bench hook: 0 gives the launches of a device without
 * it. Takes effect for graphs built afterwards; a device without it ignores on. */
void cuda_backend_set_pdl(ops_backend *be, int on);
/* Decode attention (runs the flash kernel does not take): grouped queries (2..8 query heads
 * per kv head, head_dim <= 256) read each K/V row once per kv head for the whole group
 * (CUDA_ATTN_DEFAULT); other shapes keep one block per query head. Test hook:
 * CUDA_ATTN_PER_HEAD sends grouped shapes to the per-head kernel too. */
enum { CUDA_ATTN_DEFAULT = 0, CUDA_ATTN_PER_HEAD = 1 };
void cuda_backend_set_attn_variant(ops_backend *be, int variant);
/* Flash prefill attention (exact off): head dims 32, 64, 128 and 256 on the mma.sync kernel
 * (scores and probabilities in registers, K/V staged by cp.async), other dims on the WMMA
 * one (CUDA_FLASH_MMA). Test hook: CUDA_FLASH_WMMA sends every dim to the WMMA kernel. */
enum { CUDA_FLASH_MMA = 0, CUDA_FLASH_WMMA = 1 };
void cuda_backend_set_flash_variant(ops_backend *be, int variant);
/* Prefill GEMMs of bf16 and quantized weights (exact mode off): CUDA_GEMM_BF16 (default:
 * quantized weight tiles dequantized to bf16 times activations rounded once to bf16; bf16
 * weights times activations split into bf16 hi + lo, two products). CUDA_GEMM_BF16_SINGLE:
 * the activations rounded once for bf16 weights too (llama.cpp's precision: half the
 * tensor-core work of the split, 8 significant bits instead of 16; moves the fixtures'
 * logits past the 5e-3 bound, so never the default; `--dtype bf16` selects it, see
 * anna_model_options). Test hook: CUDA_GEMM_BF16_SPLIT, the hi + lo split for every type. */
enum { CUDA_GEMM_BF16 = 0, CUDA_GEMM_BF16_SINGLE = 2, CUDA_GEMM_BF16_SPLIT = 3 };
void cuda_backend_set_gemm_variant(ops_backend *be, int variant);
/* Bytes of bf16 weight tile a quantized prefill GEMM dequantizes at a time (0: the whole 64 MiB
 * scratch, the default; smaller values are capped below by one 128-row tile). Test hook: the
 * multi-tile path at small sizes. */
void cuda_backend_set_gemm_tile(ops_backend *be, size_t bytes);
/* Graph launches, builds (new graphs instantiated) and in-place updates (launches whose
 * arguments changed) so far, for logs, tests and benchmarks. updates may be NULL. */
void cuda_backend_graph_stats(ops_backend *be, int64_t *launches, int64_t *builds, int64_t *updates);
/* Host seconds recording steps (step begin .. the end of recording) and updating /
 * instantiating their graphs, and device seconds of the replays (events around each
 * launch, read at the next step or here). */
void cuda_backend_graph_times(ops_backend *be, double *capture_s, double *update_s, double *gpu_s);

/* Device name for logs ("NVIDIA H200"); static storage, "none" without a device. */
const char *cuda_backend_device_name(void);

#ifdef __cplusplus
}
#endif
#endif
