// The lane arithmetic of the native GD kernel (svmattn/train/native/gd_block.cc):
// a vector of LANES doubles, one data set per lane, with lanewise fused multiply-adds, an exp of
// fixed rounding, matrix-vector and matrix-matrix tiles whose sums run in index order, and the
// flushing of subnormals. Every lane runs the same scalar operations in the same order and no
// operation mixes lanes. No fast-math, no contraction: the rounding is fixed by these sources.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if !defined(__x86_64__) && !defined(__i386__)
#error "svmattn's native kernel is written for x86-64 (svmattn/native_build.py declines elsewhere)"
#endif
#include <immintrin.h>

// Lanes: 8 with AVX-512 (one register); 8 with AVX2 where the includer defines SVMATTN_LANE_PAIRS
// (gd_block.cc, whose comparisons and selects go through lanewise below: two registers per value,
// vd a pair of 4-lane halves, two groups of 4 data sets side by side, whose independent chains the
// core overlaps; 5-25% faster than 4 lanes at E2's, E4's and E5's sizes on a Zen 3 core); else 4.
// The results do not depend on it: every lane is
// its own data set.
#ifndef LANES
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(SVMATTN_LANE_PAIRS))
#define LANES 8
#else
#define LANES 4
#endif
#endif

namespace {

constexpr int L = LANES;  // lanes: data sets computed together
#if LANES == 8 && !defined(__AVX512F__) && defined(__AVX2__) && defined(SVMATTN_LANE_PAIRS)
// 8 lanes in two AVX2 registers: a pair of 4-lane vectors with the arithmetic operators lanewise
// (GCC carries a 64-byte vector type through memory and general registers where the processor has
// no 64-byte registers: 4.5x slower). Comparisons and selects go through lanewise (below).
#define SVMATTN_PAIRS 1
typedef double hd __attribute__((vector_size(4 * sizeof(double))));
typedef int64_t hl __attribute__((vector_size(4 * sizeof(int64_t))));
struct vd {                                              // lane j: h[j / 4][j % 4] (a GCC vector aliases
  hd h[2];                                                // its elements, so a double* may write one)
  double& operator[](int j) { return ((double*)h)[j]; }
  double operator[](int j) const { return h[j >> 2][j & 3]; }
};
struct vl {
  hl h[2];
  int64_t operator[](int j) const { return h[j >> 2][j & 3]; }
};
#define SVMATTN_OP(T, op)                                                                  \
  inline T operator op(T a, T b) { return T{{a.h[0] op b.h[0], a.h[1] op b.h[1]}}; }      \
  inline T& operator op##=(T& a, T b) { return a = a op b; }
SVMATTN_OP(vd, +)
SVMATTN_OP(vd, -)
SVMATTN_OP(vd, *)
SVMATTN_OP(vd, /)
SVMATTN_OP(vl, +)
SVMATTN_OP(vl, -)
#undef SVMATTN_OP
#define SVMATTN_SOP(op)                                                                   \
  inline vd operator op(vd a, double b) { return vd{{a.h[0] op b, a.h[1] op b}}; }        \
  inline vd operator op(double a, vd b) { return vd{{a op b.h[0], a op b.h[1]}}; }
SVMATTN_SOP(+)
SVMATTN_SOP(-)
SVMATTN_SOP(*)
SVMATTN_SOP(/)
#undef SVMATTN_SOP
inline vd operator-(vd a) { return vd{{-a.h[0], -a.h[1]}}; }
inline vl operator+(vl a, int64_t b) { return vl{{a.h[0] + b, a.h[1] + b}}; }
inline vl operator-(vl a, int64_t b) { return vl{{a.h[0] - b, a.h[1] - b}}; }
#else
typedef double vd __attribute__((vector_size(L * sizeof(double))));
typedef int64_t vl __attribute__((vector_size(L * sizeof(int64_t))));
#endif

inline vd splat(double x) { return vd{} + x; }

// The most outputs a matrix-vector tile keeps in registers: 8 of one register each (AVX-512's 32,
// AVX2's 16 at 4 lanes), 4 with the pairs (8 accumulators and 2 inputs of AVX2's 16 registers)
#ifdef SVMATTN_PAIRS
constexpr int kWidestTile = 4;
#else
constexpr int kWidestTile = 8;
#endif

// lanewise(f, a, b, ...) = f(a, b, ...) for f written with the vector operators (comparisons, the
// select `m ? a : b`, integer and bit operations). Where 8 lanes span two AVX2 registers, GCC carries
// such operations out one double at a time through memory; there f runs on each register's half (4
// lanes) and the halves are joined: the same lanewise operations, so the same bits.
#ifdef SVMATTN_PAIRS
template <class H> struct Whole;
template <> struct Whole<hd> { typedef vd type; };
template <> struct Whole<hl> { typedef vl type; };
template <class F, class... A>
__attribute__((always_inline)) inline auto lanewise(F f, A... a) {
  auto r0 = f(a.h[0]...);
  return typename Whole<decltype(r0)>::type{{r0, f(a.h[1]...)}};
}
#else
template <class F, class... A>
__attribute__((always_inline)) inline auto lanewise(F f, A... a) {
  return f(a...);
}
#endif

// masks (all bits set where true) and selects, lanewise
inline vl gt(vd a, vd b) { return lanewise([](auto x, auto y) { return x > y; }, a, b); }
inline vl lt(vd a, vd b) { return lanewise([](auto x, auto y) { return x < y; }, a, b); }
inline vl gt(vd a, double b) { return gt(a, splat(b)); }
inline vl lt(vd a, double b) { return lt(a, splat(b)); }
inline vl isnan(vd a) { return lanewise([](auto x) { return x != x; }, a); }
inline vl eq(vl a, vl b) { return lanewise([](auto x, auto y) { return x == y; }, a, b); }
inline vd sel(vl m, vd a, vd b) { return lanewise([](auto k, auto x, auto y) { return k ? x : y; }, m, a, b); }
inline vl sel(vl m, vl a, vl b) { return lanewise([](auto k, auto x, auto y) { return k ? x : y; }, m, a, b); }

// a * b + c rounded once (fused multiply-add), lanewise: the same result on every processor
// (the FMA instructions where the compiler targets them, the C library's exact fma elsewhere)
inline vd fmadd(vd a, vd b, vd c) {
#if defined(__AVX512F__) && LANES == 8
  return (vd)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#elif defined(SVMATTN_PAIRS) && defined(__FMA__)
  return vd{{(hd)_mm256_fmadd_pd((__m256d)a.h[0], (__m256d)b.h[0], (__m256d)c.h[0]),
             (hd)_mm256_fmadd_pd((__m256d)a.h[1], (__m256d)b.h[1], (__m256d)c.h[1])}};
#elif defined(__FMA__) && LANES == 8
  __m256d h[3][2], r[2];                                 // the halves (register moves at -O3)
  std::memcpy(h[0], &a, sizeof a);
  std::memcpy(h[1], &b, sizeof b);
  std::memcpy(h[2], &c, sizeof c);
  r[0] = _mm256_fmadd_pd(h[0][0], h[1][0], h[2][0]);
  r[1] = _mm256_fmadd_pd(h[0][1], h[1][1], h[2][1]);
  vd out;
  std::memcpy(&out, r, sizeof out);
  return out;
#elif defined(__FMA__) && LANES == 4
  return (vd)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#else
  vd r;
  for (int j = 0; j < L; ++j) r[j] = std::fma(a[j], b[j], c[j]);
  return r;
#endif
}

// -(a * b) + c rounded once: fmadd(-a, b, c) bit for bit (the negation is exact), in one instruction
inline vd fnmadd(vd a, vd b, vd c) {
#if defined(__AVX512F__) && LANES == 8
  return (vd)_mm512_fnmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#else
  return fmadd(-a, b, c);
#endif
}

// a where a > b, else b (lanewise; b where either is NaN or both are zeros): with AVX-512 the max
// instruction, which is defined so, in one operation (the compiler's select took two in places)
inline vd vmax(vd a, vd b) {
#if defined(__AVX512F__) && LANES == 8
  return (vd)_mm512_max_pd((__m512d)a, (__m512d)b);
#else
  return sel(gt(a, b), a, b);
#endif
}
inline vd vabs(vd a) { return sel(lt(a, 0.0), -a, a); }
// |a| with its sign bit cleared, one instruction (vabs keeps -0 and a negative NaN as they are)
inline vd magnitude(vd a) {
  return lanewise([](auto x) { return (decltype(x))((decltype(x < x))x & INT64_MAX); }, a);
}

inline vd vsqrt(vd a) {
  vd r;
  for (int j = 0; j < L; ++j) r[j] = std::sqrt(a[j]);
  return r;
}

// 2^k as a double built from its bits, for integral k in [-1022, 1023] (the portable scalings')
inline vd pow2_bits(vd k) {
  const vd two52 = splat(0x1p52);
  return lanewise(
      [](auto x, auto t) {
        using I = decltype(x < x);                        // (the integer vector of x's width)
        return (decltype(x))(((I)(x + (t + 1023.0)) - (I)t) << 52);
      },
      k, two52);
}

// p 2^k for p = exp(r) in [0.7, 1.42] (or NaN) and integral k (or infinite or NaN): 0 where
// k < -1022, else p times the double 2^k, bit for bit. With AVX-512 that is one exact scaling
// (vscalefpd; a result below 2^-1022 is flushed to zero there too, FlushDenormals) in place of
// building 2^k from its bits: 2 operations instead of 5 in every numerator of the softmax.
inline vd scale2k(vd p, vd k) {
#if defined(__AVX512F__) && LANES == 8
  __mmask8 keep = _mm512_cmp_pd_mask((__m512d)k, _mm512_set1_pd(-1022.0), _CMP_NLT_UQ);
  return (vd)_mm512_maskz_scalef_pd(keep, (__m512d)p, (__m512d)k);
#else
  return sel(lt(k, -1022.0), splat(0.0), p * pow2_bits(k));
#endif
}

// p 2^k for p = exp(r) in [0.7, 1.42] (or NaN) and integral k in [-1075, 1024], rounded once: with
// AVX-512 one scaling, elsewhere 2^k in two factors (each a double: k = k1 + k2, both in
// [-538, 513]), the first product exact; a result below 2^-1022 is flushed to zero in both
// (FlushDenormals), so the same bits
inline vd scale2k_wide(vd p, vd k) {
#if defined(__AVX512F__) && LANES == 8
  return (vd)_mm512_scalef_pd((__m512d)p, (__m512d)k);
#else
  const vd shifter = splat(0x1.8p52);
  vd k1 = (k * 0.5 + shifter) - shifter;
  return p * pow2_bits(k1) * pow2_bits(k - k1);
#endif
}

// exp(r) for x = k ln2 + r, |r| <= ln2 / 2, by its Taylor polynomial of degree 13 (truncation below
// 1e-17 relative), and k = round(x / ln 2): the part of vexp and vexp_nonpositive they share
inline vd exp_reduced(vd x, vd& k) {
  const vd shifter = splat(0x1.8p52);
  k = fmadd(x, splat(1.4426950408889634), shifter) - shifter;        // round(x / ln 2)
  vd r = fnmadd(k, splat(0.693147180559945286226764), x);            // ln 2, high part
  r = fnmadd(k, splat(2.319046813846299558e-17), r);                 // ln 2, low part
  vd p = splat(1.0 / 6227020800.0);                                  // 1/13!
  const double c[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
                      1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0};
  for (double ci : c) p = fmadd(p, r, splat(ci));
  return p;
}

// exp(x), lanewise: exp_reduced's polynomial times 2^k (scale2k_wide: k down to -1075).
inline vd vexp(vd x) {
  vd xc = sel(lt(x, -745.2), splat(-745.2), x);
  xc = sel(gt(xc, 709.8), splat(709.8), xc);
  vd k;
  const vd p = exp_reduced(xc, k);
  vd y = scale2k_wide(p, k);
  y = sel(gt(x, 709.8), splat(INFINITY), y);
  y = sel(lt(x, -745.2), splat(0.0), y);
  return sel(isnan(x), x, y);
}

// vexp(x) for x <= 0 (or NaN), as the softmax's numerators need it: the same value bit for bit.
// There k < -1022 gives 0 (scale2k) without the clamps: vexp gives a subnormal result there, which
// the kernel flushes to zero (FlushDenormals), as it does for p 2^k below 2^-1022.
inline vd vexp_nonpositive(vd x) {
  vd k;
  const vd p = exp_reduced(x, k);
  vd y = scale2k(p, k);
  return sel(isnan(x), x, y);
}

// 2^x for x <= 0 (or NaN), as the GD kernel's softmax numerators need it with its logits in units
// of log2 (numerics version 21: the queries carry the factor log2(e), gd_block.cc): k = round(x) by
// the shifter and r = x - k, exact, |r| <= 1/2, so the reduction takes two additions and a
// subtraction and no multiply (exp_reduced's takes a multiply-add and two), then 2^r by a polynomial
// of degree 11 (two fewer terms than exp_reduced's Taylor polynomial, over the same range of the
// exponent, r ln 2 in [-ln2/2, ln2/2]) times 2^k. Its coefficients: 1 (so 2^0 = 1 exactly), then a
// weighted least-squares fit of (2^r - 1) / r on [-1/2, 1/2] in 50-digit arithmetic, reweighted
// toward the minimax of the relative error (Lawson's iteration), each rounded once to a double: in
// exact arithmetic those doubles give 2^r within 2.8e-17 relative (ln 2's own rounding, the
// coefficient of r, is most of it); with Horner's roundings 2^x is within 1 ulp of the C library's
// exp2 (tests/test_native_kernel.py checks 2 ulp). Below x = -1023 the value is taken at -1023,
// where k = -1023 and 2^k built from its bits is 0 (exponent field 0); a result below 2^-1022 is
// flushed to zero (FlushDenormals), as vexp_nonpositive's. A NaN x comes back as itself, bit for
// bit: every NaN on the way is x's (2^k's bits are masked to a finite power of two, which k in
// [-1023, 0] never reaches past), so which operand's NaN an instruction passes on, an order the
// compiler chooses, cannot change the result. (2^k comes from round(x)'s bits, one addition fewer
// than pow2_bits(k), and with the mask pow2_bits has no need of.)
constexpr double kLog2e = 0x1.71547652b82fep0;                      // log2(e), rounded once
inline vd vexp2_nonpositive(vd x) {
  const vd shifter = splat(0x1.8p52);
  x = vmax(splat(-1023.0), x);                                       // (NaN is kept: vmax's b)
  const vd ks = x + shifter;                                         // round(x) in the low bits
  const vd k = ks - shifter;
  const vd r = x - k;                                                // exact
  vd p = splat(0x1.e79bb38e19537p-32);
  const double c[] = {0x1.e61b4fc363963p-28, 0x1.b5267ce24853ap-24, 0x1.62bfc79d3079cp-20,
                      0x1.ffcbfba97fb42p-17, 0x1.4309130ed8d9ap-13, 0x1.5d87fe78cd6d4p-10,
                      0x1.3b2ab6fba0119p-7,  0x1.c6b08d7049fe8p-5,  0x1.ebfbdff82c5a4p-3,
                      0x1.62e42fefa39efp-1, 1.0};
  for (double ci : c) p = fmadd(p, r, splat(ci));
#if defined(__AVX512F__) && LANES == 8
  return scale2k(p, k);
#else
  return p * lanewise(                                              // 2^k from round(x)'s low bits
                 [](auto b) {
                   using I = decltype(b < b);
                   return (decltype(b))((((I)b + 1023) << 52) & 0x3ff0000000000000);
                 },
                 ks);
#endif
}

enum Loss : int64_t { kLogistic = 0, kExponential = 1, kCorrelation = 2 };

// l'(u) of the named losses (models.attention.LOSS_DERIVATIVES)
inline vd loss_derivative(int64_t loss, vd u) {
  if (loss == kLogistic) return -(1.0 / (1.0 + vexp(u)));            // -sigmoid(-u)
  if (loss == kExponential) return -vexp(-u);
  return splat(-1.0);
}

// out[o] = sum over k < K, in the order of k, of a[o * ao + k * ak] * x[k * xk], for o0 <= o < o0 + N:
// N outputs at a time in registers, N independent chains of fused multiply-adds.
template <int N>
__attribute__((always_inline)) inline void matvec_tile(vd* out, const vd* a, int64_t ao, int64_t ak, const vd* x, int64_t xk, int64_t o0,
                        int64_t K) {
  vd c[N];
  for (int j = 0; j < N; ++j) c[j] = vd{};
  const vd* p = a + o0 * ao;
  for (int64_t k = 0; k < K; ++k, p += ak) {
    vd xv = x[k * xk];
    for (int j = 0; j < N; ++j) c[j] = fmadd(p[j * ao], xv, c[j]);
  }
  for (int j = 0; j < N; ++j) out[o0 + j] = c[j];
}

// out[o] = sum over k < K, in the order of k, of a[o * ao + k * ak] * x[k * xk], for o < O
inline void matvec(vd* out, const vd* a, int64_t ao, int64_t ak, const vd* x, int64_t xk, int64_t O, int64_t K) {
  int64_t o = 0;
  for (; o + kWidestTile <= O; o += kWidestTile) matvec_tile<kWidestTile>(out, a, ao, ak, x, xk, o, K);
  if (o + 4 <= O) matvec_tile<4>(out, a, ao, ak, x, xk, o, K), o += 4;
  if (o + 2 <= O) matvec_tile<2>(out, a, ao, ak, x, xk, o, K), o += 2;
  if (o < O) matvec_tile<1>(out, a, ao, ak, x, xk, o, K);
}

// out[r * orr + c * oc] = sum over k < K, in the order of k, of A[r * ar + k * ak] * B[k * bk + c * bc],
// for r0 <= r < r0 + R, c0 <= c < c0 + C: an R x C tile of independent chains of fused multiply-adds in
// registers, each A and B entry loaded once per k for the whole tile (every output is the same
// chain as matvec's: its terms in the order of k, from zero).
template <int R, int C>
__attribute__((always_inline)) inline void matmul_tile(vd* out, int64_t orr, int64_t oc, const vd* A, int64_t ar,
                                                       int64_t ak, const vd* B, int64_t bk, int64_t bc, int64_t r0,
                                                       int64_t c0, int64_t K, const vd* add = nullptr) {
  vd acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vd{};
  for (int64_t k = 0; k < K; ++k) {
    vd b[C];
    for (int c = 0; c < C; ++c) b[c] = B[k * bk + (c0 + c) * bc];
    for (int r = 0; r < R; ++r) {
      vd a = A[(r0 + r) * ar + k * ak];
      for (int c = 0; c < C; ++c) acc[r][c] = fmadd(b[c], a, acc[r][c]);
    }
  }
  if (add) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) out[(r0 + r) * orr + (c0 + c) * oc] = add[(r0 + r) * orr + (c0 + c) * oc] + acc[r][c];
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[(r0 + r) * orr + (c0 + c) * oc] = acc[r][c];
}

template <int C>
inline void matmul_cols(vd* out, int64_t orr, int64_t oc, const vd* A, int64_t ar, int64_t ak, const vd* B,
                        int64_t bk, int64_t bc, int64_t Rn, int64_t c0, int64_t K, const vd* add) {
  constexpr int TR = C > 4 ? 2 : 4;                       // (accumulators, B's and one A in 32 registers)
  int64_t r = 0;
  for (; r + TR <= Rn; r += TR) matmul_tile<TR, C>(out, orr, oc, A, ar, ak, B, bk, bc, r, c0, K, add);
  for (; r + 2 <= Rn; r += 2) matmul_tile<2, C>(out, orr, oc, A, ar, ak, B, bk, bc, r, c0, K, add);
  if (r < Rn) matmul_tile<1, C>(out, orr, oc, A, ar, ak, B, bk, bc, r, c0, K, add);
}

// out[r * orr + c * oc] = sum over k < K, in the order of k, of A[r * ar + k * ak] * B[k * bk + c * bc]
// for r < Rn, c < Cn (oc = 1): the same values as a matvec per row r. With AVX-512's 32 vector
// registers as 2-D tiles, with fewer loads per fused multiply-add (W 151 -> 140 ns, (K,Q) 259 -> 229 ns
// per data-set-step at E2's sizes on one Zen 5 core); with AVX2's 16 the tiles' accumulators and
// operands do not fit, and they measured 3-10% slower than a matvec per row, which runs there.
// With add (laid out as out): add + the sum, in that order, each entry once its chain is complete.
inline void matmul(vd* out, int64_t orr, int64_t oc, const vd* A, int64_t ar, int64_t ak, const vd* B, int64_t bk,
                   int64_t bc, int64_t Rn, int64_t Cn, int64_t K, const vd* add = nullptr) {
#if !defined(__AVX512F__)
  if (oc == 1) {
    for (int64_t r = 0; r < Rn; ++r) {
      matvec(&out[r * orr], B, bc, bk, &A[r * ar], ak, Cn, K);
      if (add)
        for (int64_t c = 0; c < Cn; ++c) out[r * orr + c] = add[r * orr + c] + out[r * orr + c];
    }
    return;
  }
#endif
  int64_t c = 0;
  for (; c + 8 <= Cn; c += 8) matmul_cols<8>(out, orr, oc, A, ar, ak, B, bk, bc, Rn, c, K, add);
  if (c + 4 <= Cn) matmul_cols<4>(out, orr, oc, A, ar, ak, B, bk, bc, Rn, c, K, add), c += 4;
  if (c + 2 <= Cn) matmul_cols<2>(out, orr, oc, A, ar, ak, B, bk, bc, Rn, c, K, add), c += 2;
  if (c < Cn) matmul_cols<1>(out, orr, oc, A, ar, ak, B, bk, bc, Rn, c, K, add);
}

// Subnormal inputs and results read and round to zero during a call, as in XLA:CPU's own
// programs (jnp.exp(-720.0) is 0.0 there): the kernel keeps the engine's semantics and never
// pays the processor's microcode assists on subnormal operands.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }   // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
};

}  // namespace
