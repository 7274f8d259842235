/* Fused fp32 CPU kernels for the elementwise work of a training step (see nas/fused_cpu.py).
 *
 * Each kernel does in one pass over memory what PyTorch's eager ops do in 3-6 passes: on a
 * 2-core machine these passes are bound by memory bandwidth and by per-op overhead, not by
 * arithmetic. Plain C99 + OpenMP, no PyTorch headers (compiles in well under a second); all
 * tensors are contiguous float32 buffers whose layout each function states. Every kernel is
 * checked against the PyTorch reference path in tests/test_fused_cpu.py.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#define PARALLEL_MIN 32768 /* elements below which a kernel runs on one thread (fork/join costs more) */

/* exp(x) for float: Cephes expf (range reduction by ln 2, degree-6 polynomial), ~1 ulp.
 * Written so that GCC vectorises it (no libm call in the loop). EXP_MIN, EXP_MAX: 2^n stays a normal float;
 * EXP_REDUCED(x, n): r = x - n ln 2 in two parts; EXP_POLYNOMIAL(r): exp(r) for |r| <= ln 2 / 2. The macros take a
 * float or a vector (exp16 below): one set of constants for both. */
#define EXP_MIN (-87.33654f)
#define EXP_MAX 88.37626f
#define LOG2_E 1.44269504088896341f
#define EXP_REDUCED(x, n) ((x) - (n) * 0.693359375f + (n) * 2.12194440e-4f)
#define EXP_POLYNOMIAL(r)                                                                                              \
    ((((((1.9875691500e-4f * (r) + 1.3981999507e-3f) * (r) + 8.3334519073e-3f) * (r) + 4.1665795894e-2f) * (r) +     \
       1.6666665459e-1f) * (r) + 5.0000001201e-1f) * (r) * (r) + (r) + 1.0f)
static inline float exp_f(float x) {
    x = x < EXP_MIN ? EXP_MIN : (x > EXP_MAX ? EXP_MAX : x);
    float n = floorf(x * LOG2_E + 0.5f), r = EXP_REDUCED(x, n);
    union { int32_t i; float f; } scale = {((int32_t)n + 127) << 23}; /* 2^n */
    return EXP_POLYNOMIAL(r) * scale.f;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

/* ------------------------------------------------------------------ SwiGLU gating
 * h = silu(g) * u, silu(g) = g sigmoid(g)                         (Shazeer 2020)
 * backward: du = dh silu(g);  dg = dh u sigmoid(g) (1 + g (1 - sigmoid(g)))
 * All buffers hold n floats. */
/* [lo, hi): this thread's share of n items, in equal contiguous chunks */
static inline void thread_range(int64_t n, int64_t *lo, int64_t *hi) {
    int64_t nthr = omp_get_num_threads(), tid = omp_get_thread_num(), chunk = (n + nthr - 1) / nthr;
    *lo = tid * chunk < n ? tid * chunk : n;
    *hi = *lo + chunk < n ? *lo + chunk : n;
}

static void swiglu_forward_range(const float *restrict g, const float *restrict u, float *restrict h,
                                 int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float x = g[i];
        h[i] = x * sigmoid_f(x) * u[i];
    }
}

static void swiglu_backward_range(const float *restrict dh, const float *restrict g, const float *restrict u,
                                  float *restrict dg, float *restrict du, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) {
        float x = g[i], d = dh[i];
        float s = sigmoid_f(x);
        du[i] = d * x * s;
        dg[i] = d * u[i] * s * (1.0f + x * (1.0f - s));
    }
}

void swiglu_forward(const float *restrict g, const float *restrict u, float *restrict h, int64_t n, int threads) {
#pragma omp parallel num_threads(threads) if (n >= PARALLEL_MIN)
    {
        int64_t lo, hi;
        thread_range(n, &lo, &hi);
        swiglu_forward_range(g, u, h, lo, hi);
    }
}

void swiglu_backward(const float *restrict dh, const float *restrict g, const float *restrict u,
                     float *restrict dg, float *restrict du, int64_t n, int threads) {
#pragma omp parallel num_threads(threads) if (n >= PARALLEL_MIN)
    {
        int64_t lo, hi;
        thread_range(n, &lo, &hi);
        swiglu_backward_range(dh, g, u, dg, du, lo, hi);
    }
}

/* ------------------------------------------------------------------ RMSNorm
 * y = x r w,  r = (mean(x^2) + eps)^(-1/2) per row              (Zhang & Sennrich 2019)
 * x, y: (rows, D); w: (D); rstd: (rows), saved for the backward. */
void rmsnorm_forward(const float *restrict x, const float *restrict w, float *restrict y, float *restrict rstd,
                     int64_t rows, int64_t D, float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * D >= PARALLEL_MIN)
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * D;
        float *yi = y + i * D;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < D; j++) ss += xi[j] * xi[j];
        float r = 1.0f / sqrtf(ss / (float)D + eps);
        rstd[i] = r;
#pragma omp simd
        for (int64_t j = 0; j < D; j++) yi[j] = xi[j] * r * w[j];
    }
}

/* backward: dx = r (dy w) - x r^3 (sum_j dy_j w_j x_j) / D;  dw = sum_rows dy x r.
 * partial: (threads, D) scratch for the per-thread dw sums; dw: (D). */
void rmsnorm_backward(const float *restrict dy, const float *restrict x, const float *restrict w,
                      const float *restrict rstd, float *restrict dx, float *restrict dw, float *restrict partial,
                      int64_t rows, int64_t D, int threads) {
    int used = 1;
#pragma omp parallel num_threads(threads) if (rows * D >= PARALLEL_MIN)
    {
        int tid = omp_get_thread_num(), nthr = omp_get_num_threads();
        float *acc = partial + (int64_t)tid * D;
        for (int64_t j = 0; j < D; j++) acc[j] = 0.0f;
        int64_t lo, hi;
        thread_range(rows, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            const float *dyi = dy + i * D, *xi = x + i * D;
            float *dxi = dx + i * D;
            float r = rstd[i], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < D; j++) dot += dyi[j] * w[j] * xi[j];
            float c = r * r * r * dot / (float)D;
#pragma omp simd
            for (int64_t j = 0; j < D; j++) {
                dxi[j] = r * dyi[j] * w[j] - c * xi[j];
                acc[j] += dyi[j] * xi[j] * r;
            }
        }
        if (tid == 0) used = nthr;
    }
    for (int64_t j = 0; j < D; j++) {
        float s = 0.0f;
        for (int t = 0; t < used; t++) s += partial[(int64_t)t * D + j];
        dw[j] = s;
    }
}

/* ------------------------------------------------------------------ RoPE on the fused QKV projection
 * qkv: (B, T, 3, H, Dh), the d -> 3d projection's output; out: (3, B, H, T, Dh): q and k rotated (q also
 * multiplied by q_scale, the attention's 1/sqrt(Dh), which saves a pass over q), v copied. cos, sin: (T, half)
 * with half = rot_dim / 2; channel i < half pairs with i + half
 * (HF LLaMA rotate_half): o_i = x_i cos - x_{i+half} sin, o_{i+half} = x_{i+half} cos + x_i sin.
 * Channels from 2 half on (odd head dims) are copied.                     (Su et al. 2021) */
static inline void rotate_row_any(const float *restrict x, float *restrict o, const float *restrict c,
                                  const float *restrict s, int64_t half, int64_t Dh, float sign, float scale) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        float x1 = scale * x[i], x2 = scale * x[i + half];
        o[i] = x1 * c[i] - sign * x2 * s[i];
        o[i + half] = x2 * c[i] + sign * x1 * s[i];
    }
    for (int64_t i = 2 * half; i < Dh; i++) o[i] = scale * x[i];
}

/* STMT with dh the head dim Dh, a compile-time constant at the small head dims (8-32): their rows are so short
 * that a loop with run-time bounds, or a library memcpy call, costs about as much as the work itself */
#define WITH_CONSTANT_HEAD_DIM(Dh, STMT)                                                                            \
    switch (Dh) {                                                                                                  \
    case 8: { const int64_t dh = 8; STMT; } break;                                                                 \
    case 12: { const int64_t dh = 12; STMT; } break;                                                               \
    case 16: { const int64_t dh = 16; STMT; } break;                                                               \
    case 24: { const int64_t dh = 24; STMT; } break;                                                               \
    case 32: { const int64_t dh = 32; STMT; } break;                                                               \
    default: { const int64_t dh = (Dh); STMT; }                                                                    \
    }

static inline void rotate_row(const float *restrict x, float *restrict o, const float *restrict c,
                              const float *restrict s, int64_t half, int64_t Dh, float sign, float scale) {
    if (2 * half == Dh) {
        WITH_CONSTANT_HEAD_DIM(Dh, rotate_row_any(x, o, c, s, dh / 2, dh, sign, scale))
    } else {
        rotate_row_any(x, o, c, s, half, Dh, sign, scale);
    }
}

/* o = x over Dh floats */
static inline void copy_row(float *restrict o, const float *restrict x, int64_t Dh) {
    WITH_CONSTANT_HEAD_DIM(Dh, memcpy(o, x, (size_t)dh * sizeof(float)))
}

void rope_qkv_forward(const float *restrict qkv, const float *restrict cos_t, const float *restrict sin_t,
                      float *restrict out, int64_t B, int64_t T, int64_t H, int64_t Dh, int64_t half, float q_scale,
                      int threads) {
    /* one token's 3 H Dh projections are read in order (contiguous reads keep the prefetcher on; measured
     * ~1.5x faster in a training step than reading head by head with a stride of 3 H Dh floats) */
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (3 * B * T * H * Dh >= PARALLEL_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t s = 0; s < 3; s++)
                for (int64_t h = 0; h < H; h++) {
                    const float *x = qkv + (((b * T + t) * 3 + s) * H + h) * Dh;
                    float *o = out + (((s * B + b) * H + h) * T + t) * Dh;
                    if (s == 2)
                        copy_row(o, x, Dh);
                    else
                        rotate_row(x, o, cos_t + t * half, sin_t + t * half, half, Dh, 1.0f, s == 0 ? q_scale : 1.0f);
                }
}

/* backward: the inverse rotation (its transpose) of dq (times q_scale), dk and a copy of dv, each (B, H, T, Dh),
 * written into one (B, T, 3, H, Dh) gradient of qkv. */
void rope_qkv_backward(const float *restrict dq, const float *restrict dk, const float *restrict dv,
                       const float *restrict cos_t, const float *restrict sin_t, float *restrict grad,
                       int64_t B, int64_t T, int64_t H, int64_t Dh, int64_t half, float q_scale, int threads) {
#pragma omp parallel for collapse(3) schedule(static) num_threads(threads) if (3 * B * T * H * Dh >= PARALLEL_MIN)
    for (int64_t s = 0; s < 3; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                const float *src = s == 0 ? dq : (s == 1 ? dk : dv);
                for (int64_t t = 0; t < T; t++) {
                    const float *g = src + ((b * H + h) * T + t) * Dh;
                    float *o = grad + (((b * T + t) * 3 + s) * H + h) * Dh;
                    if (s == 2)
                        copy_row(o, g, Dh);
                    else
                        rotate_row(g, o, cos_t + t * half, sin_t + t * half, half, Dh, -1.0f, s == 0 ? q_scale : 1.0f);
                }
            }
}

/* Grouped-query attention (GQA): qkv (B, T, (H + 2 KV) Dh), H query heads then KV key heads then KV value heads
 * per token; out: q (B, H, T, Dh) followed by k and v (B, KV, T, Dh) each. With KV = H this is the layout above;
 * multi-head layers keep using rope_qkv_forward / _backward. */
void rope_qkv_grouped_forward(const float *restrict qkv, const float *restrict cos_t, const float *restrict sin_t,
                              float *restrict out, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh,
                              int64_t half, float q_scale, int threads) {
    int64_t W = (H + 2 * KV) * Dh;
    float *oq = out, *ok = out + B * H * T * Dh, *ov = ok + B * KV * T * Dh;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (B * T * W >= PARALLEL_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const float *row = qkv + (b * T + t) * W, *c = cos_t + t * half, *s = sin_t + t * half;
            for (int64_t h = 0; h < H; h++)
                rotate_row(row + h * Dh, oq + ((b * H + h) * T + t) * Dh, c, s, half, Dh, 1.0f, q_scale);
            for (int64_t h = 0; h < KV; h++)
                rotate_row(row + (H + h) * Dh, ok + ((b * KV + h) * T + t) * Dh, c, s, half, Dh, 1.0f, 1.0f);
            for (int64_t h = 0; h < KV; h++)
                copy_row(ov + ((b * KV + h) * T + t) * Dh, row + (H + KV + h) * Dh, Dh);
        }
}

/* backward of rope_qkv_grouped_forward: dq (B, H, T, Dh), dk and dv (B, KV, T, Dh) into one (B, T, (H + 2 KV) Dh)
 * gradient of qkv, each token's row written in order. */
void rope_qkv_grouped_backward(const float *restrict dq, const float *restrict dk, const float *restrict dv,
                               const float *restrict cos_t, const float *restrict sin_t, float *restrict grad,
                               int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh, int64_t half, float q_scale,
                               int threads) {
    int64_t W = (H + 2 * KV) * Dh;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (B * T * W >= PARALLEL_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            float *row = grad + (b * T + t) * W;
            const float *c = cos_t + t * half, *s = sin_t + t * half;
            for (int64_t h = 0; h < H; h++)
                rotate_row(dq + ((b * H + h) * T + t) * Dh, row + h * Dh, c, s, half, Dh, -1.0f, q_scale);
            for (int64_t h = 0; h < KV; h++)
                rotate_row(dk + ((b * KV + h) * T + t) * Dh, row + (H + h) * Dh, c, s, half, Dh, -1.0f, 1.0f);
            for (int64_t h = 0; h < KV; h++)
                copy_row(row + (H + KV + h) * Dh, dv + ((b * KV + h) * T + t) * Dh, Dh);
        }
}

/* ------------------------------------------------------------------ causal softmax of one query block, in place
 * p: (N, Tb, r0 + Tb) scores of queries r0 .. r0 + Tb - 1 over keys 0 .. r0 + Tb - 1 (the blocked attention's
 * blocks, nas/model.py). Query r0 + i sees keys 0 .. r0 + i: those get softmax(scores), the rest 0. Replaces
 * adding a -inf mask and a softmax over the whole row (which also exponentiates the masked entries). */
static void causal_softmax_row(float *restrict row, int64_t valid, int64_t width) {
    float m = row[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < valid; j++) m = row[j] > m ? row[j] : m;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < valid; j++) {
        float e = exp_f(row[j] - m);
        row[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < valid; j++) row[j] *= inv;
    for (int64_t j = valid; j < width; j++) row[j] = 0.0f;
}

void causal_softmax_(float *restrict p, int64_t N, int64_t Tb, int64_t r0, int threads) {
    int64_t width = r0 + Tb, rows = N * Tb;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * width >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) causal_softmax_row(p + r * width, r0 + r % Tb + 1, width);
}

/* ------------------------------------------------------------------ causal attention, one pass per head
 * P = softmax(q k^T + causal mask) row by row (q already times 1/sqrt(Dh)), O = P V   (Vaswani et al. 2017)
 * backward (the softmax's Jacobian, as in FlashAttention-2, Dao 2023, section 2.2):
 *   dP = dO V^T;  D_i = sum_j P_ij dP_ij = dO_i . O_i;  dS = P (dP - D);  dQ = dS K;  dK = dS^T Q;  dV = P^T dO
 * Only keys j <= i are touched (the masked half of the scores is never computed), 16 at a time (one AVX-512
 * vector, two AVX2 or four NEON ones: GCC's vector extension). The forward takes 16 queries at once, query l in
 * lane l: the row max, the exp, the row sum and the Dh sums of P V are then lane-wise, with no sums across
 * lanes. P itself is not kept: the forward keeps each row's max m_i and 1 / l_i, l_i = sum_j exp(S_ij - m_i),
 * and the backward recomputes P_ij = exp(S_ij - m_i) / l_i (FlashAttention's recomputation, Dao et al. 2022,
 * section 3.1): on 2 cores, writing P's triangles out (1.6 MB a layer at the cpu proxy's B 4, H 12, T 128) and
 * reading them back from beyond the cache cost more than the scores and exps again (m and 1 / l rather than
 * m + log l: a scalar log per row cost as much as the rest of the forward's stores). The backward's first pass
 * takes 16 queries at once too, in two loops over the keys (P; then dS and dQ, whose Dh sums stay in registers),
 * and transposes each block's P and dS into per-thread lower triangles (hot in its cache); its second pass takes
 * 16 keys at once, dK and dV in registers over the rows that see them. At Dh = 8 this replaces batched matmuls
 * whose inner dimension is 8 (where a GEMM library spends most of its time packing), the separate softmax passes
 * over scores too large for the cache, and the layout copies. The head dim is a compile-time constant (8, 12, 16,
 * 24 or 32: one copy each).
 * Grouped-query attention (KV < H key/value heads, query head h reading key/value head h / (H / KV), HF's
 * repeat_kv order) is the same loop: a task owns a key/value head and runs its H / KV query heads in turn on one
 * thread, accumulating their dK, dV without races.
 * Layouts: q, dq (B, H, T, Dh); k, v, dk, dv (B, KV, T, Dh); out, d_out (B, T, H, Dh) (the output
 * projection's input as it is); stats, when not NULL, (B, H, 2, T): each query row's max m_i, then 1 / l_i. */
#define CHUNK 16
typedef float vec16 __attribute__((vector_size(CHUNK * sizeof(float))));
typedef float vec8 __attribute__((vector_size(8 * sizeof(float))));
typedef float vec4 __attribute__((vector_size(4 * sizeof(float))));
typedef int32_t vec16i __attribute__((vector_size(CHUNK * sizeof(int32_t))));
static const vec16i LANES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

static inline vec16 load16(const float *p) { vec16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, vec16 v) { memcpy(p, &v, sizeof v); }
/* the lanes' sum as a tree (a sequential sum would be a 16-add dependency chain) */
static inline float sum16(vec16 v) {
    vec8 a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (char *)&v + sizeof a, sizeof b);
    a += b;
    vec4 c, d;
    memcpy(&c, &a, sizeof c);
    memcpy(&d, (char *)&a + sizeof c, sizeof d);
    c += d;
    return (c[0] + c[2]) + (c[1] + c[3]);
}
/* a in the lanes where keep is set (all bits), b elsewhere */
static inline vec16 blend16(vec16i keep, vec16 a, vec16 b) {
    return (vec16)(((vec16i)a & keep) | ((vec16i)b & ~keep));
}
/* x with the lanes of keys >= n (key c + l in lane l) replaced by fill: no scalar stores beside vector loads */
static inline vec16 keep_before(vec16 x, int64_t c, int64_t n, float fill) {
    return blend16(LANES < (int32_t)(n - c), x, (vec16){0} + fill);
}
static inline int64_t triangle(int64_t i) { return i * (i + 1) / 2; }

static inline vec16 max16(vec16 a, vec16 b) { return blend16(a > b, a, b); }

/* exp_f in each lane, in registers */
static inline vec16 exp16(vec16 x) {
    const vec16 lo = (vec16){0} + EXP_MIN, hi = (vec16){0} + EXP_MAX;
    x = blend16(x < lo, lo, blend16(x > hi, hi, x));
    vec16 t = x * LOG2_E + 0.5f;
    vec16i ni = __builtin_convertvector(t, vec16i); /* truncation; floor below */
    ni += (vec16i)(__builtin_convertvector(ni, vec16) > t); /* -1 where t < 0 is no integer: truncation went up */
    vec16 n = __builtin_convertvector(ni, vec16), r = EXP_REDUCED(x, n);
    return EXP_POLYNOMIAL(r) * (vec16)((ni + 127) << 23); /* times 2^n */
}

/* the 16 x 16 block m (row r: m[r]) transposed in place: four rounds of swapping the off-diagonal w x w sub-blocks
 * of every 2w x 2w block (w = 8, 4, 2, 1), each a two-vector shuffle per row pair */
#if defined(__GNUC__) && !defined(__clang__)
#define SWAP_BLOCKS(w)                                                                                               \
    do {                                                                                                             \
        const vec16i low = {MASK_LOW_##w}, high = {MASK_HIGH_##w};                                                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < CHUNK; r++) if (!(r & (w))) {                                   \
            vec16 a = m[r], b = m[r + (w)];                                                                          \
            m[r] = __builtin_shuffle(a, b, low);                                                                     \
            m[r + (w)] = __builtin_shuffle(a, b, high);                                                              \
        }                                                                                                            \
    } while (0)
/* lane c of the row pair (a, b) at distance w: low takes a[c] where bit w of c is clear, else b[c - w] (index 16 +
 * c - w); high takes a[c + w] where it is clear, else b[c] */
#define MASK_LOW_8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define MASK_HIGH_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define MASK_LOW_4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define MASK_HIGH_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define MASK_LOW_2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define MASK_HIGH_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define MASK_LOW_1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define MASK_HIGH_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
static inline void transpose16(vec16 m[CHUNK]) {
    SWAP_BLOCKS(8);
    SWAP_BLOCKS(4);
    SWAP_BLOCKS(2);
    SWAP_BLOCKS(1);
}
#else
static inline void transpose16(vec16 m[CHUNK]) {
    for (int r = 0; r < CHUNK; r++)
        for (int c = r + 1; c < CHUNK; c++) {
            float t = m[r][c];
            m[r][c] = m[c][r];
            m[c][r] = t;
        }
}
#endif

/* x with the lanes l < t replaced by fill (query i0 + l sees key i0 + t only when l >= t) */
static inline vec16 keep_from(vec16 x, int64_t t, float fill) {
    return blend16(LANES >= (int32_t)t, x, (vec16){0} + fill);
}

/* the (Dh, Tp) transpose of x (T rows of Dh, row j at x + j stride), zero past T */
static inline void transpose_padded(const float *restrict x, int64_t stride, float *restrict x_t, int64_t T,
                                    int64_t Tp, int64_t Dh) {
    for (int64_t d = 0; d < Dh; d++) {
        for (int64_t j = 0; j < T; j++) x_t[d * Tp + j] = x[j * stride + d];
        for (int64_t j = T; j < Tp; j++) x_t[d * Tp + j] = 0.0f;
    }
}

/* transpose_padded, its loops at a constant head dim where the kernels have one */
static void transpose_head(const float *restrict x, int64_t stride, float *restrict x_t, int64_t T, int64_t Tp,
                           int64_t Dh) {
    WITH_CONSTANT_HEAD_DIM(Dh, transpose_padded(x, stride, x_t, T, Tp, dh))
}

/* rows c .. c + 15 (those below T) of x (T, Dh) += the transpose of cols (Dh vectors, channel d of those 16 rows);
 * add: 0 stores instead of adding. In groups of 16 channels, each a transpose16 */
static inline void columns_to_rows(const vec16 *restrict cols, float *restrict x, int64_t stride, int64_t c,
                                   int64_t T, int64_t Dh, int add) {
    for (int64_t d0 = 0; d0 < Dh; d0 += CHUNK) {
        int64_t width = Dh - d0 < CHUNK ? Dh - d0 : CHUNK;
        vec16 tile[CHUNK];
        for (int64_t d = 0; d < CHUNK; d++) tile[d] = d < width ? cols[d0 + d] : (vec16){0};
        transpose16(tile); /* row r: row c + r's channels d0 .. d0 + width - 1 */
        for (int64_t r = 0; r < CHUNK && c + r < T; r++) {
            float *restrict row = x + (c + r) * stride + d0;
            if (add)
                for (int64_t d = 0; d < width; d++) row[d] += tile[r][d];
            else
                memcpy(row, &tile[r], (size_t)width * sizeof(float));
        }
    }
}

/* a lower triangle's tile of queries i0 .. i0 + rows - 1 and keys j0 .. j0 + 15 from a block of 16 queries s (key
 * j's 16 queries at s + 16 j), transposed into the triangle's rows (row i at triangle(i)).
 * Each row takes 16 keys at once, so on the diagonal (j0 = i0) a row's store runs past its end into the next
 * rows' first keys: the caller stores the diagonal tile first and then the tiles left of it, which rewrite those
 * keys (in the first block, i0 = 0, the later rows of the diagonal tile itself do). A store that would run past
 * the block's last row (its last row; any row when T < 16) stores only the row's own keys. */
static inline void write_rows_tile(float *restrict rows_out, const float *restrict s, int64_t i0, int64_t rows,
                                   int64_t j0) {
#if !defined(__AVX512F__) /* 16-float vectors in two or four registers: the tile transpose spills; copy by lanes */
    for (int64_t l = 0; l < rows; l++) {
        float *row = rows_out + triangle(i0 + l) + j0;
        int64_t width = j0 == i0 ? l + 1 : CHUNK; /* on the diagonal, the row's own keys only */
        for (int64_t c = 0; c < width; c++) row[c] = s[(j0 + c) * CHUNK + l];
    }
    return;
#endif
    vec16 tile[CHUNK];
    for (int r = 0; r < CHUNK; r++) tile[r] = load16(s + (j0 + r) * CHUNK);
    transpose16(tile); /* row l: query i0 + l over keys j0 .. j0 + 15 */
    int64_t end = triangle(i0 + rows);
    for (int64_t l = 0; l < rows; l++) {
        float *row = rows_out + triangle(i0 + l) + j0;
        if (j0 == i0 && triangle(i0 + l) + j0 + CHUNK > end)
            memcpy(row, &tile[l], (size_t)(l + 1) * sizeof(float)); /* keys i0 .. i0 + l */
        else
            store16(row, tile[l]);
    }
}

/* the triangle's rows i0 .. keys - 1 from the block s: the diagonal tile, then the ones left of it (see
 * write_rows_tile) */
static inline void write_rows(float *restrict rows_out, float *restrict s, int64_t i0, int64_t keys) {
    for (int64_t j = keys; j < i0 + CHUNK; j++) store16(s + j * CHUNK, (vec16){0}); /* keys past T */
    write_rows_tile(rows_out, s, i0, keys - i0, i0);
    for (int64_t j0 = 0; j0 < i0; j0 += CHUNK) write_rows_tile(rows_out, s, i0, keys - i0, j0);
}

#define ATTENTION_FIXED(DH)                                                                                      \
    /* sum_d x[d] y[d] over the 16 lanes (y broadcast), in two chains of FMAs (half the latency of one) */      \
    static inline vec16 dot16_##DH(const vec16 *restrict x, const float *restrict y) {                          \
        vec16 even = {0}, odd = {0};                                                                             \
        _Pragma("GCC unroll 16") for (int d = 0; d < DH; d += 2) even += x[d] * y[d], odd += x[d + 1] * y[d + 1];\
        return even + odd;                                                                                       \
    }                                                                                                            \
                                                                                                                 \
    /* one query head, 16 queries at a time, query l of the block in lane l: no sums across lanes. q_t (DH, Tp) \
     * the head's queries transposed; k, v (T, DH) its key/value head; s: Tp x 16 floats, the block's scores   \
     * (key j's 16 in s + 16 j), then their exp; stats (2, T) or NULL: the rows' max and 1 / sum for the backward */\
    static void attention_head_forward_##DH(const float *restrict q_t, const float *restrict k,                 \
                                            const float *restrict v, float *restrict out, int64_t out_stride,   \
                                            float *restrict stats, float *restrict s, int64_t T, int64_t Tp) {  \
        for (int64_t i0 = 0; i0 < T; i0 += CHUNK) {                                                              \
            int64_t keys = i0 + CHUNK < T ? i0 + CHUNK : T;                                                      \
            vec16 qd[DH], top = (vec16){0} - INFINITY;                                                           \
            _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) qd[d] = load16(q_t + d * Tp + i0);             \
            for (int64_t j = 0; j < keys; j++) {                                                                 \
                vec16 sj = dot16_##DH(qd, k + j * DH);                                                           \
                if (j >= i0) sj = keep_from(sj, j - i0, -INFINITY);                                              \
                store16(s + j * CHUNK, sj);                                                                      \
                top = max16(top, sj);                                                                            \
            }                                                                                                    \
            for (int64_t j = 0; j < keys; j++) { /* unnormalised: O is scaled once, below */                    \
                float *restrict sj = s + j * CHUNK;                                                              \
                _Pragma("omp simd") for (int l = 0; l < CHUNK; l++) sj[l] = exp_f(sj[l] - top[l]);               \
            }                                                                                                    \
            for (int64_t j = i0; j < keys; j++) /* exactly 0 above the diagonal (exp_f clamps to ~1e-38) */     \
                store16(s + j * CHUNK, keep_from(load16(s + j * CHUNK), j - i0, 0.0f));                          \
            vec16 acc[DH], total = {0};                                                                          \
            _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) acc[d] = (vec16){0};                           \
            for (int64_t j = 0; j < keys; j++) {                                                                 \
                vec16 e = load16(s + j * CHUNK);                                                                 \
                total += e;                                                                                      \
                _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) acc[d] += e * v[j * DH + d];               \
            }                                                                                                    \
            vec16 inv = 1.0f / total;                                                                            \
            _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) acc[d] *= inv;                                 \
            columns_to_rows(acc, out, out_stride, i0, T, DH, 0); /* row l: query i0 + l's output */              \
            if (stats)                                                                                           \
                for (int64_t l = 0; l < keys - i0; l++) stats[i0 + l] = top[l], stats[T + i0 + l] = inv[l];     \
        }                                                                                                        \
    }                                                                                                            \
                                                                                                                 \
    /* one query head: writes its dq, adds its share of dK, dV to dk, dv (T, DH). First blocks of 16 queries, query  \
     * l in lane l as in the forward (no sums across lanes): P recomputed from the scores and stats, dS, dQ in \
     * registers; each block's P and dS (sp, sds: Tp x 16 floats, key j's 16 at + 16 j) transposed in 16 x 16   \
     * tiles into the rows of the lower triangles p, ds (plus CHUNK floats each). Then key chunks, 16 keys in the  \
     * lanes (dK, dV in registers over the rows that see them, added to dk, dv once a chunk through a tile        \
     * transpose). q_t, g_t (DH, Tp): the head's queries and output gradients transposed */                    \
    static void attention_head_backward_##DH(const float *restrict d_out, const float *restrict out,             \
                                             int64_t stride, const float *restrict q, const float *restrict q_t, \
                                             const float *restrict g_t, const float *restrict k,                 \
                                             const float *restrict v, const float *restrict stats,               \
                                             float *restrict dq, float *restrict dk, float *restrict dv,         \
                                             float *restrict sp, float *restrict sds, float *restrict p,         \
                                             float *restrict ds, int64_t T, int64_t Tp) {                        \
        for (int64_t i0 = 0; i0 < T; i0 += CHUNK) {                                                              \
            int64_t keys = i0 + CHUNK < T ? i0 + CHUNK : T;                                                      \
            float m_block[CHUNK] = {0}, inv_block[CHUNK] = {0}, d_block[CHUNK] = {0}; /* past T: 0, as q, dO */ \
            for (int64_t l = 0; l < keys - i0; l++) { /* D_i = sum_j P_ij dP_ij = dO_i . O_i (FlashAttention-2) */\
                const float *restrict g = d_out + (i0 + l) * stride, *restrict o = out + (i0 + l) * stride;     \
                float D = 0.0f;                                                                                  \
                for (int d = 0; d < DH; d++) D += g[d] * o[d];                                                   \
                d_block[l] = D, m_block[l] = stats[i0 + l], inv_block[l] = stats[T + i0 + l];                    \
            }                                                                                                    \
            vec16 qd[DH], gd[DH], dqd[DH], M = load16(m_block), inv = load16(inv_block), D = load16(d_block);    \
            _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) {                                              \
                qd[d] = load16(q_t + d * Tp + i0), gd[d] = load16(g_t + d * Tp + i0), dqd[d] = (vec16){0};       \
            }                                                                                                    \
            for (int64_t j = 0; j < keys; j++) { /* P first: two loops hold half the vectors one would */       \
                vec16 pj = exp16(dot16_##DH(qd, k + j * DH) - M) * inv; /* S as the forward computed it */        \
                store16(sp + j * CHUNK, j >= i0 ? keep_from(pj, j - i0, 0.0f) : pj); /* queries before j: 0 */   \
            }                                                                                                    \
            for (int64_t j = 0; j < keys; j++) {                                                                 \
                vec16 dsj = load16(sp + j * CHUNK) * (dot16_##DH(gd, v + j * DH) - D);                           \
                store16(sds + j * CHUNK, dsj);                                                                   \
                _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) dqd[d] += dsj * k[j * DH + d];             \
            }                                                                                                    \
            columns_to_rows(dqd, dq, DH, i0, T, DH, 0); /* row l: query i0 + l's dQ */                           \
            write_rows(p, sp, i0, keys);                                                                         \
            write_rows(ds, sds, i0, keys);                                                                       \
        }                                                                                                        \
        for (int64_t c = 0; c < T; c += CHUNK) { /* rows i >= c see keys c ..; below c + 15 only some of them */ \
            vec16 dkc[DH], dvc[DH];                                                                              \
            _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) dkc[d] = (vec16){0};                           \
            for (int64_t i = c; i < T; i++) {                                                                    \
                vec16 dsc = load16(ds + triangle(i) + c);                                                        \
                if (i < c + CHUNK - 1) dsc = keep_before(dsc, c, i + 1, 0.0f);                                   \
                _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) dkc[d] += dsc * q[i * DH + d];             \
            }                                                                                                    \
            columns_to_rows(dkc, dk, DH, c, T, DH, 1);                                                           \
            _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) dvc[d] = (vec16){0};                           \
            for (int64_t i = c; i < T; i++) {                                                                    \
                vec16 pc = load16(p + triangle(i) + c);                                                          \
                if (i < c + CHUNK - 1) pc = keep_before(pc, c, i + 1, 0.0f);                                     \
                const float *restrict g = d_out + i * stride;                                                    \
                _Pragma("GCC unroll 16") for (int d = 0; d < DH; d++) dvc[d] += pc * g[d];                       \
            }                                                                                                    \
            columns_to_rows(dvc, dv, DH, c, T, DH, 1);                                                           \
        }                                                                                                        \
    }

ATTENTION_FIXED(8)
ATTENTION_FIXED(12)
ATTENTION_FIXED(16)
ATTENTION_FIXED(24)
ATTENTION_FIXED(32)

typedef void (*head_forward_fn)(const float *, const float *, const float *, float *, int64_t, float *, float *,
                                int64_t, int64_t);
typedef void (*head_backward_fn)(const float *, const float *, int64_t, const float *, const float *, const float *,
                                 const float *, const float *, const float *, float *, float *, float *, float *,
                                 float *, float *, float *, int64_t, int64_t);

/* the per-head kernels for this head dim, NULL where there is none */
static head_forward_fn head_forward(int64_t Dh) {
    return Dh == 8 ? attention_head_forward_8 : Dh == 12 ? attention_head_forward_12
         : Dh == 16 ? attention_head_forward_16 : Dh == 24 ? attention_head_forward_24
         : Dh == 32 ? attention_head_forward_32 : NULL;
}
static head_backward_fn head_backward(int64_t Dh) {
    return Dh == 8 ? attention_head_backward_8 : Dh == 12 ? attention_head_backward_12
         : Dh == 16 ? attention_head_backward_16 : Dh == 24 ? attention_head_backward_24
         : Dh == 32 ? attention_head_backward_32 : NULL;
}

/* 1 when causal_attention_forward/backward have a kernel for this head dim */
int causal_attention_supports(int64_t Dh) { return head_forward(Dh) != NULL; }

/* 1 when this build holds a vec16 in one register (AVX-512): the attention kernels' 16-lane tiles and 16x16
   transposes were written for it; with 8-float registers (AVX2) each vec16 is two and the transposes spill */
int attention_vectors_in_registers(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

static inline int64_t padded(int64_t T) { return (T + CHUNK - 1) / CHUNK * CHUNK; }

/* workspace: threads x attention_workspace(T, Dh) floats, one slice per thread */
int64_t attention_workspace(int64_t T, int64_t Dh) {
    int64_t forward = (Dh + CHUNK) * padded(T), backward = 2 * (Dh + CHUNK) * padded(T) + 2 * (triangle(T) + CHUNK);
    return forward > backward ? forward : backward;
}

/* both passes: parallel over (batch, key/value head), each task owning its key/value head and its H / KV query
 * heads; the head dim must be one causal_attention_supports accepts (the Python wrapper checks) */
void causal_attention_forward(const float *restrict q, const float *restrict k, const float *restrict v,
                              float *restrict out, float *restrict stats, float *restrict workspace, int64_t B,
                              int64_t H, int64_t KV, int64_t T, int64_t Dh, int threads) {
    int64_t Tp = padded(T), group = H / KV;
    head_forward_fn kernel = head_forward(Dh);
#pragma omp parallel num_threads(threads) if (B * KV > 1 && B * H * triangle(T) * Dh >= PARALLEL_MIN)
    {
        float *work = workspace + omp_get_thread_num() * attention_workspace(T, Dh);
        float *q_t = work, *scores = work + Dh * Tp;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < B * KV; task++) {
            int64_t b = task / KV, kv = task % KV;
            for (int64_t h = kv * group; h < (kv + 1) * group; h++) {
                int64_t n = b * H + h;
                transpose_head(q + n * T * Dh, Dh, q_t, T, Tp, Dh);
                kernel(q_t, k + task * T * Dh, v + task * T * Dh, out + (b * T * H + h) * Dh, H * Dh,
                       stats ? stats + 2 * n * T : NULL, scores, T, Tp);
            }
        }
    }
}

void causal_attention_backward(const float *restrict d_out, const float *restrict out, const float *restrict q,
                               const float *restrict k, const float *restrict v, const float *restrict stats,
                               float *restrict dq, float *restrict dk, float *restrict dv, float *restrict workspace,
                               int64_t B, int64_t H, int64_t KV, int64_t T, int64_t Dh, int threads) {
    int64_t Tp = padded(T), group = H / KV;
    head_backward_fn kernel = head_backward(Dh);
#pragma omp parallel num_threads(threads) if (B * KV > 1 && B * H * triangle(T) * Dh >= PARALLEL_MIN)
    {
        float *work = workspace + omp_get_thread_num() * attention_workspace(T, Dh);
        float *q_t = work, *g_t = q_t + Dh * Tp, *sp = g_t + Dh * Tp, *sds = sp + CHUNK * Tp, *p = sds + CHUNK * Tp;
        float *ds = p + triangle(T) + CHUNK;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < B * KV; task++) {
            int64_t b = task / KV, kv = task % KV;
            memset(dk + task * T * Dh, 0, sizeof(float) * T * Dh);
            memset(dv + task * T * Dh, 0, sizeof(float) * T * Dh);
            for (int64_t h = kv * group; h < (kv + 1) * group; h++) {
                int64_t n = b * H + h, at = (b * T * H + h) * Dh;
                transpose_head(q + n * T * Dh, Dh, q_t, T, Tp, Dh);
                transpose_head(d_out + at, H * Dh, g_t, T, Tp, Dh);
                kernel(d_out + at, out + at, H * Dh, q + n * T * Dh, q_t, g_t, k + task * T * Dh,
                       v + task * T * Dh, stats + 2 * n * T, dq + n * T * Dh, dk + task * T * Dh, dv + task * T * Dh,
                       sp, sds, p, ds, T, Tp);
            }
        }
    }
}
