/*
 * Reduce kernels: dst[i] = dst[i] (op) src[i] for every dtype x op, the same with two
 * sources (dst[i] = a[i] (op) b[i]: the first step of a reduction into a buffer that
 * holds nothing yet, which would otherwise be a copy and then a pass), and in-place
 * scaling.
 *
 * Plain loops over restrict pointers that the compiler vectorises; on x86-64 each
 * kernel is also built for x86-64-v3 (AVX2, FMA, F16C) and picked at load time, so one
 * build runs anywhere and is fast where it can be. float16 and bfloat16 are widened to
 * float32 for the arithmetic and rounded back once per step. bool is uint8 with
 * Sum/Max = OR and Min/Product = AND. Integer overflow wraps, as in numpy.
 * Cost: one read of src, one read and one write of dst; memory-bound above L2. The
 * two-source form reads a and b and writes dst once: a copy's worth less than copying a
 * into dst and reducing b into it.
 */
#include "context.h"
#include <string.h>

#define KERNEL HVDL_TARGET_CLONES

typedef _Float16 f16_t;

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);   /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#define SUM(a, b) ((a) + (b))
#define PROD(a, b) ((a) * (b))
#define MIN(a, b) ((b) < (a) ? (b) : (a))
#define MAX(a, b) ((b) > (a) ? (b) : (a))
#define OR(a, b) ((a) | (b))
#define AND(a, b) ((a) & (b))

/* One kernel per (type, op); W/N widen and narrow for the half types. */
#define KERN(NAME, T, F, W, N)                                               \
    KERNEL static void NAME(T *restrict d, const T *restrict s, int64_t n) { \
        for (int64_t i = 0; i < n; i++) d[i] = N(F(W(d[i]), W(s[i])));       \
    }                                                                        \
    KERN2(NAME, T, F, W, N)
#define KERN2(NAME, T, F, W, N)                                                           \
    KERNEL static void NAME##_to(T *restrict d, const T *restrict a, const T *restrict b, \
                                 int64_t n) {                                             \
        for (int64_t i = 0; i < n; i++) d[i] = N(F(W(a[i]), W(b[i])));                    \
    }
#define ID(x) (x)
#define TO_F32(x) ((float)(x))
#define TO_F16(x) ((f16_t)(x))

#define KERNS4(P, T, W, N)        \
    KERN(P##_sum, T, SUM, W, N)   \
    KERN(P##_prod, T, PROD, W, N) \
    KERN(P##_min, T, MIN, W, N)   \
    KERN(P##_max, T, MAX, W, N)

/* 32- and 64-bit signed Sum and Product run in the unsigned type of the same width,
 * where overflow is defined to wrap (signed overflow is undefined behaviour in C);
 * narrower integers are promoted to int first, where they cannot overflow. */
#define KERNS_SIGNED(P, T, U)         \
    KERN(P##_sum, T, SUM, (U), (T))   \
    KERN(P##_prod, T, PROD, (U), (T)) \
    KERN(P##_min, T, MIN, ID, ID)     \
    KERN(P##_max, T, MAX, ID, ID)

KERNS4(u8, uint8_t, ID, ID)
KERNS4(i8, int8_t, ID, ID)
KERNS4(i16, int16_t, ID, ID)
KERNS_SIGNED(i32, int32_t, uint32_t)
KERNS_SIGNED(i64, int64_t, uint64_t)
KERNS4(f32, float, ID, ID)
KERNS4(f64, double, ID, ID)
KERNS4(f16, f16_t, TO_F32, TO_F16)
KERNS4(bf16, uint16_t, bf16_to_f32, f32_to_bf16)
KERN(b_or, uint8_t, OR, ID, ID)
KERN(b_and, uint8_t, AND, ID, ID)

typedef void (*kern_fn)(void *, const void *, int64_t);
typedef void (*kern2_fn)(void *, const void *, const void *, int64_t);
#define ROW(P) \
    {(kern_fn)P##_sum, (kern_fn)P##_sum, (kern_fn)P##_min, (kern_fn)P##_max, (kern_fn)P##_prod}
#define ROW2(P)                                                                              \
    {(kern2_fn)P##_sum_to, (kern2_fn)P##_sum_to, (kern2_fn)P##_min_to, (kern2_fn)P##_max_to, \
     (kern2_fn)P##_prod_to}

/* Indexed by [dtype][reduce op]; Average reduces as Sum and is scaled afterwards. */
static const kern_fn KERNELS[HVDL_NUM_DTYPES][5] = {
    [HVDL_UINT8] = ROW(u8),
    [HVDL_INT8] = ROW(i8),
    [HVDL_INT16] = ROW(i16),
    [HVDL_INT32] = ROW(i32),
    [HVDL_INT64] = ROW(i64),
    [HVDL_FLOAT16] = ROW(f16),
    [HVDL_BFLOAT16] = ROW(bf16),
    [HVDL_FLOAT32] = ROW(f32),
    [HVDL_FLOAT64] = ROW(f64),
    [HVDL_BOOL] = {(kern_fn)b_or, (kern_fn)b_or, (kern_fn)b_and, (kern_fn)b_or, (kern_fn)b_and},
};

static const kern2_fn KERNELS2[HVDL_NUM_DTYPES][5] = {
    [HVDL_UINT8] = ROW2(u8),
    [HVDL_INT8] = ROW2(i8),
    [HVDL_INT16] = ROW2(i16),
    [HVDL_INT32] = ROW2(i32),
    [HVDL_INT64] = ROW2(i64),
    [HVDL_FLOAT16] = ROW2(f16),
    [HVDL_BFLOAT16] = ROW2(bf16),
    [HVDL_FLOAT32] = ROW2(f32),
    [HVDL_FLOAT64] = ROW2(f64),
    [HVDL_BOOL] = {(kern2_fn)b_or_to, (kern2_fn)b_or_to, (kern2_fn)b_and_to, (kern2_fn)b_or_to,
                   (kern2_fn)b_and_to},
};

void hvdl__reduce(int dtype, int op, void *dst, const void *src, int64_t count) {
    KERNELS[dtype][op](dst, src, count);
}

/* dst must not overlap a or b. */
void hvdl__reduce_to(int dtype, int op, void *dst, const void *a, const void *b, int64_t count) {
    KERNELS2[dtype][op](dst, a, b, count);
}

/* Scaling: floats multiply in their own precision (widened for the half types); integers
 * multiply in double and truncate toward zero, as Horovod's ScaleBuffer does. */
#define SCALE(NAME, T, FT, W, N)                                       \
    KERNEL static void NAME(T *restrict d, int64_t n, double factor) { \
        FT f = (FT)factor;                                             \
        for (int64_t i = 0; i < n; i++) d[i] = N(W(d[i]) * f);         \
    }
SCALE(scale_u8, uint8_t, double, ID, (uint8_t))
SCALE(scale_i8, int8_t, double, ID, (int8_t))
SCALE(scale_i16, int16_t, double, ID, (int16_t))
SCALE(scale_i32, int32_t, double, ID, (int32_t))
SCALE(scale_i64, int64_t, double, ID, (int64_t))
SCALE(scale_f16, f16_t, float, TO_F32, TO_F16)
SCALE(scale_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16)
SCALE(scale_f32, float, float, ID, ID)
SCALE(scale_f64, double, double, ID, ID)

void hvdl__scale(int dtype, void *buf, int64_t count, double factor) {
    if (factor == 1.0 || count == 0) return;
    switch (dtype) {
    case HVDL_UINT8: scale_u8(buf, count, factor); break;
    case HVDL_INT8: scale_i8(buf, count, factor); break;
    case HVDL_INT16: scale_i16(buf, count, factor); break;
    case HVDL_INT32: scale_i32(buf, count, factor); break;
    case HVDL_INT64: scale_i64(buf, count, factor); break;
    case HVDL_FLOAT16: scale_f16(buf, count, factor); break;
    case HVDL_BFLOAT16: scale_bf16(buf, count, factor); break;
    case HVDL_FLOAT32: scale_f32(buf, count, factor); break;
    case HVDL_FLOAT64: scale_f64(buf, count, factor); break;
    default: break;   /* bool: refused at enqueue */
    }
}
