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
 * Written so that GCC vectorises it (no libm call in the loop). */
static inline float exp_f(float x) {
    x = x < -87.33654f ? -87.33654f : (x > 88.37626f ? 88.37626f : x); /* 2^n stays a normal float */
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = {((int32_t)n + 127) << 23}; /* 2^n */
    return p * scale.f;
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
 * multiplied by q_scale, the attention's 1/sqrt(Dh), which saves a pass over q), v copied. cos, sin: (T, half) with half = rot_dim / 2; channel i < half pairs with i + half
 * (HF LLaMA rotate_half): o_i = x_i cos - x_{i+half} sin, o_{i+half} = x_{i+half} cos + x_i sin.
 * Channels from 2 half on (odd head dims) are copied.                     (Su et al. 2021) */
static inline void rotate_row(const float *restrict x, float *restrict o, const float *restrict c,
                              const float *restrict s, int64_t half, int64_t Dh, float sign, float scale) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        float x1 = scale * x[i], x2 = scale * x[i + half];
        o[i] = x1 * c[i] - sign * x2 * s[i];
        o[i + half] = x2 * c[i] + sign * x1 * s[i];
    }
    for (int64_t i = 2 * half; i < Dh; i++) o[i] = scale * x[i];
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
                        memcpy(o, x, (size_t)Dh * sizeof(float));
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
                        memcpy(o, g, (size_t)Dh * sizeof(float));
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
                memcpy(ov + ((b * KV + h) * T + t) * Dh, row + (H + KV + h) * Dh, (size_t)Dh * sizeof(float));
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
                memcpy(row + (H + KV + h) * Dh, dv + ((b * KV + h) * T + t) * Dh, (size_t)Dh * sizeof(float));
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
