/* cuda_moe.cuh: what the two MoE files share (cuda_moe.cu: router, prefill, cuda_op_moe_ffn;
 * cuda_moe_decode.cu: the device-side decode kernels): the wide-load 32-element unit decoders
 * and the activation of the expert kernels (device code, inlined), and the decode path's two
 * host entry points. Include after cuda_internal.h, cuda_math.cuh, cuda_quant.cuh and
 * model/config.h (ACT_KIND_*), as both files do. */
#ifndef ANNA_BACKENDS_CUDA_MOE_CUH
#define ANNA_BACKENDS_CUDA_MOE_CUH

#include <stdint.h>


/* 32 bytes at p (2-byte aligned) as 8 little-endian words: word loads when p is 4-byte
 * aligned, else halfword loads (never past the 32 bytes). */
__device__ __forceinline__ void moe_ld32(const uint8_t *p, uint32_t *o) {
  if (((uintptr_t)p & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = ((const uint32_t *)p)[i];
  } else {
    const uint16_t *h = (const uint16_t *)p;
#pragma unroll
    for (int i = 0; i < 8; i++) o[i] = h[2 * i] | (uint32_t)h[2 * i + 1] << 16;
  }
}

/* cuda_deq32 for Q6_K and Q8_0 with 16 or 8 wide loads instead of a load per byte (the
 * same values, the same float operations); blocks (210, 34 bytes) are 2-byte aligned when
 * the row is. Q6_K unit sub of a block: elements 128 h + 32 (sub % 4) + l (h = sub / 4) take
 * low bits from ql byte 64 h + 32 (sub % 2) + l (nibble (sub / 2) % 2) and high bits from qh
 * byte 128 + 32 h + l (bit pair sub % 4), scales 2 sub and 2 sub + 1. */
__device__ __forceinline__ void moe_deq32_q6k(const uint8_t *row, int64_t u, float *y) {
  const uint8_t *b = row + (u >> 3) * 210;
  const int sub = (int)(u & 7), h = sub >> 2;
  uint32_t L[8], Q[8];
  moe_ld32(b + h * 64 + (sub & 1) * 32, L);
  moe_ld32(b + 128 + h * 32, Q);
  const float d = ldh(b + 208);
  const float s0 = d * (float)(int8_t)b[192 + 2 * sub], s1 = d * (float)(int8_t)b[193 + 2 * sub];
  const int shl = 4 * ((sub >> 1) & 1), shh = 2 * (sub & 3);
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int q = (int)((L[i] >> (8 * j + shl)) & 0xf) | (int)(((Q[i] >> (8 * j + shh)) & 3) << 4);
      y[4 * i + j] = (i < 4 ? s0 : s1) * (float)(q - 32);
    }
}
__device__ __forceinline__ void moe_deq32_q8_0(const uint8_t *row, int64_t u, float *y) {
  const uint8_t *b = row + u * 34;
  uint32_t q[8];
  moe_ld32(b + 2, q);
  const float d = ldh(b);
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) y[4 * i + j] = d * (float)(int8_t)(q[i] >> (8 * j));
}

/* One 32-element unit of any cuda_deq32 type as floats, with the wide loads where the type
 * and the row's alignment allow them (the same values as cuda_deq32). */
__device__ __forceinline__ void moe_deq32_fast(int type, const uint8_t *row, int64_t u, float *y) {
  if (type == ANNA_DTYPE_Q4_K && ((uintptr_t)row & 15) == 0) cuda_deq32_q4k_wide(row, u, y);
  else if (type == ANNA_DTYPE_Q6_K && ((uintptr_t)row & 1) == 0) moe_deq32_q6k(row, u, y);
  else if (type == ANNA_DTYPE_Q8_0 && ((uintptr_t)row & 1) == 0) moe_deq32_q8_0(row, u, y);
  else cuda_deq32(type, row, u, y);
}

__device__ __forceinline__ float moe_act(float g, int act) {
  return act == ACT_KIND_GELU_TANH ? cuda_gelu_tanh(g) : cuda_silu(g);
}

/* The device table of per-expert row pointers of a layer (gate, up, down of each expert),
 * built once and kept with the weight mirrors; NULL when the experts cannot be mirrored, or
 * differ in type or shape, or a type the decode path cannot read (the caller falls back).
 * *aligned (may be NULL): every pointer in it is 16-byte aligned (cuda_moe_decode.cu). */
const uint8_t *const *moe_table(ops_backend *be, int E, const ops_weight *gate, const ops_weight *up,
                                const ops_weight *down, bool *aligned);

/* The decode path (cuda_moe_decode.cu); false when it cannot take these weights (nothing
 * queued). */
bool moe_ffn_decode(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                    const float *wts, int k, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                    int act, float *scratch, int E);
/* The same over a given device table of expert row pointers ([gate E][up E][down E], as
 * moe_table's; aligned: every pointer 16-byte aligned): the offloaded experts' slots
 * (cuda_offload.cu). Only the routed experts' entries are read. False when the shapes do
 * not fit the kernels (nothing queued). */
bool moe_ffn_decode_tab(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                        const float *wts, int k, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                        int act, float *scratch, int E, const uint8_t *const *tab, bool aligned);
/* The grouped prefill path (cuda_moe.cu) on a caller's table of row pointers ([gate E][up E]
 * [down E], moe_table's layout; only the routed experts' entries are read): what expert
 * offload runs its prefill groups on. scratch holds ops_moe_scratch_floats(max(n, cap_n), k,
 * H, I) floats (cap_n: a group of a few pairs carved from a whole chunk's scratch; the sort's
 * per-expert arrays do not shrink with n, so a scratch sized for the group alone can be too
 * small). dry: only whether it would take these shapes (nothing queued). False when it
 * cannot (exact mode, the host-grouped variant, types or shapes it does not take): nothing
 * queued. */
bool moe_ffn_grouped_tab(ops_backend *be, float *out, const float *x, int64_t n, int H, const int32_t *idx,
                         const float *wts, int k, const ops_weight *gate, const ops_weight *up, const ops_weight *down,
                         int act, float *scratch, int E, const uint8_t *const *tab, bool dry, int64_t cap_n);
/* out[t] = sum_j wts[t, j] * y[inv[t * k + j]] (inv < 0: skipped), in j order: the grouped
 * path's combine. */
void moe_combine(ops_backend *be, float *out, const float *y, const int32_t *inv, const float *wts, int64_t n, int H,
                 int k);
/* Whether the decode kernels read every expert of these arrays (types, equal shapes): what
 * moe_table checks before building a table. */
bool moe_decode_types_ok(int E, const ops_weight *gate, const ops_weight *up, const ops_weight *down);

#endif
