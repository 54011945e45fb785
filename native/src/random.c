/* random.c: geon's Random primitive (geon/op_graph/random.py) in libgeon_native,
 * bit for bit the numbers of the NumPy transformer.
 *
 * The generator is Philox-4x32-10 with key (seed mod 2**32, (seed >> 32) XOR stream)
 * and, for the 32-bit word k of a draw, the counter (b mod 2**32, b >> 32, step mod
 * 2**32, step >> 32) with b = k / 4 (word k mod 4 of the block); step is the counter
 * op's value taken modulo 2**64 (a negative int64 step reads as its two's complement,
 * as geon's `int(step) & 0xFFFFFFFFFFFFFFFF` does).
 *
 * Uniform element i: float32 (w[i] >> 8) * 2**-24; float64 ((w[2i] >> 5) * 2**26 +
 * (w[2i+1] >> 6)) * 2**-53 (both exact). Normal element i takes the words of two
 * uniforms of the draw's dtype, 2i and 2i + 1 (u1 with one more unit, in (0, 1]), and
 * computes Box-Muller in double as geon/op_graph/portable_math.py writes it: the same
 * sequence of correctly rounded + - * / sqrt, exact frexp and floor, comparisons and
 * selections, with the same constants (written below as hexadecimal doubles, which
 * read back exactly). This file is compiled with -ffp-contract=off (CMakeLists.txt)
 * so that no multiply and add fuse, and C evaluates double expressions in double on
 * the targets this builds for (FLT_EVAL_METHOD 0): each operation rounds once, as
 * NumPy's element-wise ufuncs do, so the normals are the same bits too. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "runtime.h"

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "random.c needs FLT_EVAL_METHOD 0 (double operations rounded to double)"
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Philox-4x32-10 of counter c under key (k0, k1), in place. */
static void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0], p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0; c[1] = (uint32_t)p1; c[2] = n2; c[3] = (uint32_t)p0;
  }
}

/* The words of one stream at one step, with the last block computed kept. */
typedef struct {
  uint32_t k0, k1, s0, s1;
  uint64_t block;   /* the block in words (UINT64_MAX: none yet) */
  uint32_t words[4];
} stream;

static uint32_t word(stream *st, uint64_t k) {
  uint64_t b = k >> 2;
  if (b != st->block) {
    st->words[0] = (uint32_t)b; st->words[1] = (uint32_t)(b >> 32);
    st->words[2] = st->s0; st->words[3] = st->s1;
    philox(st->words, st->k0, st->k1);
    st->block = b;
  }
  return st->words[k & 3];
}

/* The uniform number of dtype t from the words at k (one for float32, two for
 * float64), plus one unit when open_low (then in (0, 1]), as a double (exact). */
static double uniform(stream *st, uint64_t k, gn_dtype t, int open_low) {
  if (t == DT_F64) {
    uint64_t bits = ((uint64_t)(word(st, k) >> 5) << 26) + (word(st, k + 1) >> 6) + (uint64_t)open_low;
    return (double)bits * 0x1p-53;
  }
  uint32_t bits = (word(st, k) >> 8) + (uint32_t)open_low;
  return (double)((float)bits * 0x1p-24f);
}

/* --- portable_math.py's programs, operation for operation ---------------------------- */

static const double LN2_HI = 0x1.62e42feep-1, LN2_LO = 0x1.a39ef35793c76p-33,
                    SQRT_HALF = 0x1.6a09e667f3bcdp-1;
static const double LOG_Q[10] = {
  0x1.5555555555555p-1, 0x1.999999999999ap-2, 0x1.2492492492492p-2, 0x1.c71c71c71c71cp-3,
  0x1.745d1745d1746p-3, 0x1.3b13b13b13b14p-3, 0x1.1111111111111p-3, 0x1.e1e1e1e1e1e1ep-4,
  0x1.af286bca1af28p-4, 0x1.8618618618618p-4};
static const double COS_C[10] = {
  0x1p+0, -0x1.3bd3cc9be45dep+0, 0x1.03c1f081b5ac4p-2, -0x1.55d3c7e3cbffap-6,
  0x1.e1f506891babbp-11, -0x1.a6d1f2a204a8cp-16, 0x1.f9d38a3763cc3p-22, -0x1.b6e24f44b128fp-28,
  0x1.20c62c2f2d7f5p-34, -0x1.2a0c591af8314p-41};
static const double SIN_S[10] = {
  0x1.921fb54442d18p+0, -0x1.4abbce625be53p-1, 0x1.466bc6775aae2p-4, -0x1.32d2cce62bd86p-8,
  0x1.50783487ee782p-13, -0x1.e3074fde8871fp-19, 0x1.e8f434d018d63p-25, -0x1.6fadb9f155744p-31,
  0x1.aaec32af93359p-38, -0x1.8a404211f9547p-45};

/* coeffs[0] + z (coeffs[1] + z (...)), innermost first */
static double horner(const double *c, double z) {
  double acc = c[9];
  for (int k = 8; k >= 0; k--) acc = c[k] + z * acc;
  return acc;
}

/* log x for x positive, normal and finite (portable_math.log_program) */
static double portable_log(double x) {
  int ei;
  double m = frexp(x, &ei), e = (double)ei;
  if (m < SQRT_HALF) { m = m * 2.0; e = e - 1.0; }
  double f = m - 1.0;
  double s = f / (m + 1.0);
  double z = s * s;
  double tail = s * (z * horner(LOG_Q, z));
  double lo = e * LN2_LO + tail;
  return e * LN2_HI + (s * 2.0 + lo);
}

/* cos(2 pi u) for u in [0, 1) (portable_math.cos_2pi_program) */
static double portable_cos_2pi(double u) {
  double t = u * 4.0;
  double q = floor(t);
  double r = t - q;
  if (r > 0.5) { r = r - 1.0; q = q + 1.0; }
  double r2 = r * r;
  double c = horner(COS_C, r2);
  double s = r * horner(SIN_S, r2);
  double q4 = q - floor(q * 0.25) * 4.0;
  return q4 == 0.0 ? c : q4 == 1.0 ? -s : q4 == 2.0 ? -c : s;
}

void gn_run_random(gn_op *op, const gn_value *counter) {
  gn_value *y = &op->out[0];
  int64_t step_i;
  const char *p = counter->data;
  switch (counter->dtype) {  /* (plan.c admits an integer scalar) */
    case DT_I8: step_i = *(const int8_t *)p; break;
    case DT_I16: step_i = *(const int16_t *)p; break;
    case DT_I32: step_i = *(const int32_t *)p; break;
    case DT_U8: step_i = *(const uint8_t *)p; break;
    case DT_U16: step_i = *(const uint16_t *)p; break;
    case DT_U32: step_i = *(const uint32_t *)p; break;
    case DT_U64: step_i = (int64_t)*(const uint64_t *)p; break;
    default: step_i = *(const int64_t *)p; break;
  }
  uint64_t step = (uint64_t)step_i;
  stream st = {(uint32_t)op->rnd_seed, (uint32_t)(op->rnd_seed >> 32) ^ op->rnd_stream,
               (uint32_t)step, (uint32_t)(step >> 32), UINT64_MAX, {0, 0, 0, 0}};
  uint64_t n = (uint64_t)y->size, per = y->dtype == DT_F64 ? 2 : 1;
  for (uint64_t i = 0; i < n; i++) {
    double v;
    if (!op->rnd_normal) {
      v = uniform(&st, i * per, y->dtype, 0);
    } else {
      double u1 = uniform(&st, 2 * i * per, y->dtype, 1), u2 = uniform(&st, (2 * i + 1) * per, y->dtype, 0);
      double radius = sqrt(-2.0 * portable_log(u1));
      v = radius * portable_cos_2pi(u2);
    }
    if (y->dtype == DT_F64) ((double *)y->data)[i] = v;
    else ((float *)y->data)[i] = (float)v;
  }
}
