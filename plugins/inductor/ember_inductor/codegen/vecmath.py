"""Vectorizable float32 exp, erf, log, log2 and log10 for the generated C++ (a text prelude, no
headers).

Without them gcc vectorizes a loop calling libm only through glibc's libmvec (``omp declare simd``
in cpp.py), whose float variants are less accurate than eager (measured over every 7th positive
float, against double libm: erff 4.0 ulp, expf 2.6, logf 3.9, tanhf 1.4) and whose ``logf`` takes
a scalar path for every vector that holds a negative or zero input (28x slower on randn inputs).
These are branch-free functions that gcc inlines into the loop and vectorizes at whatever width
``-march`` gives it (no runtime dispatch): polynomial pieces chosen with selects, special values
(NaN, +-inf, +-0, overflow to inf, underflow to 0, subnormal inputs and results) handled explicitly
so that they match libm. Measured the same way: exp 0.98 ulp, erf 1.05, log 0.84 (erf 1.28 on a
target without fma). Speed, one
thread, 1M randn floats, in one process (tests and figures: tests/inductor/test_vec_math.py and
the commit message): exp 0.8x libmvec's time, log 1.0x (0.04x with negative inputs), erf 1.2x.
tanh stays with libmvec (1.4 ulp, faster than an inline one built on this exp).

log2 and log10 use log's reduction with the sum split so that the products by 1/ln2 (1/ln10)
are exact: 0.83 and 0.80 ulp over the sweep, against libmvec's 1.9 and 2.1. On one Zen 5 core
(AVX-512) they cost 0.34-0.37 ns per float, 2x libmvec's time on positive inputs, but libmvec
takes a scalar path for every vector holding a zero, a negative or a NaN input (log2 5.7-21 ns,
log10 7.8-38 ns per float on randn inputs; ``p * log2(p)`` at p = 0 is common), where these stay
at 0.35 ns. (A version computed in double, 0.50 ulp, cost 0.66 ns.) log1p stays with libmvec
(1.6 ulp, 0.25 ns; its scalar path is taken only below -1 and at NaN): an inline log(1 + x)
plus the rounding correction measured 1.44 ulp at 0.53 ns.

sin, cos and tan stay with libmvec (1.7, 1.8, 3.1 ulp; 0.27 ns per float). A branch-free version
(reduction in double, Cody-Waite below 2^26 and a Payne-Hanek table above, so that sin(1e30) is
right) measured 0.50 ulp but 2.3 ns per float, 8x libmvec's: libmvec handles huge arguments on a
scalar path taken only by vectors that hold one, which code that gcc vectorizes from scalar
source cannot do.

The polynomial coefficients are minimax fits (Lawson's iteratively reweighted least squares over
Chebyshev nodes, mpmath references) of: (e^r - 1 - r)/r^2 on |r| <= ln2/2; erf(x)/x - 1 in x^2 on
|x| < 1; erfc(x) e^(x^2) in 1/x - 0.6275 on 1 <= x <= 3.92 (erf rounds to 1 above); and
(log((1+s)/(1-s)) - 2s)/s^3 in s^2 on |s| <= 0.1716. Kernels are built with
``-ffp-contract=off``, so the rounding behaves as written; ``fma`` is explicit where the target
has it (``__FMA__``), a multiply and an add elsewhere.
"""

from __future__ import annotations

__all__ = ["SOURCE", "FLOAT_FUNCS"]

#: libm names (float variants) whose calls the C++ code generator replaces by these functions
FLOAT_FUNCS = {"exp": "e_vexpf", "erf": "e_verff", "log": "e_vlogf", "log2": "e_vlog2f",
               "log10": "e_vlog10f"}

SOURCE = r"""
static inline float e_fma_f(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}
static inline float e_asf(uint32_t u) { return __builtin_bit_cast(float, u); }
static inline uint32_t e_asu(float f) { return __builtin_bit_cast(uint32_t, f); }
// e^x: x = n ln2 + r, |r| <= ln2/2, e^r by a polynomial, 2^n applied in two halves so that
// subnormal results round once
static inline float e_vexpf(float x) {
  float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  // round to nearest by adding and subtracting 1.5 2^23 (|n| <= 151): rintf's result without
  // SSE4.1's round instruction, so that plain x86-64 (SSE2) vectorizes it too
  float n = (xc * 1.44269502f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float c = e_fma_f(e_fma_f(e_fma_f(e_fma_f(0.00138146018f, r, 0.00836871522f), r, 0.0416683879f), r, 0.166665206f), r, 0.499999934f);
  float p = 1.0f + (r + (r * r) * c);
  int32_t ni = (int32_t)n;
  int32_t n1 = ni >> 1;
  int32_t n2 = ni - n1;
  float s1 = e_asf((uint32_t)(n1 + 127) << 23);
  float s2 = e_asf((uint32_t)(n2 + 127) << 23);
  float y = (p * s1) * s2;
  return x != x ? x : y;
}
// erf: |x| < 1: x + x P(x^2); above: 1 - e^(-x^2) R(1/|x| - 0.6275); 1 from 3.921875 (erfc < ulp/2)
static inline float e_verff(float x) {
  float a = __builtin_fabsf(x);
  float t = x * x;
  float small = e_fma_f(x, e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(-9.6415628e-06f, t, 0.000112569655f), t, -0.000848283149f), t, 0.00522094564f), t, -0.0268654001f), t, 0.11283782f), t, -0.376126384f), t, 0.128379167f), x);
  float u = 1.0f / (a < 1.0f ? 1.0f : a) - 0.62749004f;
  float big = 1.0f - e_vexpf(-t) * (e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(e_fma_f(-0.0358398139f, u, 0.0249604093f), u, 0.00608151548f), u, -0.0267581675f), u, 0.0426425592f), u, -0.0463069995f), u, 0.0227557161f), u, 0.043996637f), u, -0.172067063f), u, 0.381426045f), u, 0.306903826f));
  big = a >= 3.921875f ? 1.0f : big;
  float y = __builtin_copysignf(a < 1.0f ? small : big, x);
  return x != x ? x : y;
}
// log: x = 2^k m, m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f / (2 + f):
// log(m) = 2s + s R'(s^2) = f - f^2/2 + s (f^2/2 + R), R = s^2 P(s^2)
static inline float e_vlogf(float x) {
  // subnormals scaled into the normal range first
  int sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t ix = e_asu(xs);
  // the exponent of x relative to the interval [sqrt(1/2), sqrt(2)): 0x3f3504f3 is sqrt(1/2)
  uint32_t d = ix - 0x3f3504f3u;
  int32_t k = (int32_t)d >> 23;
  float m = e_asf((d & 0x007fffffu) + 0x3f3504f3u);
  float kf = (float)k - (sub ? 23.0f : 0.0f);
  float f = m - 1.0f;
  float s = f / (m + 1.0f);
  float s2 = s * s;
  float hfsq = 0.5f * f * f;
  float R = s2 * (e_fma_f(e_fma_f(e_fma_f(0.235819195f, s2, 0.285373248f), s2, 0.400003349f), s2, 0.666666656f));
  float y = kf * 0.693145752f + (f - (hfsq - (s * (hfsq + R) + kf * 1.42860677e-06f)));
  y = x == 0.0f ? -__builtin_inff() : y;
  y = x < 0.0f ? __builtin_nanf("") : y;
  y = x == __builtin_inff() ? x : y;
  return x != x ? x : y;
}
// log2, log10: e_vlogf's reduction (x = 2^k m, f = m - 1, s = f / (2 + f)); log(m) = hi + lo with
// hi = f - f^2/2 cut to 12 significant bits, so that hi times the 12-bit head of 1/ln2 (1/ln10)
// is exact, and the rest of the sum carried in lo; k added last (log2) or times log10(2) in two
// parts (log10)
static inline void e_logf_parts(float x, float& kf, float& hi, float& lo) {
  int sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t d = e_asu(xs) - 0x3f3504f3u;
  int32_t k = (int32_t)d >> 23;
  float m = e_asf((d & 0x007fffffu) + 0x3f3504f3u);
  kf = (float)k - (sub ? 23.0f : 0.0f);
  float f = m - 1.0f;
  float s = f / (m + 1.0f);
  float s2 = s * s;
  float hfsq = 0.5f * f * f;
  float R = s2 * (e_fma_f(e_fma_f(e_fma_f(0.235819195f, s2, 0.285373248f), s2, 0.400003349f), s2, 0.666666656f));
  hi = e_asf(e_asu(f - hfsq) & 0xfffff000u);
  lo = ((f - hi) - hfsq) + s * (hfsq + R);
}
// log of x <= 0, inf, nan as libm: -inf at +-0, nan below, inf at inf, nan at nan
static inline float e_log_special(float x, float y) {
  y = x == 0.0f ? -__builtin_inff() : y;
  y = x < 0.0f ? __builtin_nanf("") : y;
  y = x == __builtin_inff() ? x : y;
  return x != x ? x : y;
}
static inline float e_vlog2f(float x) {
  float kf, hi, lo;
  e_logf_parts(x, kf, hi, lo);
  float y = (((lo + hi) * 0x1.47652cp-12f + lo * 0x1.714p+0f) + hi * 0x1.714p+0f) + kf;
  return e_log_special(x, y);
}
static inline float e_vlog10f(float x) {
  float kf, hi, lo;
  e_logf_parts(x, kf, hi, lo);
  float y = ((((kf * 0x1.3509f8p-18f + (lo + hi) * 0x1.7b1526p-14f) + lo * 0x1.bcap-2f)
             + hi * 0x1.bcap-2f) + kf * 0x1.344p-2f);
  return e_log_special(x, y);
}
"""
