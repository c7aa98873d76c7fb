/* Every decoder layer of a Llama-style model for one pure-decode step, in ONE native call.
 * A step that is one prefill segment runs here too: its M tokens are rows, each the one-row
 * decode at its position (one block table for all of them, table_stride 0), so the same
 * kernels as the per-op path and the same bits.
 *
 * A decode step of a 30-layer model runs about ten kernels per layer; called one by one from
 * Python each costs interpreter and dispatch time (a few microseconds per op, ~0.4 ms per
 * layer on a small CPU), which at batch 1 is a third of the step. Here the whole stack runs in
 * C with the same kernels the per-op path calls -- RMSNorm (rms_norm.c), the tiles products
 * (matvec.c), the rotary embedding and cache write (rope_kv.c), paged decode attention
 * (paged_attention.c) -- so their rounding is the per-op path's. The SiLU (exp256) is
 * exported as silu_mul_rows and the per-op lean MLP calls it too, so it matches; for one
 * float32 row of a float (tiles) product the product order (tiles here, the row-major
 * mat-vec there) may still differ in the last bits.
 *
 * Per layer, M decoding rows, hidden size D, H query / KVH key-value heads of size Dh:
 *
 *   x   = rms_norm(h) * norm1                         (M, D)
 *   qkv = x @ Wqkv^T [+ b]                            (M, (H + 2 KVH) Dh)
 *   [q, k per-head rms_norm (Qwen3)]
 *   q', k' = rope(q, k); cache[slot] = k', v          (M, H, Dh)
 *   a   = paged_attention(q', cache)                  (M, H * Dh)
 *   h  += a @ Wo^T [+ b]
 *   x   = rms_norm(h) * norm2
 *   g|u = x @ Wgu^T [+ b]                             (M, 2I)
 *   h  += (silu(g) * u) @ Wdown^T [+ b]
 *
 * The step is ONE OpenMP parallel region (team.h): the products and the attention are shared
 * by the team, thread 0 runs the norms, the rotary and cache write and the residual adds, and
 * the threads meet at team_sync between them -- a step wakes its workers once, not at each of
 * ~100 regions (libgomp sleeps and wakes them there once two threads of a process own pools).
 *
 * Every tensor is float32 (dtype 0) or bfloat16 (dtype 1, each op rounding to bf16 once, as
 * torch does). Each product's weight is either (N/8, K, 8) tiles of the dtype (code 0) or
 * quantized blocks (code 1 + format + 16 * layout: 1..8 q4_0/q4_1/q8_0/q5_0/q5_1/q4_k/q5_k/
 * q6_k in the GGUF layout, 17..19 q4_0/q4_1/q8_0 and 22..24 q4_k/q5_k/q6_k in the x8 layout,
 * quant/formats.py)
 * multiplied by qmatmul.c as they are, with a
 * float32 bias; a bf16 model rounds that product's float32 output to bf16 once -- what the
 * per-op path's QuantizedLinear computes. h is updated in place.
 */
#include "matvec.c"
#include "rms_norm.c"
#include "rope_kv.c"
#include "paged_attention.c"
#include "qmatmul.c"
#include "team.h"

typedef struct {
    const void *norm1, *norm2;            /* (D,) */
    const void *qkv_tiles, *qkv_bias;     /* (n_qkv/8, D, 8), (n_qkv,) or NULL */
    const void *q_norm, *k_norm;          /* (Dh,) per-head norms, or NULL */
    const void *o_tiles, *o_bias;         /* (D/8, H*Dh, 8) */
    const void *gu_tiles, *gu_bias;       /* (2I/8, D, 8) */
    const void *down_tiles, *down_bias;   /* (D/8, I, 8) */
    void *kv_cache;                       /* (2, KVH, NB, BS, Dh) */
    double eps1, eps2, head_eps, scale;
    int64_t window;                       /* 0: none */
    /* Per product: 0 tiles (above) of the dtype; 1 + qmatmul format (0 q4_0, 1 q4_1, 2 q8_0,
       3 q5_0, 4 q5_1, 5 q4_k, 6 q5_k, 7 q6_k) + 16 * layout (0 GGUF, 1 x8), the pointer then
       holding the (N, K/block values * block bytes) blocks and the bias pointer a float32
       bias; 255: output rows in parts of different formats (a fused q/k/v whose v is
       Q6_K...), the pointer holding their table (product()). */
    int32_t qkv_fmt, o_fmt, gu_fmt, down_fmt;
    int32_t q_variant;                    /* qmatmul's instruction-set variant */
} DecodeLayer;

static inline float silu_mul_f32(float g, float u) { return g / (1.f + expf(-g)) * u; }

/* out = silu(gate) * up over n values; bf16 rounds silu's result, then the product. */
static void silu_mul(int dtype, const void *gate, const void *up, void *out, int64_t n) {
    int64_t i = 0;
    if (dtype == 0) {
        const float *g = gate, *u = up;
        float *o = out;
        const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            __m256 x = _mm256_loadu_ps(g + i);
            __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, x))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
        }
        for (; i < n; i++) o[i] = silu_mul_f32(g[i], u[i]);
        return;
    }
    const uint16_t *g = gate, *u = up;
    uint16_t *o = out;
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 x = load_bf16x8(g + i);
        __m256 s = to_bf16_and_back(
            _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, x)))));
        store_bf16x8(o + i, _mm256_mul_ps(s, load_bf16x8(u + i)));
    }
    for (; i < n; i++) {
        float x = bf16_to_f32(g[i]);
        float s = bf16_to_f32(f32_to_bf16(x / (1.f + expf(-x))));
        o[i] = f32_to_bf16(s * bf16_to_f32(u[i]));
    }
}

/* silu(gate) * up for M rows of a fused gate|up product: row t holds its gate in
   gu[t * stride, + I) and its up in the next I values; out (M, I). The per-op path's lean MLP
   calls this too (native/decode_stack.py silu_mul), so a decoding row gets the same bits
   whichever path runs its step. Returns 0, or 2 on a bad dtype or shape. */
/* silu_mul_rows with the rows shared by `threads` threads (a prefill's M rows: each value is
   computed by the same code whichever thread takes its row, so the bits do not change). */
int silu_mul_rows_threads(int dtype, const void *gu, int64_t stride, void *out, int64_t M,
                          int64_t I, int threads) {
    if ((dtype != 0 && dtype != 1) || M < 0 || I < 0 || stride < 2 * I) return 2;
    const size_t el = dtype == 0 ? 4 : 2;
    if (threads < 1 || M * I < (1 << 15)) threads = 1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < M; t++) {
        const char *row = (const char *)gu + el * t * stride;
        silu_mul(dtype, row, row + el * I, (char *)out + el * t * I, I);
    }
    return 0;
}

int silu_mul_rows(int dtype, const void *gu, int64_t stride, void *out, int64_t M, int64_t I) {
    return silu_mul_rows_threads(dtype, gu, stride, out, M, I, 1);
}

/* h += y over n values (bf16: one rounding of the float sum, as torch's add). */
static void add_into(int dtype, void *h, const void *y, int64_t n) {
    int64_t i = 0;
    if (dtype == 0) {
        float *a = h;
        const float *b = y;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        for (; i < n; i++) a[i] += b[i];
        return;
    }
    uint16_t *a = h;
    const uint16_t *b = y;
    for (; i + 8 <= n; i += 8)
        store_bf16x8(a + i, _mm256_add_ps(load_bf16x8(a + i), load_bf16x8(b + i)));
    for (; i < n; i++) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static int norm(int dtype, const void *x, const void *w, void *out, int64_t N, int64_t H,
                double eps) {
    return dtype == 0 ? rms_norm_f32(x, w, out, N, H, H, (float)eps)
                      : rms_norm_bf16(x, w, out, N, H, H, (float)eps);
}

#define PRODUCT_PARTS 255  /* a product of quantized parts in different formats (product()) */

/* y (M, N) = x (M, K) @ W^T [+ bias] from tiles (code 0), blocks (code 1 + format + 16 layout)
   or parts (PRODUCT_PARTS: the weight pointer holds their table), by team t. `out32` is a
   float32 (M, N) scratch for a bf16 model's quantized products (rounded to y once).
   Returns 0, 1 (out of memory) or 2 (bad shapes or arguments), the same in every thread. */
static int product(const Team *t, int dtype, int code, int variant, const void *weight,
                   const void *x, const void *bias, void *y, int64_t N, int64_t K, int64_t M,
                   float *out32) {
    if (code <= 0)
        return dtype == 0 ? matvec_tiles_rows_f32_team(t, weight, x, bias, y, N, K, M)
                          : matvec_tiles_rows_bf16_team(t, weight, x, bias, y, N, K, M);
    float *out = dtype == 0 ? y : out32;
    int st = 0;
    if (code == PRODUCT_PARTS) {
        /* weight: int64 {n, then per part: code, rows, blocks, float32 bias or 0}; the parts'
           outputs side by side in y's rows */
        const int64_t *table = weight;
        int64_t col = 0;
        for (int64_t i = 0; i < table[0] && !st; i++) {
            const int64_t *part = table + 1 + 4 * i;
            const int c = (int)part[0];
            if (c <= 0 || c == PRODUCT_PARTS || col + part[1] > N) {
                st = 2;
                break;
            }
            st = qmatmul_team(t, (c - 1) % 16, (c - 1) / 16, variant, (const uint8_t *)part[2],
                              part[1], K, x, dtype, K, M, (const float *)part[3], out + col, N);
            col += part[1];
        }
        if (!st && col != N) st = 2;
    } else {
        st = qmatmul_team(t, (code - 1) % 16, (code - 1) / 16, variant, weight, N, K, x, dtype,
                          K, M, bias, out, N);
    }
    if (dtype == 1 && !st) {
        int64_t lo, hi;
        team_range(t, (M * N + 7) / 8, &lo, &hi);
        uint16_t *yb = y;
        for (int64_t i = 8 * lo; i < 8 * hi && i < M * N; i += 8) {
            if (i + 8 <= M * N)
                store_bf16x8(yb + i, _mm256_loadu_ps(out + i));
            else
                for (int64_t j = i; j < M * N; j++) yb[j] = f32_to_bf16(out[j]);
        }
        team_sync(t, 0);
    }
    return st == 0 ? 0 : st == 3 ? 1 : 2;
}

/* qkv's per-head norms (Qwen3), then the rotary embedding of q and k and the cache write: the
   single-threaded part of a layer between its products, run by thread 0 of the team while the
   others wait at the next team_sync. */
static int rope_and_store(int dtype, int kv_f16, const DecodeLayer *p, char *qkv,
                          const void *cos, const void *sin, const int64_t *slots, void *qr,
                          void *kr, int64_t M, int64_t H, int64_t KVH, int64_t Dh,
                          int64_t num_slots) {
    const size_t el = dtype == 0 ? 4 : 2;
    const int64_t n_qkv = (H + 2 * KVH) * Dh, q_size = H * Dh;
    if (p->q_norm) {
        for (int64_t t = 0; t < M; t++) {
            char *row = qkv + el * t * n_qkv;
            int st = norm(dtype, row, p->q_norm, row, H, Dh, p->head_eps);
            if (!st)
                st = norm(dtype, row + el * q_size, p->k_norm, row + el * q_size, KVH, Dh,
                          p->head_eps);
            if (st) return st;
        }
    }
    const char *k = qkv + el * q_size, *v = qkv + el * (q_size + KVH * Dh);
    if (kv_f16)
        return rope_kv_f32_f16kv((const float *)qkv, n_qkv, (const float *)k, (const float *)v,
                                 n_qkv, cos, sin, slots, qr, kr, p->kv_cache, M, H, KVH, Dh,
                                 num_slots);
    if (dtype == 0)
        return rope_kv_f32((const float *)qkv, n_qkv, (const float *)k, (const float *)v, n_qkv,
                           cos, sin, slots, qr, kr, p->kv_cache, M, H, KVH, Dh, num_slots);
    return rope_kv_bf16((const uint16_t *)qkv, n_qkv, (const uint16_t *)k, (const uint16_t *)v,
                        n_qkv, cos, sin, slots, qr, kr, p->kv_cache, M, H, KVH, Dh, num_slots);
}

/* dtype: 0 float32, 1 bfloat16, 2 float32 over a float16 KV cache.
   Returns 0, 2 on bad shapes, or for a failing kernel status + 10 * op + 100 * (layer + 1),
   op counting the layer's kernel calls from 1 and status 1 (out of memory), 2 (bad shapes) or
   3 (a slot or block id outside the cache).
   The whole step runs in ONE parallel region of `threads` (team.h): the products and the
   attention are shared by the team, the small ops run on thread 0 between team_syncs. */
int decode_stack(int dtype, const DecodeLayer *layers, int64_t L, void *h, const void *cos,
                 const void *sin, const int64_t *slots, const int32_t *tables,
                 int64_t table_stride, const int64_t *seq_lens, int64_t M, int64_t D,
                 int64_t H, int64_t KVH, int64_t Dh, int64_t I, int64_t NB, int64_t BS,
                 int64_t split_keys, void *scratch, int threads) {
    if (dtype < 0 || dtype > 2 || M < 1 || D % 8 || Dh % 16 || KVH < 1 || H % KVH)
        return 2;
    const int kv_f16 = dtype == 2; /* float32 compute over a float16 KV cache */
    if (kv_f16) dtype = 0;
    const size_t el = dtype == 0 ? 4 : 2;
    const int64_t n_qkv = (H + 2 * KVH) * Dh, q_size = H * Dh, num_slots = NB * BS;
    char *s = scratch;                           /* scratch regions, in elements of dtype: */
    void *x = s;                                 /* (M, D) */
    char *qkv = s + el * M * D;                  /* (M, n_qkv) */
    void *qr = qkv + el * M * n_qkv;             /* (M, H, Dh) */
    void *kr = (char *)qr + el * M * q_size;     /* (M, KVH, Dh) */
    void *att = (char *)kr + el * M * KVH * Dh;  /* (M, H * Dh) */
    void *o = (char *)att + el * M * q_size;     /* (M, D) */
    char *gu = (char *)o + el * M * D;           /* (M, 2I) */
    void *act = gu + el * M * 2 * I;             /* (M, I) */
    /* a bf16 model's quantized products land in float32 first: the widest one's rows */
    const int64_t widest = n_qkv > 2 * I ? (n_qkv > D ? n_qkv : D) : (2 * I > D ? 2 * I : D);
    float *out32 = dtype == 1 ? malloc(sizeof(float) * (size_t)(M * widest)) : NULL;
    if (dtype == 1 && !out32) return 1 + 100 + 10 * 2;
    TeamSync sync = {0};
    int result = 0;
    #pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        const Team t = team_of(&sync);
        const int lead = t.id == 0;
        int st = 0;
        for (int64_t l = 0; l < L && !st; l++) {
            const DecodeLayer *p = layers + l;
            int op = 0;
/* Op k of the layer: its status, the same in every thread, ends the step when nonzero. */
#define OP(CALL) do { op++; if ((st = (CALL))) st += 100 * (l + 1) + 10 * op; } while (0)
/* The same for an op only thread 0 runs (the others meet it at the sync). */
#define LEAD(CALL) OP(team_sync(&t, lead ? (CALL) : 0))
            LEAD(norm(dtype, h, p->norm1, x, M, D, p->eps1));
            if (!st)
                OP(product(&t, dtype, p->qkv_fmt, p->q_variant, p->qkv_tiles, x, p->qkv_bias,
                           qkv, n_qkv, D, M, out32));
            if (!st)
                LEAD(rope_and_store(dtype, kv_f16, p, qkv, cos, sin, slots, qr, kr, M, H, KVH,
                                    Dh, num_slots));
            if (!st && kv_f16)
                OP(paged_decode_f32_f16kv_team(&t, qr, p->kv_cache, tables, table_stride,
                                               seq_lens, att, M, H, KVH, Dh, NB, BS, p->window,
                                               (float)p->scale, 0.f, split_keys));
            else if (!st && dtype == 0)
                OP(paged_decode_f32_team(&t, qr, p->kv_cache, tables, table_stride, seq_lens,
                                         att, M, H, KVH, Dh, NB, BS, p->window, (float)p->scale,
                                         0.f, split_keys));
            else if (!st)
                OP(paged_decode_bf16_team(&t, qr, p->kv_cache, tables, table_stride, seq_lens,
                                          att, M, H, KVH, Dh, NB, BS, p->window,
                                          (float)p->scale, 0.f, split_keys));
            if (!st)
                OP(product(&t, dtype, p->o_fmt, p->q_variant, p->o_tiles, att, p->o_bias, o, D,
                           q_size, M, out32));
            if (!st) {
                if (lead) add_into(dtype, h, o, M * D);
                LEAD(norm(dtype, h, p->norm2, x, M, D, p->eps2));
            }
            if (!st)
                OP(product(&t, dtype, p->gu_fmt, p->q_variant, p->gu_tiles, x, p->gu_bias, gu,
                           2 * I, D, M, out32));
            if (!st) {
                int64_t lo, hi;
                team_range(&t, M, &lo, &hi);
                for (int64_t r = lo; r < hi; r++)
                    silu_mul_rows(dtype, gu + el * r * 2 * I, 2 * I, (char *)act + el * r * I,
                                  1, I);
                team_sync(&t, 0);
                OP(product(&t, dtype, p->down_fmt, p->q_variant, p->down_tiles, act,
                           p->down_bias, o, D, I, M, out32));
            }
            /* h += down: thread 0, which also runs the next layer's first norm (the region's
               end orders it before the caller reads h) */
            if (!st && lead) add_into(dtype, h, o, M * D);
#undef LEAD
#undef OP
        }
        if (lead) result = st;
    }
    free(out32);
    return result;
}
