/* cuda_matmul.cu: y = x W^T and embedding lookups, for bf16/f16/f32 and the llama.cpp
 * quantized weight types.
 *
 * Decode (n <= MV_MAX_TOK tokens): weights are read once for all tokens of a launch (up to
 * 8) and dotted with f32 activations (f32 accumulation), or, with exact mode off, int8
 * activations (k_matvec_q8: dp4a, f32 scales; Q4_0, IQ4_NL, IQ4_XS, Q8_0, Q4_K-Q6_K and the
 * 2- and 3-bit i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, when the quantized
 * activations fit the shared-memory budget). Plain types: one warp per row, 16-byte loads
 * when rows and activations are aligned. Those same quantized types: the piece kernel
 * (k_matvec_piece: persistent warps of several rows, wide loads, the next loads in flight
 * during the decode). The other quantized types and
 * unaligned activations: k_matvec_quant, one lane per 32-element unit. Decode batches of
 * 9..CUDA_MMQ_MAX_TOK tokens (many sequences): cuda_mmq.cu, int8 tensor cores, each weight
 * read once. Prefill: weights
 * are decoded to f32 in row tiles (f32 weights are used in place) and multiplied by cuBLAS
 * SGEMM, so results match the f32 CPU reference to rounding. */
#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/cuda_math.cuh"
#include "backends/cuda/cuda_q8act.cuh"
#include "backends/cuda/cuda_quant.cuh"
#include "backends/cuda/cuda_route.cuh"

#include "base/error.h"
#include "ops/ops.h"

#include <string.h>

#include "backends/cuda/cuda_matvec.cuh" /* the decode kernels; after the headers above */

/* Rows [0, m) of W (any supported type) to f32 dst[m, cols]. */
static __global__ void k_dequant_rows(float *dst, const uint8_t *W, int64_t m, int64_t cols, int64_t row_bytes,
                                      int type) {
  if (cuda_float_type(type)) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * cols; i += (int64_t)gridDim.x * blockDim.x)
      dst[i] = cuda_ldw(type, W + (i / cols) * row_bytes, i % cols);
    return;
  }
  const int64_t units = cols / 32;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m * units; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / units, u = i % units;
    float w[32];
    cuda_deq32(type, W + r * row_bytes, u, w);
    float *o = dst + r * cols + u * 32;
#pragma unroll
    for (int j = 0; j < 32; j++) o[j] = w[j];
  }
}

static __global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t rows) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * rows; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += bias[i % rows];
}

static unsigned grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* Checks the weight and returns its device copy (NULL with a sticky error otherwise). */
static const uint8_t *weight_dev(ops_backend *be, const ops_weight *w, int64_t *row_bytes) {
  cuda_impl *ci = cuda_impl_of(be);
  if (!cuda_float_type(w->type) && !cuda_quant_supported(w->type)) {
    cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: weight type %s is not supported", dtype_name(w->type));
    return NULL;
  }
  const int64_t rb = dtype_row_bytes(w->type, w->cols);
  if (rb <= 0 || w->rows <= 0) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: bad weight shape [%lld, %lld] for %s", (long long)w->rows,
              (long long)w->cols, dtype_name(w->type));
    return NULL;
  }
  *row_bytes = rb;
  return (const uint8_t *)cuda_mirror(be, w->data, (size_t)(rb * w->rows));
}

/* True when the piece kernel reads this weight: its format has a piece decoder, the rows
 * meet that decoder's load alignment and the activations are 16-byte aligned. */
static bool piece_ok(int type, const uint8_t *W, int64_t rb, const float *x) {
  if (((uintptr_t)x & 15) != 0) return false;
  switch (type) {
  case ANNA_DTYPE_Q4_0: case ANNA_DTYPE_IQ4_NL: case ANNA_DTYPE_Q8_0: case ANNA_DTYPE_Q6_K:
    return ((uintptr_t)W & 1) == 0;
  case ANNA_DTYPE_Q4_K: case ANNA_DTYPE_Q5_K: return ((uintptr_t)W & 15) == 0 && rb % 16 == 0;
  case ANNA_DTYPE_IQ4_XS: return ((uintptr_t)W & 7) == 0 && rb % 8 == 0;
  case ANNA_DTYPE_IQ2_XXS: case ANNA_DTYPE_IQ2_XS: case ANNA_DTYPE_IQ2_S: case ANNA_DTYPE_IQ3_XXS:
  case ANNA_DTYPE_IQ3_S:
    return ((uintptr_t)W & 1) == 0; /* 2-byte loads (cuda_piece_load); odd-sized blocks */
  default: return false;
  }
}

/* The decode kernel a weight takes for nt tokens at x. One decision for single and grouped
 * launches, so a weight in a group gets the arithmetic of its own matmul. q8: int8
 * activations allowed (exact off): 1, or 2 for the 4-row variant; smem_max: the q8 kernels'
 * dynamic shared memory limit. piece_ok holds for exactly the twelve types that both the
 * piece and the q8 kernels take. */
enum mv_path { MV_PATH_Q8, MV_PATH_Q8R4, MV_PATH_PIECE, MV_PATH_PLAIN, MV_PATH_QUANT };
static mv_path mv_choose(int type, const uint8_t *W, int64_t rb, const float *x, int64_t cols, int nt, int q8,
                         size_t smem_max) {
  const bool piece = piece_ok(type, W, rb, x);
  if (q8 && piece && cols % 32 == 0 && mvq8_smem(nt, cols) <= smem_max) return q8 == 2 ? MV_PATH_Q8R4 : MV_PATH_Q8;
  if (piece) return MV_PATH_PIECE;
  return cuda_float_type(type) ? MV_PATH_PLAIN : MV_PATH_QUANT;
}

/* The plain kernel's 16-byte loads: whole 8-element steps, rows and activations aligned. */
static int mv_vec(const uint8_t *W, const float *x, int64_t cols) {
  return cols % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)x & 15) == 0;
}

/* Blocks for a persistent piece kernel (G: the grouped one): what fits on the device at
 * once, or fewer when there is less work. Measured once per instance (the process uses one
 * device kind); any grid size is correct. */
template <int TYPE, int NT, int R, bool G = false>
static unsigned piece_grid(int64_t blocks) {
  static int64_t resident = 0;
  if (!resident) {
    const void *k;
    if constexpr (G) k = (const void *)k_matvec_piece_g<TYPE, NT, R>;
    else k = (const void *)k_matvec_piece<TYPE, NT, R>;
    int dev = 0, sms = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, 32 * MVQ_WARPS, 0) != cudaSuccess)
      (void)cudaGetLastError(); /* clear it; the guesses below still give a correct grid */
    resident = (int64_t)(sms > 0 ? sms : 128) * (per > 0 ? per : 1);
  }
  return (unsigned)(blocks < resident ? blocks : resident);
}

/* Blocks for a persistent k_matvec_q8 (G: the grouped instance, 2 rows per warp): SMs
 * times the blocks that fit one SM, the smaller of the register limit (the occupancy API
 * without shared memory, queried once per instance) and the shared-memory limit for this
 * launch's smem (computed, so weights of different widths do not re-query: 1 KB per block
 * is reserved by the system). */
template <int TYPE, int NT, int R, bool G = false, bool O = false>
static unsigned q8_grid(int64_t blocks, size_t smem) {
  static int sms = 0, per_regs = 0, smem_sm = 0;
  if (!sms) {
    const void *k;
    if constexpr (G) k = (const void *)k_matvec_q8<TYPE, NT, 2, true>;
    else k = (const void *)k_matvec_q8<TYPE, NT, R, false, O>;
    int dev = 0, n = 0, per = 0, sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, 32 * mvq8_warps<TYPE, NT, G ? 2 : R>(), 0) != cudaSuccess)
      (void)cudaGetLastError(); /* clear it; the guesses below still give a correct grid */
    per_regs = per > 0 ? per : 1, smem_sm = sm > 0 ? sm : 0;
    sms = n > 0 ? n : 128;
  }
  int64_t per = smem_sm ? (int64_t)smem_sm / (int64_t)(smem + 1024) : 1;
  if (per > per_regs) per = per_regs;
  if (per < 1) per = 1;
  const int64_t resident = (int64_t)sms * per;
  return (unsigned)(blocks < resident ? blocks : resident);
}

template <int TYPE, int NT, int R>
static void launch_q8(cuda_impl *ci, float *y, const float *x, const uint8_t *W, const ops_weight *w, int64_t rb,
                      const mv_glu *glu, const mv_norm *nrm) {
  const size_t sm = mvq8_smem(NT, w->cols);
  constexpr int WARPS = mvq8_warps<TYPE, NT, R>();
  const unsigned g = q8_grid<TYPE, NT, R>((w->rows + WARPS * R - 1) / (WARPS * R), sm);
  static const mv_table none = {}; /* zero bytes: the same arguments every step */
  static const mv_glu plain = {};
  static const mv_norm nonorm = {};
  if constexpr (R == 2) { /* the gated instances: act_matmul's path only (launch_matvec checks) */
    if (glu && glu->og) {
      const unsigned go = q8_grid<TYPE, NT, 2, false, true>((w->rows + WARPS * 2 - 1) / (WARPS * 2), sm);
      cuda_launch_pdl(ci, "matvec q8 gated", k_matvec_q8<TYPE, NT, 2, false, true>, go, 32 * WARPS, sm, y, x, W,
                      w->rows, w->cols, rb, none, *glu, nonorm);
      return;
    }
  } else if (glu && glu->og) { /* no gated instance: never a plain store in its place */
    cuda_fail(ci, ANNA_ESTATE, "cuda: gated matvec with %d rows per warp", R);
    return;
  }
  cuda_launch_pdl(ci, "matvec q8", k_matvec_q8<TYPE, NT, R, false>, g, 32 * WARPS, sm, y, x, W, w->rows, w->cols,
                  rb, none, glu ? *glu : plain, nrm ? *nrm : nonorm);
}

/* The dynamic shared memory one kernel may use under the device's opt-in limit: the limit
 * less its static shared memory (asking for the whole limit is refused for a kernel that has
 * any). -1 when the query fails. */
template <typename K> static int q8_room(K k, int optin) {
  cudaFuncAttributes at;
  if (cudaFuncGetAttributes(&at, k) != cudaSuccess) return -1;
  return optin - (int)at.sharedSizeBytes;
}

/* The smallest room of the q8 instances for TYPE, NT (single with 2 and with 4 rows per warp,
 * grouped, gated), or with set, raises each one's dynamic limit to bytes. */
template <int TYPE, int NT> static int q8_optin(int optin, int set) {
  auto a = k_matvec_q8<TYPE, NT, 2, false>;
  auto b = k_matvec_q8<TYPE, NT, 2, false, true>;
  auto c = k_matvec_q8<TYPE, NT, mvq8_rows_r4<TYPE, NT>(), false>;
  auto d = k_matvec_q8<TYPE, NT, 2, true>;
  if (set > 0) {
    const cudaFuncAttribute A = cudaFuncAttributeMaxDynamicSharedMemorySize;
    return cudaFuncSetAttribute(a, A, set) == cudaSuccess && cudaFuncSetAttribute(b, A, set) == cudaSuccess &&
                   cudaFuncSetAttribute(c, A, set) == cudaSuccess && cudaFuncSetAttribute(d, A, set) == cudaSuccess
               ? set
               : -1;
  }
  const int r[4] = {q8_room(a, optin), q8_room(b, optin), q8_room(c, optin), q8_room(d, optin)};
  int m = r[0];
  for (int i = 1; i < 4; i++) m = r[i] < m ? r[i] : m;
  return m;
}
template <int NT> static int q8_optin_all(int optin, int set) {
  const int r[12] = {q8_optin<ANNA_DTYPE_Q4_0, NT>(optin, set),    q8_optin<ANNA_DTYPE_IQ4_NL, NT>(optin, set),
                     q8_optin<ANNA_DTYPE_Q8_0, NT>(optin, set),    q8_optin<ANNA_DTYPE_Q4_K, NT>(optin, set),
                     q8_optin<ANNA_DTYPE_Q5_K, NT>(optin, set),    q8_optin<ANNA_DTYPE_Q6_K, NT>(optin, set),
                     q8_optin<ANNA_DTYPE_IQ4_XS, NT>(optin, set),  q8_optin<ANNA_DTYPE_IQ2_XXS, NT>(optin, set),
                     q8_optin<ANNA_DTYPE_IQ2_XS, NT>(optin, set),  q8_optin<ANNA_DTYPE_IQ2_S, NT>(optin, set),
                     q8_optin<ANNA_DTYPE_IQ3_XXS, NT>(optin, set), q8_optin<ANNA_DTYPE_IQ3_S, NT>(optin, set)};
  int m = r[0];
  for (int i = 1; i < 12; i++) m = r[i] < m ? r[i] : m;
  return m;
}

/* The int8 matvec's dynamic shared memory limit: the room every instance has under the
 * device's opt-in limit (each instance raised to it), else the default 48 KB. */
size_t cuda_matmul_setup(void) {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      optin <= MVQ8_SMEM_DEFAULT) {
    (void)cudaGetLastError();
    return MVQ8_SMEM_DEFAULT;
  }
  int room = optin;
  const int rs[4] = {q8_optin_all<1>(optin, 0), q8_optin_all<2>(optin, 0), q8_optin_all<4>(optin, 0),
                     q8_optin_all<8>(optin, 0)};
  for (int i = 0; i < 4; i++) room = rs[i] < room ? rs[i] : room;
  room &= ~15; /* whole 16-byte pieces */
  if (room <= MVQ8_SMEM_DEFAULT || q8_optin_all<1>(optin, room) < 0 || q8_optin_all<2>(optin, room) < 0 ||
      q8_optin_all<4>(optin, room) < 0 || q8_optin_all<8>(optin, room) < 0) {
    (void)cudaGetLastError(); /* not fatal: the default limit still holds for every instance */
    return MVQ8_SMEM_DEFAULT;
  }
  return (size_t)room;
}

#define QCASE(T)                                                                                                      \
  case T:                                                                                                             \
    cuda_launch_pdl(ci, "matvec quant", k_matvec_quant<T, NT>, grid, th, 0, y, x, W, w->rows, w->cols, rb, xal);          \
    break;
#define PCASE(T)                                                                                \
  case T: {                                                                                     \
    constexpr int R = mvq_rows<T, NT>();                                                        \
    const unsigned g = piece_grid<T, NT, R>((w->rows + MVQ_WARPS * R - 1) / (MVQ_WARPS * R)); \
    cuda_launch_pdl(ci, "matvec piece", k_matvec_piece<T, NT, R>, g, 32 * MVQ_WARPS, 0, y, x, W, w->rows, w->cols, rb); \
    return;                                                                                     \
  }
#define Q8CASE(T)                                                                       \
  case T:                                                                               \
    if (q8 == 2) launch_q8<T, NT, mvq8_rows_r4<T, NT>()>(ci, y, x, W, w, rb, glu, nrm);  \
    else launch_q8<T, NT, 2>(ci, y, x, W, w, rb, glu, nrm);                             \
    return;

/* One weight, NT tokens (q8, smem_max: as mv_choose). glu: the q8 kernels' folded
 * activation, only where mv_choose picks them (NULL otherwise). */
template <int NT>
static void launch_matvec(cuda_impl *ci, float *y, const float *x, const uint8_t *W, const ops_weight *w,
                          int64_t rb, int vec, int q8, size_t smem_max, const mv_glu *glu = NULL,
                          const mv_norm *nrm = NULL) {
  const unsigned grid = (unsigned)((w->rows + MV_WARPS - 1) / MV_WARPS);
  const int th = 32 * MV_WARPS;
  const int xal = ((uintptr_t)x & 15) == 0;
  const mv_path path = mv_choose(w->type, W, rb, x, w->cols, NT, q8, smem_max);
  if (glu && path != MV_PATH_Q8) { /* the caller checked: only the int8 kernel folds the activation (and the gate) */
    cuda_fail(ci, ANNA_ESTATE, "cuda: act_matmul took a matvec path without the folded activation");
    return;
  }
  if (path == MV_PATH_Q8 || path == MV_PATH_Q8R4) {
    switch (w->type) {
      Q8CASE(ANNA_DTYPE_Q4_0)
      Q8CASE(ANNA_DTYPE_IQ4_NL)
      Q8CASE(ANNA_DTYPE_Q8_0)
      Q8CASE(ANNA_DTYPE_Q4_K)
      Q8CASE(ANNA_DTYPE_Q5_K)
      Q8CASE(ANNA_DTYPE_Q6_K)
      Q8CASE(ANNA_DTYPE_IQ4_XS)
      Q8CASE(ANNA_DTYPE_IQ2_XXS)
      Q8CASE(ANNA_DTYPE_IQ2_XS)
      Q8CASE(ANNA_DTYPE_IQ2_S)
      Q8CASE(ANNA_DTYPE_IQ3_XXS)
      Q8CASE(ANNA_DTYPE_IQ3_S)
    default: break;
    }
  }
  if (path == MV_PATH_PIECE) {
    switch (w->type) {
      PCASE(ANNA_DTYPE_Q4_0)
      PCASE(ANNA_DTYPE_IQ4_NL)
      PCASE(ANNA_DTYPE_Q8_0)
      PCASE(ANNA_DTYPE_Q4_K)
      PCASE(ANNA_DTYPE_Q5_K)
      PCASE(ANNA_DTYPE_Q6_K)
      PCASE(ANNA_DTYPE_IQ4_XS)
      PCASE(ANNA_DTYPE_IQ2_XXS)
      PCASE(ANNA_DTYPE_IQ2_XS)
      PCASE(ANNA_DTYPE_IQ2_S)
      PCASE(ANNA_DTYPE_IQ3_XXS)
      PCASE(ANNA_DTYPE_IQ3_S)
    default: break;
    }
  }
  switch (w->type) {
  case ANNA_DTYPE_F32:
    cuda_launch_pdl(ci, "matvec plain", k_matvec_plain<ANNA_DTYPE_F32, NT>, grid, th, 0, y, x, W, w->rows, w->cols,
                    vec);
    break;
  case ANNA_DTYPE_F16:
    cuda_launch_pdl(ci, "matvec plain", k_matvec_plain<ANNA_DTYPE_F16, NT>, grid, th, 0, y, x, W, w->rows, w->cols,
                    vec);
    break;
  case ANNA_DTYPE_BF16:
    cuda_launch_pdl(ci, "matvec plain", k_matvec_plain<ANNA_DTYPE_BF16, NT>, grid, th, 0, y, x, W, w->rows, w->cols,
                    vec);
    break;
    QCASE(ANNA_DTYPE_Q4_0)
    QCASE(ANNA_DTYPE_Q4_1)
    QCASE(ANNA_DTYPE_Q5_0)
    QCASE(ANNA_DTYPE_Q5_1)
    QCASE(ANNA_DTYPE_Q8_0)
    QCASE(ANNA_DTYPE_IQ4_NL)
    QCASE(ANNA_DTYPE_Q2_K)
    QCASE(ANNA_DTYPE_Q3_K)
    QCASE(ANNA_DTYPE_Q4_K)
    QCASE(ANNA_DTYPE_Q5_K)
    QCASE(ANNA_DTYPE_Q6_K)
    QCASE(ANNA_DTYPE_IQ4_XS)
    QCASE(ANNA_DTYPE_IQ2_XXS)
    QCASE(ANNA_DTYPE_IQ2_XS)
    QCASE(ANNA_DTYPE_IQ2_S)
    QCASE(ANNA_DTYPE_IQ3_XXS)
    QCASE(ANNA_DTYPE_IQ3_S)
  default: break; /* weight_dev rejected other types */
  }
}
#undef QCASE
#undef PCASE
#undef Q8CASE

/* ---- grouped launches (the kernels' contract is at mv_table) ---- */

/* Blocks of each entry of a grouped persistent launch: what its rows need, scaled down in
 * proportion when together they exceed `resident` (what the device holds at once), at least
 * one each. So every block is resident from the start (no second wave of a few blocks) and
 * the entries finish about together; each block's warps walk their entry's row groups. */
static void mv_split(int m, const int64_t *need, int64_t resident, int64_t *blocks) {
  int64_t total = 0;
  for (int i = 0; i < m; i++) total += need[i];
  for (int i = 0; i < m; i++) {
    const int64_t b = total <= resident ? need[i] : need[i] * resident / total;
    blocks[i] = b < 1 ? 1 : b;
  }
}

/* Sets the entries' first blocks from their block counts; returns the grid size. */
static unsigned mv_firsts(mv_table *t, int m, const int64_t *blocks) {
  int64_t at = 0;
  for (int i = 0; i < m; i++) t->e[i].first = at, at += blocks[i];
  t->count = m;
  return (unsigned)at;
}

template <int TYPE, int NT>
static void group_q8(cuda_impl *ci, mv_table *t, int m, const float *x, int64_t cols, const mv_norm *nrm) {
  const size_t sm = mvq8_smem(NT, cols);
  int64_t need[OPS_GROUP_MAX], blocks[OPS_GROUP_MAX];
  constexpr int WARPS = mvq8_warps<TYPE, NT, 2>();
  for (int i = 0; i < m; i++) need[i] = (t->e[i].rows + WARPS * 2 - 1) / (WARPS * 2);
  mv_split(m, need, q8_grid<TYPE, NT, 2, true>((int64_t)1 << 40, sm), blocks);
  const unsigned g = mv_firsts(t, m, blocks);
  static const mv_glu plain = {};
  static const mv_norm nonorm = {};
  cuda_launch_pdl(ci, "matvec q8 group", k_matvec_q8<TYPE, NT, 2, true>, g, 32 * WARPS, sm, (float *)NULL, x,
                  (const uint8_t *)NULL, (int64_t)0, cols, (int64_t)0, *t, plain, nrm ? *nrm : nonorm);
}

template <int TYPE, int NT>
static void group_piece(cuda_impl *ci, mv_table *t, int m, const float *x, int64_t cols) {
  constexpr int R = mvq_rows<TYPE, NT>();
  int64_t need[OPS_GROUP_MAX], blocks[OPS_GROUP_MAX];
  for (int i = 0; i < m; i++) need[i] = (t->e[i].rows + MVQ_WARPS * R - 1) / (MVQ_WARPS * R);
  mv_split(m, need, piece_grid<TYPE, NT, R, true>((int64_t)1 << 40), blocks);
  const unsigned g = mv_firsts(t, m, blocks);
  cuda_launch_pdl(ci, "matvec piece group", k_matvec_piece_g<TYPE, NT, R>, g, 32 * MVQ_WARPS, 0, *t, x, cols);
}

/* Plain and unit kernels: one warp per row, every block resident or not (not persistent). */
static unsigned group_rows(mv_table *t, int m, int pw = MV_WARPS) {
  int64_t blocks[OPS_GROUP_MAX];
  for (int i = 0; i < m; i++) blocks[i] = (t->e[i].rows + pw - 1) / pw;
  return mv_firsts(t, m, blocks);
}

#define GQ8(T)                                                                                                        \
  case T: group_q8<T, NT>(ci, t, m, x, cols, nrm); return;
#define GPIECE(T)                                                                                                     \
  case T: group_piece<T, NT>(ci, t, m, x, cols); return;
#define GPLAIN(T)                                                                                                     \
  case T:                                                                                                             \
    g = group_rows(t, m, mv_plain_warps<T>());                                                                \
    if (NT == 1 && rt && nrm && nrm->r)                                                                               \
      cuda_launch_pdl(ci, "matvec plain group + norm + route", k_matvec_plain_g<T, 1, true, true>, g,                \
                      32 * mv_plain_warps<T>(), (size_t)cols * sizeof(float), *t, x, cols, vec, *rt, *nrm);          \
    else if (rt) cuda_launch_pdl(ci, "matvec plain group + route", k_matvec_plain_g<T, NT, true>, g,                 \
                                 32 * mv_plain_warps<T>(), 0, *t, x, cols, vec, *rt, mv_norm{});                      \
    else cuda_launch_pdl(ci, "matvec plain group", k_matvec_plain_g<T, NT, false>, g, 32 * mv_plain_warps<T>(), 0,    \
                         *t, x, cols, vec, mv_route{}, mv_norm{});                                                    \
    return;
#define GQUANT(T)                                                                                                     \
  case T: cuda_launch_pdl(ci, "matvec quant group", k_matvec_quant_g<T, NT>, g, 32 * MV_WARPS, 0, *t, x, cols, xal); return;

/* One grouped launch of the m entries of t, all of this type and path (vec: the plain
 * kernel's flag, the same for all); rt: a route for the plain path to fold in. */
template <int NT>
static void group_launch(cuda_impl *ci, mv_path path, int type, int vec, mv_table *t, int m, const float *x,
                         int64_t cols, const mv_norm *nrm = NULL, const mv_route *rt = NULL) {
  if (path == MV_PATH_Q8) {
    switch (type) {
      GQ8(ANNA_DTYPE_Q4_0) GQ8(ANNA_DTYPE_IQ4_NL) GQ8(ANNA_DTYPE_Q8_0) GQ8(ANNA_DTYPE_Q4_K) GQ8(ANNA_DTYPE_Q5_K)
      GQ8(ANNA_DTYPE_Q6_K) GQ8(ANNA_DTYPE_IQ4_XS) GQ8(ANNA_DTYPE_IQ2_XXS) GQ8(ANNA_DTYPE_IQ2_XS)
      GQ8(ANNA_DTYPE_IQ2_S) GQ8(ANNA_DTYPE_IQ3_XXS) GQ8(ANNA_DTYPE_IQ3_S)
    default: break;
    }
  } else if (path == MV_PATH_PIECE) {
    switch (type) {
      GPIECE(ANNA_DTYPE_Q4_0) GPIECE(ANNA_DTYPE_IQ4_NL) GPIECE(ANNA_DTYPE_Q8_0) GPIECE(ANNA_DTYPE_Q4_K)
      GPIECE(ANNA_DTYPE_Q5_K) GPIECE(ANNA_DTYPE_Q6_K) GPIECE(ANNA_DTYPE_IQ4_XS) GPIECE(ANNA_DTYPE_IQ2_XXS)
      GPIECE(ANNA_DTYPE_IQ2_XS) GPIECE(ANNA_DTYPE_IQ2_S) GPIECE(ANNA_DTYPE_IQ3_XXS) GPIECE(ANNA_DTYPE_IQ3_S)
    default: break;
    }
  } else if (path == MV_PATH_PLAIN) {
    unsigned g; /* by the type's warps per block */
    switch (type) {
      GPLAIN(ANNA_DTYPE_F32) GPLAIN(ANNA_DTYPE_F16) GPLAIN(ANNA_DTYPE_BF16)
    default: break;
    }
  } else if (path == MV_PATH_QUANT) {
    const unsigned g = group_rows(t, m);
    const int xal = ((uintptr_t)x & 15) == 0;
    switch (type) {
      GQUANT(ANNA_DTYPE_Q4_0) GQUANT(ANNA_DTYPE_Q4_1) GQUANT(ANNA_DTYPE_Q5_0) GQUANT(ANNA_DTYPE_Q5_1)
      GQUANT(ANNA_DTYPE_Q8_0) GQUANT(ANNA_DTYPE_IQ4_NL) GQUANT(ANNA_DTYPE_Q2_K) GQUANT(ANNA_DTYPE_Q3_K)
      GQUANT(ANNA_DTYPE_Q4_K) GQUANT(ANNA_DTYPE_Q5_K) GQUANT(ANNA_DTYPE_Q6_K) GQUANT(ANNA_DTYPE_IQ4_XS)
      GQUANT(ANNA_DTYPE_IQ2_XXS) GQUANT(ANNA_DTYPE_IQ2_XS) GQUANT(ANNA_DTYPE_IQ2_S) GQUANT(ANNA_DTYPE_IQ3_XXS)
      GQUANT(ANNA_DTYPE_IQ3_S)
    default: break;
    }
  }
  /* every (path, type) pair mv_choose returns has a case above */
  cuda_fail(ci, ANNA_EINVAL, "cuda: no grouped matvec for %s (path %d)", dtype_name(type), (int)path);
}
#undef GQ8
#undef GPIECE
#undef GPLAIN
#undef GQUANT

/* NT tokens (at x; y[i] their rows of output i) of a group: the weights that take the same
 * kernel (path, type and, for plain weights, the vector flag) run as one grouped launch. A
 * weight alone without a bias, or on the 4-row bench variant (no grouped instance), keeps
 * its single launch and, with a bias, the bias kernel for these NT tokens. skip: weights
 * the caller runs elsewhere. rt (route_i its entry): a route to fold into the plain grouped
 * launch that holds entry route_i; returns whether one did (else the caller routes). */
template <int NT>
static bool group_tokens(cuda_impl *ci, int count, const int *skip, float *const *y, const float *x,
                         const uint8_t *const *W, const int64_t *rb, const ops_weight *const *ws,
                         const float *const *bd, int q8, size_t smem_max, const cuda_pnorm *pn = NULL,
                         const mv_route *rt = NULL, int route_i = -1, int shared_i = -1) {
  bool routed = false;
  const int64_t cols = ws[0]->cols;
  int key[OPS_GROUP_MAX] = {0}, done[OPS_GROUP_MAX] = {0}; /* zeroed: gcc cannot see count bounds them */
  for (int i = 0; i < count; i++) {
    done[i] = skip[i];
    const mv_path p = mv_choose(ws[i]->type, W[i], rb[i], x, cols, NT, q8, smem_max);
    key[i] = p == MV_PATH_Q8R4 ? -1 - i /* matches no other */
                               : (int)p | ws[i]->type << 4 | (p == MV_PATH_PLAIN ? mv_vec(W[i], x, cols) : 0) << 12;
  }
  /* A deferred norm of x (pn, one token): the first int8 launch takes it, first of all, as it
   * stores x's normalised row for the launches after it; without one it runs on its own. */
  int first = -1;
  mv_norm nrm = {};
  if (pn) {
    for (int i = 0; i < count && first < 0; i++)
      if (!done[i] && key[i] >= 0 && (key[i] & 15) == MV_PATH_Q8) first = i;
    /* No int8 launch: a routed group that is one plain launch takes the norm in its blocks
     * (k_matvec_plain_g, NRM), when the norm alone would be k_rmsnorm4 (whose steps it
     * reproduces) and the row fits the default shared memory. */
    if (first < 0 && NT == 1 && rt && route_i >= 0 && route_i < count && !done[route_i] && key[route_i] >= 0 &&
        (key[route_i] & 15) == MV_PATH_PLAIN && pn->d == cols && cols % 4 == 0 && cols / 4 <= CUDA_RN4_V * 1024 &&
        cols * (int64_t)sizeof(float) <= 48 * 1024 &&
        !(((uintptr_t)pn->x | (uintptr_t)pn->r | (uintptr_t)pn->y | (uintptr_t)pn->w) & 15)) {
      bool one = true;
      int members = 0; /* a lone weight takes the single-matvec kernel: no route, no norm */
      for (int i = 0; i < count; i++) one &= done[i] || key[i] == key[route_i], members += !done[i];
      if (one && members >= 2) first = route_i; /* the shared logit, if any, is in it too (same key) */
    }
    if (first < 0) {
      ci->pnorm = *pn;
      cuda_norm_flush(ci);
    } else {
      nrm = mv_norm{pn->r, pn->y, pn->w, ci->pnorm_count, pn->eps, pn->one_plus};
    }
  }
  for (int k = -1; k < count; k++) {
    const int i = k < 0 ? first : k; /* the fused launch first */
    if (i < 0 || done[i]) continue;
    mv_table t;
    memset(&t, 0, sizeof t); /* unused entries too: launch arguments are compared as bytes */
    int m = 0;
    bool has_route = false, has_shared = shared_i < 0;
    for (int j = i; j < count; j++)
      if (!done[j] && key[j] == key[i]) {
        t.e[m++] = mv_ent{W[j], y[j], bd[j], ws[j]->rows, rb[j], 0};
        done[j] = 1;
        has_route |= j == route_i;
        has_shared |= j == shared_i;
      }
    const bool fuse = i == first;
    const float *xi = fuse ? pn->x : x;
    if (key[i] < 0 || (m == 1 && !bd[i])) {
      launch_matvec<NT>(ci, y[i], xi, W[i], ws[i], rb[i], mv_vec(W[i], x, cols), q8, smem_max, NULL,
                        fuse ? &nrm : NULL);
      if (bd[i]) cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(NT * ws[i]->rows), 256, 0, y[i], bd[i], (int64_t)NT,
                             ws[i]->rows);
      continue;
    }
    /* the shared logit, if any, must come from this launch too */
    const bool fold = rt && has_route && has_shared && (key[i] & 15) == MV_PATH_PLAIN;
    group_launch<NT>(ci, (mv_path)(key[i] & 15), ws[i]->type, key[i] >> 12 & 1, &t, m, xi, cols, fuse ? &nrm : NULL,
                     fold ? rt : NULL);
    routed |= fold;
  }
  return routed;
}

void cuda_op_matmul(ops_backend *be, float *y, const float *x, int64_t n, const ops_weight *w, const float *bias) {
  const cuda_pnorm pn = cuda_norm_take(be, x, n); /* before cuda_impl_of, which would launch it */
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  const uint8_t *W = weight_dev(be, w, &rb);
  if (!W) return;
  const float *bd = bias ? (const float *)cuda_mirror(be, bias, (size_t)w->rows * sizeof(float)) : NULL;
  if (bias && !bd) return;
  /* a deferred norm of x: fused into an int8 launch, else on its own first (never in the
   * batch-invariant mode: cuda_op_add_rmsnorm defers nothing there) */
  if (pn.x) {
    const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
    if (mv_choose(w->type, W, rb, x, w->cols, 1, ci->mv_variant == CUDA_MV_DEFAULT && !ci->exact, smem_max) ==
        MV_PATH_Q8) {
      const mv_norm nrm = {pn.r, pn.y, pn.w, ci->pnorm_count, pn.eps, pn.one_plus};
      launch_matvec<1>(ci, y, pn.x, W, w, rb, 0, 1, smem_max, NULL, &nrm);
      if (bd && !ci->err) cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(w->rows), 256, 0, y, bd, (int64_t)1, w->rows);
      cuda_check_launch(ci, "matvec");
      return;
    }
    ci->pnorm = pn;
    cuda_norm_flush(ci);
  }
  /* Q4_K's wide loads need 16-byte aligned rows (a mirror copy always is: cudaMalloc). */
  const bool wide_ok = w->type != ANNA_DTYPE_Q4_K || ((uintptr_t)W & 15) == 0;
  /* batch-invariant: the int8 kernel for every size, else the matvec in groups of 8 for every
   * size (each token's sums in the same order whatever n is); the GEMM only for rows the
   * matvec cannot load */
  const bool mv = (n <= MV_MAX_TOK || ci->batch_inv) && wide_ok;
  /* tuning cuda_mmq_bf16: Q4_K / Q6_K decode batches on bf16 tensor cores (it refuses
   * batch-invariant and exact mode, other types and sizes: then the int8 kernel as before) */
  if (!mv && n <= CUDA_MMQ_MAX_TOK && cuda_mmq_bf16(ci, y, x, n, w, W, rb)) {
    if (bd && !ci->err) cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(n * w->rows), 256, 0, y, bd, n, w->rows);
    cuda_check_launch(ci, "mmq bf16");
    return;
  }
  if ((!mv || ci->batch_inv) && (n <= CUDA_MMQ_MAX_TOK || ci->batch_inv) && cuda_mmq(ci, y, x, n, w, W, rb)) {
    if (bd && !ci->err) cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(n * w->rows), 256, 0, y, bd, n, w->rows);
    cuda_check_launch(ci, "mmq");
    return;
  }
  if (!mv) cuda_flush(ci); /* cuBLAS calls are not recorded: the step goes on eagerly */
  if (mv) {
    const int vec = mv_vec(W, x, w->cols);
    const int q8 = ci->exact || ci->mv_variant == CUDA_MV_F32 ? 0 : ci->mv_variant == CUDA_MV_INT8_R4 ? 2 : 1;
    const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
    /* Token groups of 4/2/1 (8 at most in one pass): few template instances. */
    for (int64_t t0 = 0; t0 < n;) {
      const int64_t left = n - t0;
      const float *xt = x + t0 * w->cols;
      float *yt = y + t0 * w->rows;
      if (left >= 8) launch_matvec<8>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 8;
      else if (left >= 4) launch_matvec<4>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 4;
      else if (left >= 2) launch_matvec<2>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 2;
      else launch_matvec<1>(ci, yt, xt, W, w, rb, vec, q8, smem_max), t0 += 1;
    }
    if (!cuda_check_launch(ci, "matvec")) return;
  } else if (!cuda_gemm_tc(be, y, x, n, w, W, rb)) {
    const float one = 1.0f, zero = 0.0f;
    if (w->cols > (int64_t)ci->deq_floats || w->cols > 0x7fffffff || n > 0x7fffffff) {
      cuda_fail(ci, ANNA_EUNSUPPORTED, "cuda: matmul of %lld columns exceeds the GEMM tile", (long long)w->cols);
      return;
    }
    int64_t tile = (int64_t)ci->deq_floats / w->cols;
    if (tile > w->rows) tile = w->rows;
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
      const int64_t m = w->rows - r0 < tile ? w->rows - r0 : tile;
      const float *A;
      if (w->type == ANNA_DTYPE_F32) {
        A = (const float *)(W + r0 * rb);
      } else {
        cuda_launch(ci, "dequant", k_dequant_rows, grid_for(m * w->cols / (cuda_float_type(w->type) ? 1 : 32)), 256, 0,
                    ci->deq, W + r0 * rb, m, w->cols, rb, w->type);
        if (ci->err) return;
        A = ci->deq;
      }
      /* Column-major view: Y^T[m, n] = A^T... i.e. C(m x n, ld rows) = A(cols x m)^T B(cols x n). */
      cublasStatus_t s = cublasSgemm(ci->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)w->cols, &one, A,
                                     (int)w->cols, x, (int)w->cols, &zero, y + r0, (int)w->rows);
      if (s != CUBLAS_STATUS_SUCCESS) {
        cuda_fail(ci, ANNA_EIO, "cuda: cublasSgemm failed (status %d)", (int)s);
        return;
      }
    }
  }
  if (bd && !ci->err) {
    cuda_launch_pdl(ci, "bias", k_add_bias, grid_for(n * w->rows), 256, 0, y, bd, n, w->rows);
  }
}

/* The device copy of w when act_matmul at these sizes folds the activation into the int8
 * kernel's prologue (decode, exact off, default variant, aligned rows and pointers, the int8
 * path for the largest token chunk), with its row bytes and the shared memory limit; NULL
 * when the ops must form h first. */
static const uint8_t *act_fold_weight(ops_backend *be, cuda_impl *ci, const float *gate, const float *up, int64_t n,
                                      int64_t gs, int64_t us, const ops_weight *w, int64_t *rb, size_t *smem_max) {
  if (ci->exact || ci->mv_variant != CUDA_MV_DEFAULT || n > MV_MAX_TOK || ci->batch_inv) return NULL;
  *smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
  const uint8_t *W = weight_dev(be, w, rb);
  const int first = n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1; /* the largest chunk needs the most shared memory */
  if (W && gs % 4 == 0 && us % 4 == 0 && (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)W) & 15) == 0 &&
      mv_choose(w->type, W, *rb, up, w->cols, first, 1, *smem_max) == MV_PATH_Q8)
    return W;
  return NULL;
}

/* The folded launches for n tokens in chunks of 8/4/2/1 (W from act_fold_weight); og: the
 * gated add's gates (NULL: plain act_matmul). */
static void act_fold_launch(cuda_impl *ci, float *y, const float *gate, const float *up, int64_t n, int64_t gs,
                            int64_t us, int act, const float *og, int64_t ogs, const uint8_t *W, const ops_weight *w,
                            int64_t rb, size_t smem_max) {
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t left = n - t0;
    const mv_glu glu = {gate + t0 * gs, gs, us, act, og ? og + t0 * ogs : NULL, ogs};
    const float *xt = up + t0 * us;
    float *yt = y + t0 * w->rows;
    if (left >= 8) launch_matvec<8>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 8;
    else if (left >= 4) launch_matvec<4>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 4;
    else if (left >= 2) launch_matvec<2>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 2;
    else launch_matvec<1>(ci, yt, xt, W, w, rb, 0, 1, smem_max, &glu), t0 += 1;
  }
}

/* Decode sizes whose weight takes the int8 kernel fold the activation into its prologue (one
 * launch instead of act_mul + matvec, h left alone); everything else forms h first. */
void cuda_op_act_matmul(ops_backend *be, float *y, float *h, const float *gate, const float *up, int64_t n, int64_t gs,
                        int64_t us, int act, const ops_weight *w) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  size_t smem_max = 0;
  const uint8_t *W = act_fold_weight(be, ci, gate, up, n, gs, us, w, &rb, &smem_max);
  if (W) {
    act_fold_launch(ci, y, gate, up, n, gs, us, act, NULL, 0, W, w, rb, smem_max);
    return;
  }
  if (ci->err) return; /* weight_dev failed */
  cuda_op_act_mul(be, h, gate, up, n, (int)w->cols, gs, us, act);
  cuda_op_matmul(be, y, h, n, w, NULL);
}

/* Where act_matmul folds the activation, the gate and the add go into the same kernel's
 * epilogue (one launch instead of three ops, tmp left alone); elsewhere the three ops run
 * as the model would compose them, so the bits are the same by construction. */
void cuda_op_act_matmul_gated_add(ops_backend *be, float *y, float *tmp, float *h, const float *gate, const float *up,
                                  int64_t n, int64_t gs, int64_t us, int act, const float *g, int64_t g_stride,
                                  const ops_weight *w) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  size_t smem_max = 0;
  const uint8_t *W = act_fold_weight(be, ci, gate, up, n, gs, us, w, &rb, &smem_max);
  if (W) {
    act_fold_launch(ci, y, gate, up, n, gs, us, act, g, g_stride, W, w, rb, smem_max);
    return;
  }
  if (ci->err) return;
  cuda_op_act_matmul(be, tmp, h, gate, up, n, gs, us, act, w);
  cuda_op_mul_sigmoid(be, tmp, g, n, (int)w->rows, g_stride, 1);
  cuda_op_add(be, y, tmp, n * w->rows);
}

/* The group's weights and biases on the device (W, rb, bd) and the weights the grouped
 * launches leave to cuda_op_matmul (skip); false (error set) when a mirror fails. */
static bool group_weights(ops_backend *be, int count, const ops_weight *const *ws, const float *const *biases,
                          const uint8_t **W, int64_t *rb, const float **bd, int *skip) {
  for (int i = 0; i < count; i++) {
    W[i] = weight_dev(be, ws[i], &rb[i]);
    if (!W[i]) return false;
    const float *b = biases ? biases[i] : NULL;
    bd[i] = b ? (const float *)cuda_mirror(be, b, (size_t)ws[i]->rows * sizeof(float)) : NULL;
    if (b && !bd[i]) return false;
    /* Q4_K rows off 16-byte alignment (a weight given as a device pointer) take
     * cuda_op_matmul's GEMM path, as they would alone */
    skip[i] = ws[i]->type == ANNA_DTYPE_Q4_K && ((uintptr_t)W[i] & 15) != 0;
  }
  return true;
}

void cuda_op_matmul_group(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                          const ops_weight *const *ws, const float *const *biases) {
  const cuda_pnorm pn = cuda_norm_take(be, x, n); /* before cuda_impl_of, which would launch it */
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  if (count < 1 || count > OPS_GROUP_MAX) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: matmul group of %d weights (1..%d)", count, OPS_GROUP_MAX);
    return;
  }
  if (pn.x && count == 1) { /* a group of one, as cuda_op_matmul */
    ci->pnorm = pn;
    cuda_op_matmul(be, ys[0], x, n, ws[0], biases ? biases[0] : NULL);
    return;
  }
  const int64_t cols = ws[0]->cols;
  for (int i = 1; i < count; i++)
    if (ws[i]->cols != cols) {
      cuda_fail(ci, ANNA_EINVAL, "cuda: matmul group of %lld- and %lld-column weights", (long long)cols,
                (long long)ws[i]->cols);
      return;
    }
  /* prefill: one GEMM per weight, nothing to share; batch-invariant: each weight as alone (no
   * norm is deferred in that mode, and above one token none is) */
  if (n > MV_MAX_TOK || ci->batch_inv) {
    for (int i = 0; i < count; i++) cuda_op_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
    return;
  }
  const uint8_t *W[OPS_GROUP_MAX];
  const float *bd[OPS_GROUP_MAX];
  int64_t rb[OPS_GROUP_MAX];
  int skip[OPS_GROUP_MAX];
  if (!group_weights(be, count, ws, biases, W, rb, bd, skip)) return;
  const int q8 = ci->exact || ci->mv_variant == CUDA_MV_F32 ? 0 : ci->mv_variant == CUDA_MV_INT8_R4 ? 2 : 1;
  const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
  /* the token groups of cuda_op_matmul (8/4/2/1), each with all the weights */
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t left = n - t0;
    const float *xt = x + t0 * cols;
    float *yt[OPS_GROUP_MAX];
    for (int i = 0; i < count; i++) yt[i] = ys[i] + t0 * ws[i]->rows;
    if (left >= 8) group_tokens<8>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max), t0 += 8;
    else if (left >= 4) group_tokens<4>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max), t0 += 4;
    else if (left >= 2) group_tokens<2>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max), t0 += 2;
    else group_tokens<1>(ci, count, skip, yt, xt, W, rb, ws, bd, q8, smem_max, pn.x ? &pn : NULL), t0 += 1;
  }
  if (!cuda_check_launch(ci, "matvec group")) return;
  for (int i = 0; i < count; i++)
    if (skip[i]) cuda_op_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
}

void cuda_op_matmul_group_route(ops_backend *be, int count, float *const *ys, const float *x, int64_t n,
                                const ops_weight *const *ws, const float *const *biases, int route, int32_t *idx,
                                float *wts, int k, int renorm, const float *per_expert, int shared) {
  cuda_impl *ci = (cuda_impl *)be->impl; /* no cuda_impl_of yet: a deferred norm of x is the group's */
  if (shared >= count || (shared >= 0 && (shared == route || ws[shared]->rows != 1))) {
    cuda_fail(ci, ANNA_EINVAL, "cuda: matmul_group_route: shared entry %d is not a one-row weight of the group",
              shared);
    return;
  }
  const bool ok = route >= 0 && route < count && count <= OPS_GROUP_MAX && ws[route]->rows <= 256 && k >= 1 &&
                  k <= 32 && k <= ws[route]->rows && ci->route_count;
  /* one token chunk (the route runs once, after every row of it), 16-byte aligned rows */
  const bool one = n == 1 || n == 2 || n == 4 || n == 8;
  const float *sh = shared >= 0 ? ys[shared] : NULL;
  if (!ok || !one || ws[0]->cols % 8 != 0 || ci->batch_inv) {
    cuda_op_matmul_group(be, count, ys, x, n, ws, biases);
    if (route >= 0 && route < count)
      cuda_moe_route_shared(be, idx, wts, ys[route], n, (int)ws[route]->rows, k, renorm, per_expert, sh);
    return;
  }
  const cuda_pnorm pn = cuda_norm_take(be, x, n);
  ci = cuda_impl_of(be);
  if (ci->err) return;
  const int64_t cols = ws[0]->cols, E = ws[route]->rows;
  const uint8_t *W[OPS_GROUP_MAX];
  const float *bd[OPS_GROUP_MAX];
  int64_t rb[OPS_GROUP_MAX];
  int skip[OPS_GROUP_MAX];
  for (int i = 0; i < count; i++)
    if (ws[i]->cols != cols) {
      cuda_fail(ci, ANNA_EINVAL, "cuda: matmul group of %lld- and %lld-column weights", (long long)cols,
                (long long)ws[i]->cols);
      return;
    }
  if (!group_weights(be, count, ws, biases, W, rb, bd, skip)) return;
  const float *pe = per_expert ? (const float *)cuda_mirror(be, per_expert, (size_t)E * sizeof(float)) : NULL;
  if (per_expert && !pe) return;
  const int q8 = ci->exact || ci->mv_variant == CUDA_MV_F32 ? 0 : ci->mv_variant == CUDA_MV_INT8_R4 ? 2 : 1;
  const size_t smem_max = ci->mv_smem > MVQ8_SMEM_DEFAULT ? ci->mv_smem : MVQ8_SMEM_DEFAULT;
  const mv_route rt = {ys[route], idx, wts, pe, sh, ci->route_count, E, k, renorm, n};
  /* a weight run elsewhere (skip) cannot take part: its rows come after the launch */
  const int ri = skip[route] || (shared >= 0 && skip[shared]) ? -1 : route;
  bool routed;
  if (n == 8) routed = group_tokens<8>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, NULL, &rt, ri, shared);
  else if (n == 4) routed = group_tokens<4>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, NULL, &rt, ri, shared);
  else if (n == 2) routed = group_tokens<2>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, NULL, &rt, ri, shared);
  else
    routed = group_tokens<1>(ci, count, skip, ys, x, W, rb, ws, bd, q8, smem_max, pn.x ? &pn : NULL, &rt, ri, shared);
  if (!cuda_check_launch(ci, "matvec group")) return;
  for (int i = 0; i < count; i++)
    if (skip[i]) cuda_op_matmul(be, ys[i], x, n, ws[i], biases ? biases[i] : NULL);
  if (!routed) cuda_moe_route_shared(be, idx, wts, ys[route], n, (int)E, k, renorm, per_expert, sh);
}

static __global__ void k_embed(float *out, const uint8_t *T, int64_t rows, int64_t cols, int64_t row_bytes, int type,
                               const int32_t *ids, float scale) {
  cuda_pdl_enter(); /* launched by cuda_launch_pdl */
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float *o = out + t * cols;
  if (id < 0 || id >= rows) { /* the forward pass rejects such ids first; stay in bounds anyway */
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const uint8_t *row = T + (int64_t)id * row_bytes;
  if (cuda_float_type(type)) {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) o[i] = cuda_ldw(type, row, i) * scale;
    return;
  }
  for (int64_t u = threadIdx.x; u < cols / 32; u += blockDim.x) {
    float w[32];
    cuda_deq32(type, row, u, w);
    for (int j = 0; j < 32; j++) o[u * 32 + j] = w[j] * scale;
  }
}

void cuda_op_embed(ops_backend *be, float *out, const ops_weight *table, const int32_t *ids, int64_t n, float scale) {
  cuda_impl *ci = cuda_impl_of(be);
  if (ci->err || n <= 0) return;
  int64_t rb = 0;
  const uint8_t *T = weight_dev(be, table, &rb);
  if (!T) return;
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {
    const int64_t cnt = n - t0 < 65535 ? n - t0 : 65535;
    cuda_launch_pdl(ci, "embed", k_embed, (unsigned)cnt, 128, 0,
                out + t0 * table->cols, T, table->rows, table->cols, rb, table->type, ids + t0, scale);
  }
  cuda_check_launch(ci, "embed");
}
