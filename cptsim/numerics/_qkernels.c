/* cptsim's CPU quantizer kernels: one pass over the tensor where the eager PyTorch form takes six to nine.
 *
 * Built on first use by cptsim/numerics/ckernels.py (cc -O3 -march=native -fopenmp -ffp-contract=off -fno-math-errno
 * -fno-trapping-math; no fast-math, which would change results; -fno-trapping-math lets floorf vectorise) and called
 * through ctypes on the raw float32 storage of dense CPU tensors. No PyTorch headers: the file compiles in a fraction
 * of a second with the system C compiler, and the OpenMP runtime it links (libgomp.so.1) is the one torch has
 * already loaded, so the threads are torch's.
 *
 * The arithmetic is the eager quantizers' (cptsim/numerics/quant.py), operation for operation in float32 and in the same
 * order, so round-to-nearest is bit-identical to fake_quant and stochastic rounding computes the same formula on
 * different random bytes:
 *   cpt_fq_rtn, cpt_fq_rtn_rows: out = (clamp(round_half_even(x * inv + zp), 0, qmax) - zp) * scale
 *   cpt_fq_sr:  out = (clamp(floor((x * mulk + byte + addc) * invk), 0, qmax) - zp) * scale
 *               with mulk = 256/scale, addc = 256*zp + 1/2, invk = 1/256 and byte uniform on 0..255,
 * scale, zp and inv = 1/scale from the range as quant.choose_qparams computes them.
 * The bytes come from Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
 * generator of cuRAND and of PyTorch on CUDA), counter = (the index of a 16-byte block, a stream number), key = 64
 * bits drawn from torch's generator (once per call, or once per backward pass with one stream per call: see
 * ckernels.fake_quant_sr): every element's byte is a function of (key, stream, index) alone, so the result does not
 * depend on the thread count and a run resumed from torch's RNG state draws the same bytes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define PAR_MIN 32768 /* below this many elements one thread is faster than waking the team */

static inline void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0];
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
}

static inline void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) { k[0] += 0x9E3779B9u; k[1] += 0xBB67AE85u; }
        philox_round(c, k);
    }
    memcpy(out, c, sizeof c);
}

/* Exposed for the known-answer test (Random123's kat_vectors). */
void cpt_philox4x32_10(const uint32_t *ctr, const uint32_t *key, uint32_t *out) { philox4x32_10(ctr, key, out); }

/* Philox4x32-10 of 64 consecutive blocks at once: with AVX2 intrinsics where the CPU has them, else written lane by
 * lane so that the compiler vectorises across blocks as well as it can. Chunk c (1024 elements) takes blocks
 * 64c..64c+63, counter (b low, b high, stream, 0); its 256 words are W[64*j + l] = word j of block 64c+l, and
 * element 256*t + w of the chunk takes byte t (bits 8t..8t+7) of W[w]: four planes of 256 elements, so the element
 * loop is shifts, masks and int->float conversions that vectorise. This layout is the definition of the stream;
 * cpt_uniform_bytes and cpt_fq_sr share it.
 */
#define LANES 64
#define CHUNK (16 * LANES)

#if defined(__AVX2__)
#include <immintrin.h>

/* The 32x32->64 products of eight lanes by one multiplier, split into high and low words (vpmuludq on the even and
 * the odd lanes, then blends): Philox's mulhilo for eight blocks at once. */
static inline void mulhilo8(__m256i a, __m256i m, __m256i *hi, __m256i *lo) {
    __m256i pe = _mm256_mul_epu32(a, m);
    __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
    *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

/* chunk_words with AVX2, word for word the same (test_ckernels checks the words against the scalar Philox): gcc
 * vectorises the portable loop below poorly (64-bit lanes and repacking), and it cost as much as the rest of the
 * stochastic-rounding pass. Two groups of eight blocks are interleaved so that one group's multiplies hide the
 * other's latency. */
static void chunk_words(int64_t chunk, const uint32_t key[2], uint32_t stream, uint32_t w[CHUNK / 4]) {
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const uint64_t b0 = (uint64_t)chunk * LANES; /* a multiple of 64: the low word of b0 + l never carries */
    for (int g = 0; g < LANES; g += 16) {
        __m256i a0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)(b0 + g)), lane);
        __m256i e0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)(b0 + g + 8)), lane);
        __m256i a1 = _mm256_set1_epi32((int)(uint32_t)(b0 >> 32)), e1 = a1;
        __m256i a2 = _mm256_set1_epi32((int)stream), e2 = a2, a3 = _mm256_setzero_si256(), e3 = a3;
        uint32_t k0 = key[0], k1 = key[1];
        for (int r = 0; r < 10; r++) {
            if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
            const __m256i K0 = _mm256_set1_epi32((int)k0), K1 = _mm256_set1_epi32((int)k1);
            __m256i ah0, al0, ah1, al1, eh0, el0, eh1, el1;
            mulhilo8(a0, m0, &ah0, &al0);
            mulhilo8(e0, m0, &eh0, &el0);
            mulhilo8(a2, m1, &ah1, &al1);
            mulhilo8(e2, m1, &eh1, &el1);
            a0 = _mm256_xor_si256(_mm256_xor_si256(ah1, a1), K0);
            e0 = _mm256_xor_si256(_mm256_xor_si256(eh1, e1), K0);
            a2 = _mm256_xor_si256(_mm256_xor_si256(ah0, a3), K1);
            e2 = _mm256_xor_si256(_mm256_xor_si256(eh0, e3), K1);
            a1 = al1; e1 = el1; a3 = al0; e3 = el0;
        }
        _mm256_storeu_si256((__m256i *)(w + 0 * LANES + g), a0);
        _mm256_storeu_si256((__m256i *)(w + 0 * LANES + g + 8), e0);
        _mm256_storeu_si256((__m256i *)(w + 1 * LANES + g), a1);
        _mm256_storeu_si256((__m256i *)(w + 1 * LANES + g + 8), e1);
        _mm256_storeu_si256((__m256i *)(w + 2 * LANES + g), a2);
        _mm256_storeu_si256((__m256i *)(w + 2 * LANES + g + 8), e2);
        _mm256_storeu_si256((__m256i *)(w + 3 * LANES + g), a3);
        _mm256_storeu_si256((__m256i *)(w + 3 * LANES + g + 8), e3);
    }
}
#else
static void chunk_words(int64_t chunk, const uint32_t key[2], uint32_t stream, uint32_t w[CHUNK / 4]) {
    uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
    const uint64_t b0 = (uint64_t)chunk * LANES;
    for (int l = 0; l < LANES; l++) {
        uint64_t b = b0 + (uint64_t)l;
        c0[l] = (uint32_t)b; c1[l] = (uint32_t)(b >> 32); c2[l] = stream; c3[l] = 0u;
    }
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        for (int l = 0; l < LANES; l++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * c0[l];
            uint64_t p1 = (uint64_t)0xCD9E8D57u * c2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1; c3[l] = (uint32_t)p0; c0[l] = n0; c2[l] = n2;
        }
    }
    memcpy(w + 0 * LANES, c0, sizeof c0);
    memcpy(w + 1 * LANES, c1, sizeof c1);
    memcpy(w + 2 * LANES, c2, sizeof c2);
    memcpy(w + 3 * LANES, c3, sizeof c3);
}
#endif

/* The bytes cpt_fq_sr adds, element by element (for the tests' uniformity and independence checks). */
void cpt_uniform_bytes(uint8_t *out, int64_t n, uint32_t k0, uint32_t k1, uint32_t stream) {
    const uint32_t key[2] = {k0, k1};
    const int64_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        uint32_t w[CHUNK / 4];
        chunk_words(c, key, stream, w);
        for (int64_t e = c * CHUNK; e < n && e < (c + 1) * CHUNK; e++) {
            int64_t k = e - c * CHUNK;
            out[e] = (uint8_t)(w[k % (CHUNK / 4)] >> (8 * (k / (CHUNK / 4))));
        }
    }
}

static inline float clampf(float v, float hi) { return v < 0.0f ? 0.0f : (v > hi ? hi : v); } /* NaN stays NaN */

/* quant.choose_qparams, in the same float32 operations: the range widened to hold 0, scale = (hi - lo) / qmax (at
 * least 1e-12), zp = clamp(round(-lo / scale), 0, qmax); inv = 1 / scale as fake_quant's scale.reciprocal(). */
static inline void qparams(float lo, float hi, float qmax, float *inv, float *zp, float *scale) {
    lo = lo > 0.0f ? 0.0f : lo; /* torch.clamp(lo, max=0) and (hi, min=0); a NaN range stays NaN */
    hi = hi < 0.0f ? 0.0f : hi;
    float s = (hi - lo) / qmax;
    s = s < 1e-12f ? 1e-12f : s;
    float z = nearbyintf(-lo / s);
    *zp = clampf(z, qmax);
    *scale = s;
    *inv = 1.0f / s;
}

static inline void rtn_span(const float *restrict x, float *restrict out, int64_t len, float inv, float zp, float qmax,
                            float scale) {
    for (int64_t i = 0; i < len; i++) {
        float v = x[i] * inv;
        v = v + zp;
        v = nearbyintf(v);
        v = clampf(v, qmax);
        v = v - zp;
        out[i] = v * scale;
    }
}

/* The min, max and "has a NaN" of x[0..len): exact (min and max do not round). Written so that it vectorises
 * (vminps, vmaxps, vcmpunordps) without a data-dependent exit; a NaN is skipped by the comparisons and reported in
 * *bad. */
static inline void minmax_span(const float *x, int64_t len, float *plo, float *phi, int *bad) {
    float l = x[0], h = x[0];
    int nan = 0;
    int64_t i = 0;
#if defined(__AVX2__)
    /* gcc does not vectorise a float min/max reduction without fast-math; (v < l ? v : l) is vminps(v, l) */
    __m256 vl = _mm256_set1_ps(l), vh = vl, vbad = _mm256_setzero_ps();
    for (; i + 8 <= len; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        vl = _mm256_min_ps(v, vl);
        vh = _mm256_max_ps(v, vh);
        vbad = _mm256_or_ps(vbad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float tl[8], th[8];
    _mm256_storeu_ps(tl, vl);
    _mm256_storeu_ps(th, vh);
    for (int k = 0; k < 8; k++) {
        l = tl[k] < l ? tl[k] : l;
        h = th[k] > h ? th[k] : h;
    }
    nan = _mm256_movemask_ps(vbad) != 0;
#endif
    for (; i < len; i++) {
        float v = x[i];
        l = v < l ? v : l;
        h = v > h ? v : h;
        nan |= v != v;
    }
    *plo = l;
    *phi = h;
    *bad = nan;
}

/* torch.aminmax of a whole tensor: a NaN anywhere makes both NaN. Per 4096-element chunk, the chunks' partials
 * reduced across threads. */
static void minmax(const float *x, int64_t n, int threads, float *plo, float *phi) {
    float lo = x[0], hi = x[0];
    int nan = 0;
    const int64_t chunk = 4096, nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n >= PAR_MIN) \
    reduction(min : lo) reduction(max : hi) reduction(| : nan)
    for (int64_t c = 0; c < nc; c++) {
        float l, h;
        int bad;
        minmax_span(x + c * chunk, n - c * chunk < chunk ? n - c * chunk : chunk, &l, &h, &bad);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
        nan |= bad;
    }
    if (nan) lo = hi = NAN;
    *plo = lo;
    *phi = hi;
}

/* Round-to-nearest with one range [lo, hi] (quant.fake_quant_per_tensor). */
void cpt_fq_rtn(const float *x, float *out, int64_t n, float lo, float hi, float qmax, int threads) {
    float inv, zp, scale;
    qparams(lo, hi, qmax, &inv, &zp, &scale);
    const int64_t chunk = 4096, nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n >= PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        int64_t i0 = c * chunk, len = n - i0 < chunk ? n - i0 : chunk;
        rtn_span(x + i0, out + i0, len, inv, zp, qmax, scale);
    }
}

/* An activation in training, in one call (cptsim.numerics.layers' CPU path): its batch range (torch.aminmax; written to
 * batch[0], batch[1]), the layer's running range for eval updated as layers._QuantMixin._input_range does with
 * torch ops -- first batch: copied; later: r = r * m, then r + (1 - m) * v as add_(v, alpha=1 - m), which torch's
 * CPU kernel computes as one fused multiply-add -- and the round-to-nearest pass of cpt_fq_rtn with the batch range.
 * run_lo, run_hi: the layer's float32 act_lo / act_hi buffers; count: its int64 act_count. */
void cpt_fq_rtn_tracked(const float *x, float *out, int64_t n, float qmax, float *run_lo, float *run_hi,
                        int64_t *count, float m, float one_minus_m, float *batch, int threads) {
    float lo, hi;
    minmax(x, n, threads, &lo, &hi);
    batch[0] = lo;
    batch[1] = hi;
    if (*count == 0) {
        *run_lo = lo;
        *run_hi = hi;
    } else {
        *run_lo = fmaf(one_minus_m, lo, *run_lo * m);
        *run_hi = fmaf(one_minus_m, hi, *run_hi * m);
    }
    *count += 1;
    cpt_fq_rtn(x, out, n, lo, hi, qmax, threads);
}

/* Round-to-nearest with one min/max range per row of a (rows, len) tensor: a weight's output channels
 * (quant.fake_quant_per_channel with axis 0). With ``codes`` (cpt_fq_rows_codes) also, from the same rounded level k
 * of each element, the int8 code k - 128, the row's sum of codes, and its scale and zero point. */
static void rtn_rows(const float *x, float *out, int8_t *codes, int32_t *rowsum, float *scale_out, float *zp_out,
                     int64_t rows, int64_t len, float qmax, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * len >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * len;
        float *restrict o = out + r * len;
        float lo, hi;
        int bad;
        minmax_span(xr, len, &lo, &hi, &bad);
        if (bad) lo = hi = NAN; /* torch.aminmax: a NaN anywhere makes the range NaN */
        float inv, zp, scale;
        qparams(lo, hi, qmax, &inv, &zp, &scale);
        if (!codes) {
            rtn_span(xr, o, len, inv, zp, qmax, scale);
            continue;
        }
        int8_t *restrict c = codes + r * len;
        int32_t sum = 0;
        for (int64_t i = 0; i < len; i++) { /* rtn_span's operations, the level k kept on the way */
            float v = xr[i] * inv;
            v = v + zp;
            v = nearbyintf(v);
            v = clampf(v, qmax);
            int32_t k = (int32_t)v - 128;
            c[i] = (int8_t)k;
            sum += k;
            v = v - zp;
            o[i] = v * scale;
        }
        rowsum[r] = sum;
        scale_out[r] = scale;
        zp_out[r] = zp;
    }
}

void cpt_fq_rtn_rows(const float *x, float *out, int64_t rows, int64_t len, float qmax, int threads) {
    rtn_rows(x, out, NULL, NULL, NULL, NULL, rows, len, qmax, threads);
}

static inline void sr_span(const float *restrict x, float *restrict out, const uint32_t *restrict w, int64_t len,
                           int sh, float mulk, float addc, float invk, float qmax, float zp, float scale) {
    for (int64_t j = 0; j < len; j++) {
        float v = x[j] * mulk;
        v = v + (float)(int32_t)((w[j] >> sh) & 255u);
        v = v + addc;
        v = v * invk;
        v = floorf(v);
        v = clampf(v, qmax);
        v = v - zp;
        out[j] = v * scale;
    }
}

/* Stochastic rounding with one range [lo, hi] (quant.fake_quant_stochastic: the error's own min/max); with ``codes``
 * (cpt_fq_sr_codes) also the int8 code k - 128 of each element's level k. */
static inline void sr_codes_span(const float *restrict x, float *restrict out, int8_t *restrict codes,
                                 const uint32_t *restrict w, int64_t len, int sh, float mulk, float addc, float invk,
                                 float qmax, float zp, float scale);

static void sr_pass(const float *x, float *out, int8_t *codes, int64_t n, float lo, float hi, float qmax, uint32_t k0,
                    uint32_t k1, uint32_t stream, int threads) {
    float inv, zp, scale;
    qparams(lo, hi, qmax, &inv, &zp, &scale);
    (void)inv;
    const float k = 256.0f, mulk = k / scale, addc = zp * k + 0.5f, invk = 1.0f / k;
    const uint32_t key[2] = {k0, k1};
    const int64_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n >= PAR_MIN)
    for (int64_t c = 0; c < nc; c++) {
        uint32_t w[CHUNK / 4];
        chunk_words(c, key, stream, w);
        const int64_t i0 = c * CHUNK, m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (int t = 0; t < 4; t++) {
            const int64_t p0 = (int64_t)t * (CHUNK / 4);
            if (p0 >= m) break;
            const int64_t len = m - p0 < CHUNK / 4 ? m - p0 : CHUNK / 4;
            if (codes)
                sr_codes_span(x + i0 + p0, out + i0 + p0, codes + i0 + p0, w, len, 8 * t, mulk, addc, invk, qmax, zp,
                              scale);
            else
                sr_span(x + i0 + p0, out + i0 + p0, w, len, 8 * t, mulk, addc, invk, qmax, zp, scale);
        }
    }
}

void cpt_fq_sr(const float *x, float *out, int64_t n, float lo, float hi, float qmax, uint32_t k0, uint32_t k1,
               uint32_t stream, int threads) {
    sr_pass(x, out, NULL, n, lo, hi, qmax, k0, k1, stream, threads);
}

/* Stochastic rounding with the tensor's own range (quant.fake_quant_stochastic: torch.aminmax, then the pass). */
void cpt_fq_sr_auto(const float *x, float *out, int64_t n, float qmax, uint32_t k0, uint32_t k1, uint32_t stream,
                    int threads) {
    float lo, hi;
    minmax(x, n, threads, &lo, &hi);
    cpt_fq_sr(x, out, n, lo, hi, qmax, k0, k1, stream, threads);
}

/* The range alone (for the tests: the same as torch.aminmax). */
void cpt_minmax(const float *x, int64_t n, float *lohi, int threads) { minmax(x, n, threads, lohi, lohi + 1); }

/* Exact integer GEMMs (cptsim.numerics.exact_gemm). The int8 codes k - 128 of a fake-quantized q = (k - zp) * s,
 * b <= 8 bits, rows x cols dense: q * inv + (zp + 0.5) is within 1e-4 of k + 0.5 > 0, so truncation gives k. One
 * (inv, zpa = zp + 0.5) for all rows (per_row = 0) or one per row. */
void cpt_codes(const float *q, int8_t *out, int64_t rows, int64_t cols, const float *inv, const float *zpa,
               int per_row, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * cols >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float iv = inv[per_row ? r : 0], za = zpa[per_row ? r : 0];
        const float *restrict s = q + r * cols;
        int8_t *restrict d = out + r * cols;
        for (int64_t c = 0; c < cols; c++) d[c] = (int8_t)((int32_t)(s[c] * iv + za) - 128);
    }
}

/* The epilogue of an exact integer GEMM: y[i, c] = (float)(p[i, c] + r[i] * o[c] + u[c]) * s[c] (+ b[c]), the
 * bracket in int32 (exact: the caller bounds it), then one rounding to float32, one scaling, one bias add. */
void cpt_int_epilogue(const int32_t *p, float *y, int64_t rows, int64_t cols, const int32_t *r, const int32_t *o,
                      const int32_t *u, const float *s, const float *b, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * cols >= PAR_MIN)
    for (int64_t i = 0; i < rows; i++) {
        const int32_t ri = r[i];
        const int32_t *restrict pi = p + i * cols;
        float *restrict yi = y + i * cols;
        if (b) {
            for (int64_t c = 0; c < cols; c++) yi[c] = (float)(pi[c] + ri * o[c] + u[c]) * s[c] + b[c];
        } else {
            for (int64_t c = 0; c < cols; c++) yi[c] = (float)(pi[c] + ri * o[c] + u[c]) * s[c];
        }
    }
}

/* A quantized weight for the exact int8 path in one call per row (cptsim.numerics.exact_gemm.weight_codes): out bit
 * for bit cpt_fq_rtn_rows's, and the codes, row sums, scales and zero points (rtn_rows). Codes row-major (rows,
 * len); cpt_transpose_i8 lays them out as _int_mm's right operand. */
void cpt_fq_rows_codes(const float *x, float *out, int8_t *codes, int32_t *rowsum, float *scale_out, float *zp_out,
                       int64_t rows, int64_t len, float qmax, int threads) {
    rtn_rows(x, out, codes, rowsum, scale_out, zp_out, rows, len, qmax, threads);
}

/* dst (cols, rows) = src (rows, cols)^T for int8, in 64 x 64 tiles (torch's strided int8 copy walks the destination
 * element by element: ~8 ms for a 10000 x 650 weight's codes here). */
void cpt_transpose_i8(const int8_t *src, int8_t *dst, int64_t rows, int64_t cols, int threads) {
    const int64_t T = 64;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows * cols >= PAR_MIN)
    for (int64_t r0 = 0; r0 < rows; r0 += T) {
        for (int64_t c0 = 0; c0 < cols; c0 += T) {
            int64_t r1 = r0 + T < rows ? r0 + T : rows, c1 = c0 + T < cols ? c0 + T : cols;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) dst[c * rows + r] = src[r * cols + c];
        }
    }
}

/* sr_span's operations with the level k's code written beside each element (the exact path's wgrad operand). */
static inline void sr_codes_span(const float *restrict x, float *restrict out, int8_t *restrict codes,
                                 const uint32_t *restrict w, int64_t len, int sh, float mulk, float addc, float invk,
                                 float qmax, float zp, float scale) {
    for (int64_t j = 0; j < len; j++) {
        float v = x[j] * mulk;
        v = v + (float)(int32_t)((w[j] >> sh) & 255u);
        v = v + addc;
        v = v * invk;
        v = floorf(v);
        v = clampf(v, qmax);
        codes[j] = (int8_t)((int32_t)v - 128);
        v = v - zp;
        out[j] = v * scale;
    }
}

/* cpt_fq_sr and the codes of the same levels (the same range, key, stream and operations: out is bit for bit
 * cpt_fq_sr's). */
void cpt_fq_sr_codes(const float *x, float *out, int8_t *codes, int64_t n, float lo, float hi, float qmax,
                     uint32_t k0, uint32_t k1, uint32_t stream, int threads) {
    sr_pass(x, out, codes, n, lo, hi, qmax, k0, k1, stream, threads);
}
