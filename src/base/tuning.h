/* tuning.h: every runtime switch of anna in one struct, and the one way to set them.
 *
 * A switch is a real runtime knob (a memory cap, a reference path kept for checking, a
 * feature a deployment may turn off); none is needed to run a model. The A/B variants that
 * used to live here were retired once their comparison was settled: the winner is the only
 * path now (bench/RESULTS.md, "Variants retired"). Set by one environment variable and one
 * options string, both "key=value,..." with the field names below as keys:
 *     ANNA_TUNING="prefix_kv_share=0,cuda_moe_deq_mb=1024"
 *     anna_context_options.tuning / anna_model_options.tuning (applied after ANNA_TUNING)
 * Unknown keys and bad values are errors naming them, never ignored; a retired key is an
 * error saying it was retired. The variables this replaced (ANNA_PREFIX_KV_SHARE,
 * ANNA_HOST_SAMPLING, ANNA_CUDA_*, ANNA_MOE_SHARED_SLOT) are errors too when set, naming the
 * key to use instead or saying the variant was retired, so an old script cannot silently run
 * the default. getenv is called here and nowhere else in src/.
 *
 * Who reads what: context creation prefix_kv_share; the CUDA backend cuda_moe_deq_mb,
 * cuda_decode_mmq, cuda_kv_quant, cuda_batch_invariant, cuda_mmq_split_k, cuda_mmq_v2 and cuda_mmq_bf16 at creation (backend_params.tuning); speculative verify
 * windows spec_window_states; context creation and anna_speech_load encoder_cpu. Plain data: copy freely.
 */
#ifndef ANNA_BASE_TUNING_H
#define ANNA_BASE_TUNING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Field by field: key (= field name), default and what it selects. Booleans take 0/1. */
typedef struct anna_tuning {
  /* prefix_kv_share = 1: the prefix block pool (anna_context_prefix_attach) reuses cached KV
   * blocks and GDN snapshots across sequences; 0 turns reuse off (anna_context_options.
   * prefix_share < 0 does the same per context). Read at context creation. */
  int prefix_kv_share;
  /* cuda_moe_deq_mb = 2048: cap (MiB, >= 1) of the dequantized-experts buffer of MoE
   * prefill (the 35B-A3B layer needs 1.5 GiB; a smaller cap sends the cuBLAS path through
   * chunks of experts and the pipelined tile kernel back to the in-loop tiles). */
  int cuda_moe_deq_mb;
  /* cuda_decode_mmq = 1: quantized matmuls of 9..64 tokens (decode of many sequences) take
   * the int8 tensor-core kernel (cuda_mmq.cu), each weight read once, and steps of up to 64
   * tokens are recorded as CUDA graphs; 0 sends them to the cuBLAS GEMM and records steps of
   * up to 8 tokens (the path before session 16). On by default since its device checks passed
   * (session 17, H100: tests/cuda matmul family, fixtures at 5e-3, 1.73x aggregate decode at
   * 16 sequences, bench/notes/gpu.md). Read at CUDA backend creation. */
  int cuda_decode_mmq;
  /* cuda_kv_quant = 1: the CUDA backend advertises the quantized KV formats (f16, q8, q4,
   * turboquant 2-4 bit: kv_store and the attention kernels of cuda_kv.cu / cuda_attn.cu) and
   * the residual f32 ring of --kv-cache-residual-len; 0 attends f32 caches only (quantized
   * requests are then refused at context creation). On by default since the tests/cuda kv
   * families passed on a device (session 17, H100; bench/notes/kvq.md). Read at CUDA backend
   * creation. */
  int cuda_kv_quant;
  /* cuda_batch_invariant = 0: 1 makes every quantized matmul's per-token result independent
   * of how many tokens share the call: all sizes take the int8 tensor-core kernel
   * (cuda_mmq.cu, in chunks of 64 tokens above that, so prefill reads weights once per 64
   * tokens), types it lacks take the dp4a matvec in groups of 8 tokens, and the norm /
   * activation folds into one-token launches are off. Greedy outputs of requests decoded
   * together then equal those decoded alone (anna-serve --deterministic; dense models: the
   * MoE expert kernels still pick by batch size). Slower prefill; default numerics only
   * (exact mode has its own f32 paths). Read at CUDA backend creation. */
  int cuda_batch_invariant;
  /* cuda_mmq_split_k = 1: cuts the K loop of the int8 decode kernel (cuda_mmq.cu) into
   * slices set by the weight's shape (about two blocks per SM, partial sums added in slice
   * order, still batch-invariant), for decode calls whose row blocks leave SMs idle (a
   * 4096-row weight: 64 blocks on 132 SMs). Session 18 H100, 9B q4_k_rand aggregate decode:
   * 16 sequences 1101 -> 1831 tok/s, 64: 2513 -> 3319, one token in batch-invariant mode 77 ->
   * 136; test_cuda_ops' matvec_int8 / batch_invariant (both ways) and the fixtures passed with
   * it. 0 is the off switch. Read at CUDA backend creation. */
  int cuda_mmq_split_k;
  /* cuda_mmq_v2 = 0 (off until its device checks have run): 1 runs the int8 decode kernel
   * (cuda_mmq.cu) in its 256-thread form: 8 warps per 64-row block (16 warps per SM instead
   * of 8), two weight pieces per thread per step instead of four, the 32-block loop unrolled
   * twice; 2 the same with 128-column K steps (half the shared memory: three blocks per SM,
   * one piece per thread per step); 3 form 2 with the weight and activation scales packed
   * for one 16-byte shared load per m-tile and n-tile (the kernel is bound by its shared-
   * memory pipe: session 20 ncu, L1/TEX 78%, issue slots 49%). The same per-(row, token) integer dots, fp32
   * accumulation order and K slices as the 128-thread kernel, so results are bit-identical to
   * it (test_cuda_ops mmq_v2 compares them); 0 runs the 128-thread kernel (the path before
   * session 20, kept for A/B: test_cuda_ops --bench=mmq). Read at CUDA backend creation. */
  int cuda_mmq_v2;
  /* cuda_mmq_bf16 = 0 (off until its device checks have run): 1 sends Q4_K and Q6_K matmuls of
   * 9..64 tokens (with cuda_decode_mmq on, default numerics, not batch-invariant) through the
   * bf16 tensor-core kernel (cuda_mmq_bf.cu: raw weight tiles through a cp.async pipeline,
   * decoded to bf16 in registers, bf16 activations, f32 sums over all of K) instead of the
   * int8 one; other types keep it. Numerics of the prefill bf16 GEMM class, not the int8
   * matvec's (test_cuda_ops mmq_bf16). 1 uses 256-row blocks at 32 and 64 tokens, 2 128-row
   * blocks at every size (the same bits; test_cuda_ops --bench=mmq_bf16 times both). Read at
   * CUDA backend creation. */
  int cuda_mmq_bf16;
  /* spec_window_states = 1: a speculative verify window (anna_context_seq_verify) on a model
   * with recurrent (GDN) state saves that state after each drafted token (into checkpoint
   * slots, when n_checkpoints >= drafts + 3), so a rejected tail is rolled back by one state
   * copy; 0 (and with fewer slots): restore the checkpoint taken before the window and run
   * the accepted tokens again. Both give the same ids (bench/notes/spec.md compares their
   * cost). Read at context creation. */
  int spec_window_states;
  /* encoder_cpu = 0: the media encoders (the vision tower for images and video, the ASR audio
   * encoder) and the speech object's talker and codec run on the device the context / speech
   * object was opened with; 1 keeps them on the CPU backend whatever the device (the path
   * before session 19, for comparison and as the off switch). Read at context creation and
   * anna_speech_load. */
  int encoder_cpu;
  /* cuda_offload_prefill_stream = 1 (on since its session-21 H100 checks: test_cuda_ops
   * moe_offload 10,184 checks, fixtures --offload 2 exact and 5e-3; 35B-A3B at 8 GiB: prefill 512
   * 1880 tok/s against 245 without): with expert offload (--offload-mode experts), MoE prefill
   * chunks above 8 tokens stream the routed experts (one readback per layer chunk, each routed
   * miss copied once, copies overlapping the grouped GEMMs: cuda_offload.cu); 0 runs them
   * through the decode kernels in batches of 8 tokens (the path before session 19; kept for A/B
   * benches). Read at CUDA backend creation. */
  int cuda_offload_prefill_stream;
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
