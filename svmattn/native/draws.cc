// The uniforms of svmattn.rng's flat draws on the host (svmattn/rng_native.py builds and loads it;
// docs/science.md section 20): JAX's partitionable threefry2x32 of (0, position) under each key
// (Salmon et al., 2011: 20 rounds of 32-bit additions, rotations and xors, a key injection every
// 4), its 64 bits made a float64 in [1, 2) and then a uniform on [lo, hi) as jax.random.uniform
// computes it in an XLA program on the CPU, whose compiler fuses (f - 1) (hi - lo) + lo into one
// fused multiply-add: the same values bit for bit (tested against the XLA program). Integer
// arithmetic and one fma per value, no contraction of anything else (-ffp-contract=off).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace {

inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// threefry2x32 of the counters (a, b) under the key (k0, k1), in place: 20 rounds and a key injection
// every 4, with k2 = k0 ^ k1 ^ 0x1BD11BDA (inlined into the loops below, which the compiler vectorizes)
inline void threefry(uint32_t k0, uint32_t k1, uint32_t& a, uint32_t& b) {
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  a += k0, b += k1;
#define SVMATTN_ROUND(r) a += b, b = rotl(b, r), b ^= a;
#define SVMATTN_FOUR_EVEN SVMATTN_ROUND(13) SVMATTN_ROUND(15) SVMATTN_ROUND(26) SVMATTN_ROUND(6)
#define SVMATTN_FOUR_ODD SVMATTN_ROUND(17) SVMATTN_ROUND(29) SVMATTN_ROUND(16) SVMATTN_ROUND(24)
  SVMATTN_FOUR_EVEN a += k1, b += k2 + 1u;
  SVMATTN_FOUR_ODD a += k2, b += k0 + 2u;
  SVMATTN_FOUR_EVEN a += k0, b += k1 + 3u;
  SVMATTN_FOUR_ODD a += k1, b += k2 + 4u;
  SVMATTN_FOUR_EVEN a += k2, b += k0 + 5u;
#undef SVMATTN_FOUR_ODD
#undef SVMATTN_FOUR_EVEN
#undef SVMATTN_ROUND
}

}  // namespace

// out[j], j < count: the uniform on [lo, hi) of element skip + j of the flat run of draws of `size`
// values each, that is position (skip + j) % size of key keys[(skip + j) / size] (two uint32 each).
extern "C" void SvmattnUniforms(const uint32_t* keys, uint64_t skip, uint64_t size, uint64_t count, double lo,
                                double hi, double* out) {
  const double span = hi - lo;
  for (uint64_t e = skip, end = skip + count; e < end;) {
    const uint64_t k = e / size, first = e % size;
    const uint64_t run = size - first < end - e ? size - first : end - e;
    const uint32_t k0 = keys[2 * k], k1 = keys[2 * k + 1];
    double* o = out + (e - skip);
    for (uint64_t j = 0; j < run; ++j) {                 // (independent lanes: the compiler vectorizes)
      uint32_t a = 0, b = static_cast<uint32_t>(first + j);
      threefry(k0, k1, a, b);
      const uint64_t bits = ((static_cast<uint64_t>(a) << 32) | b) >> 12 | 0x3FF0000000000000ull;
      double f;
      std::memcpy(&f, &bits, sizeof f);                   // in [1, 2)
      const double u = std::fma(f - 1.0, span, lo);
      o[j] = u > lo ? u : lo;                              // max(lo, u), as lax.max (u is never NaN)
    }
    e += run;
  }
}

// (a[j], b[j]) = threefry2x32 of the counters (x1[j], x2[j]) under the key (k1[j], k2[j]), j < count: the
// hash of rng.threefry2x32 (integer arithmetic: the same integers as NumPy and XLA compute), for the
// keys, splits and coin flips that rng derives on the host.
extern "C" void SvmattnThreefry(const uint32_t* k1, const uint32_t* k2, const uint32_t* x1, const uint32_t* x2,
                                uint64_t count, uint32_t* out_a, uint32_t* out_b) {
  for (uint64_t j = 0; j < count; ++j) {                 // (independent lanes: the compiler vectorizes)
    uint32_t a = x1[j], b = x2[j];
    threefry(k1[j], k2[j], a, b);
    out_a[j] = a;
    out_b[j] = b;
  }
}

// out[r * cols + k] = a[r * cols + k] / sqrt(s_r) for every row r < rows, s_r the row's sum of squares
// computed as datasets._np_unit_rows computes it in NumPy, operation for operation: Dekker's split of
// each square into p + e (TwoProduct with the splitter 2^27 + 1), the p's summed in column order with
// Knuth's TwoSum and every error term added to one running error (Ogita, Rump and Oishi's Dot2), then
// one square root of total + error and one division per element. Plain IEEE operations, no
// contraction and no reassociation (-ffp-contract=off, no fast-math): the same bits (tested).
extern "C" void SvmattnUnitRows(const double* a, uint64_t rows, uint64_t cols, double* out) {
  if (cols == 0) return;
  constexpr int R = 8;                                       // rows at a time, one per vector lane
  const double split = 134217729.0;                          // 2^27 + 1
  std::vector<double> xt(cols * R);                          // a group of R rows, column by column
  for (uint64_t r0 = 0; r0 < rows; r0 += R) {
    const int nr = rows - r0 < static_cast<uint64_t>(R) ? static_cast<int>(rows - r0) : R;
    for (uint64_t k = 0; k < cols; ++k)
      for (int j = 0; j < R; ++j) xt[k * R + j] = a[(r0 + (j < nr ? j : 0)) * cols + k];
    double total[R], err[R], norm[R];
    auto two_square = [split](double x, double& p, double& e) {   // TwoProduct of x with itself: p + e = x^2
      p = x * x;
      const double c = split * x;
      const double hi = c - (c - x);
      const double lo = x - hi;
      e = lo * lo - (((p - hi * hi) - lo * hi) - hi * lo);
    };
    for (int j = 0; j < R; ++j) two_square(xt[j], total[j], err[j]);
    for (uint64_t k = 1; k < cols; ++k) {                    // (independent lanes: the compiler vectorizes)
      const double* x = &xt[k * R];
      for (int j = 0; j < R; ++j) {                          // TwoSum of total and p, the errors summed
        double p, e;
        two_square(x[j], p, e);
        const double t = total[j] + p;
        const double z = t - total[j];
        const double s = (total[j] - (t - z)) + (p - z);
        total[j] = t;
        err[j] = err[j] + (s + e);
      }
    }
    for (int j = 0; j < R; ++j) norm[j] = std::sqrt(total[j] + err[j]);
    for (int j = 0; j < nr; ++j) {
      const double* x = a + (r0 + j) * cols;
      double* o = out + (r0 + j) * cols;
      for (uint64_t k = 0; k < cols; ++k) o[k] = x[k] / norm[j];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The normals: c erfinv(u) of uniforms u on (-1, 1), as the XLA:CPU program of rng._erfinv_fn
// computes it (c = sqrt(2), or sqrt(2) times a scale), the same bits (tests/test_rng.py). That
// program is XLA's expansion of erfinv (M. Giles, "Approximating the erfinv function", GPU
// Computing Gems, 2011: w = -log1p(-u^2), a polynomial in w - 3.125 for w < 6.25, else in
// sqrt(w) - 3.25 for w < 16, else in sqrt(w) - 5), with XLA:CPU's log1p (Cephes' rational
// approximation for |m| < sqrt(2) - 1, else the C library's log(1 + m)). The operations below are
// that program's, in its order, its coefficients bit for bit (the hexadecimal literals), with a
// fused multiply-add exactly where XLA's compiler fuses one (every step of the polynomials, and
// m^2 (-1/2) + m^3 r in log1p), and subnormals flushed to zero as XLA:CPU runs. Each lane computes
// only the branch it takes: the result does not depend on its neighbours.
namespace {

constexpr double kMidW[23] = {
    -0x1.135d2e746e627p-68, -0x1.8ddf93324d327p-63, 0x1.7b83eef0b7c9fp-60, 0x1.9ba72cd589b91p-57,
    -0x1.33689090a6b96p-53, 0x1.82e11898132e0p-56, 0x1.de4acfd9e26bap-48, -0x1.6d33eed66c487p-45,
    -0x1.6f2167040d8e2p-44, 0x1.72a22c2d77e20p-39, -0x1.c8859c4e5c0afp-37, -0x1.dc583d118a561p-35,
    0x1.20f47ccf46b3cp-30, -0x1.1a9e38dc84d60p-28, -0x1.f36cd6d3d46a9p-26, 0x1.c6b4f5d03b787p-22,
    -0x1.6e8a5434ae8a2p-20, -0x1.d1d1f7b8736f6p-17, 0x1.879c2a212f024p-13, -0x1.845769484fca8p-11,
    -0x1.8b6c33114f909p-8, 0x1.ebd80d9b13e28p-3, 0x1.a755e7c99ae86p+0};
constexpr double kMidSqrt[23] = {
    0.0, 0.0, 0.0, 0.0,
    0x1.3040f87dbd932p-29, 0x1.85cbe52878635p-24, -0x1.2777453dd3955p-22, 0x1.395abcd554c6cp-26,
    0x1.936388a3790adp-20, -0x1.0d5db812b5083p-18, 0x1.8860cd5d652f6p-19, 0x1.a29a0cacdfb23p-17,
    -0x1.8cef1f80281f2p-15, 0x1.1e684d0b9188ap-14, 0x1.932cd54c8a222p-16, -0x1.7448a89ef8aa3p-12,
    0x1.f3cc55ad40c25p-11, -0x1.ba924132f38b1p-10, 0x1.468eeca533cf8p-9, -0x1.ebadabb891bbdp-9,
    0x1.5ffcfe5b76afcp-8, 0x1.0158a6d641d39p+0, 0x1.8abcc380d5a48p+1};
constexpr double kTailSqrt[23] = {
    0.0, 0.0, 0.0, 0.0,
    0.0, 0.0, -0x1.dcec3a7785389p-36, -0x1.18feec0e38727p-32,
    0x1.9e6bf2dda45e3p-30, -0x1.0468fb24e2f5fp-28, 0x1.05ac6a8fba182p-27, -0x1.0102e495fb9c0p-26,
    0x1.f4c20e1334af8p-26, -0x1.22d220fdf9c3ep-24, 0x1.ebc8bb824cb54p-23, -0x1.0a8d40ea372ccp-20,
    0x1.2fbd29d093d2bp-18, -0x1.4a3497e1e0facp-16, 0x1.3ebf4eb00938fp-14, -0x1.c2f36a8fc5d53p-13,
    -0x1.22ea5df04047cp-13, 0x1.02a30d1fba0dcp+0, 0x1.3664ddd1ad7fbp+2};
// log1p(m) = m - m^2 / 2 + m^3 N(m) / D(m) for |m| < sqrt(2) - 1: D's coefficients after its leading 1, N's
constexpr double kLogDen[6] = {
    0x1.e20359e903e37p+3, 0x1.4c30b52213498p+6, 0x1.bb86590fcfb56p+7,
    0x1.351945dc908a5p+8, 0x1.b0db13e48e066p+7, 0x1.e0f304466448ep+5};
constexpr double kLogNum[7] = {
    0x1.7bc0962b395cap-15, 0x1.fe818a0fe1a83p-2, 0x1.a509f46f4fa53p+2, 0x1.de9738b8cb9c9p+4,
    0x1.e798eb86c3351p+5, 0x1.c8e7597479a10p+5, 0x1.40a202d99830ap+4};
constexpr double kLogSmall = 0x1.a827999fcef32p-2;   // sqrt(2) - 1
constexpr int kBlockValues = 64;

#if defined(__AVX512F__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef double vd __attribute__((vector_size(kLanes * sizeof(double))));

inline vd splat(double x) { return vd{} + x; }

// a * b + c rounded once, lanewise (the instruction where the compiler targets it, else the C
// library's exact fma: the same value)
inline vd fmadd(vd a, vd b, vd c) {
#if defined(__AVX512F__)
  return (vd)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
#elif defined(__FMA__) && defined(__AVX__)
  return (vd)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)c);
#else
  vd r;
  for (int j = 0; j < kLanes; ++j) r[j] = std::fma(a[j], b[j], c[j]);
  return r;
#endif
}

inline vd vsqrt(vd a) {
  vd r;
  for (int j = 0; j < kLanes; ++j) r[j] = std::sqrt(a[j]);
  return r;
}

constexpr int kVectors = kBlockValues / kLanes;

// l[v] = log1p(m[v]) by the rational approximation, lanewise (XLA's value where |m| < sqrt(2) - 1),
// for a block's vectors at once: their chains of fused multiply-adds interleave
inline void log1p_small(const vd* m, vd* l) {
  vd den[kVectors], num[kVectors];
  for (int v = 0; v < kVectors; ++v) {
    const vd z = m[v] * 0.0;
    den[v] = z + 1.0, num[v] = z + kLogNum[0];
  }
  for (double c : kLogDen)
    for (int v = 0; v < kVectors; ++v) den[v] = fmadd(den[v], m[v], splat(c));
  for (int i = 1; i < 7; ++i)
    for (int v = 0; v < kVectors; ++v) num[v] = fmadd(num[v], m[v], splat(kLogNum[i]));
  for (int v = 0; v < kVectors; ++v) {
    const vd m2 = m[v] * m[v];
    l[v] = m[v] + fmadd(m2, splat(-0.5), (m[v] * m2) * (num[v] / den[v]));
  }
}

// x[v] = c erfinv(x[v]) from l[v] = log1p(-x[v]^2), for a block's vectors at once: Giles' polynomial of
// each lane's branch (the shorter tables start with zeros, which leave Horner's value at 0 until
// their first coefficient, exactly); a block whose every w = -l is below 6.25 (almost all) evaluates
// that branch's polynomial alone
inline void erfinv_from_log(vd* x, const vd* l, double c) {
  vd p[kVectors], s[kVectors];
  auto mid = l[0] > -6.25;
  for (int v = 1; v < kVectors; ++v) mid &= l[v] > -6.25;
  bool all_mid = true;
  for (int j = 0; j < kLanes; ++j) all_mid = all_mid && mid[j];
  if (all_mid) {
    for (int v = 0; v < kVectors; ++v) p[v] = splat(0.0), s[v] = -3.125 - l[v];
    for (double k : kMidW)
      for (int v = 0; v < kVectors; ++v) p[v] = fmadd(p[v], s[v], splat(k));
  } else {
    for (int v = 0; v < kVectors; ++v) {
      const auto w_mid = l[v] > -6.25, w_16 = l[v] > -16.0;
      s[v] = w_mid ? -3.125 - l[v] : vsqrt(-l[v]) - (w_16 ? splat(3.25) : splat(5.0));
      p[v] = splat(0.0);
      for (int i = 0; i < 23; ++i)
        p[v] = fmadd(p[v], s[v], w_mid ? splat(kMidW[i]) : (w_16 ? splat(kMidSqrt[i]) : splat(kTailSqrt[i])));
    }
  }
  for (int v = 0; v < kVectors; ++v) {
    const vd ax = x[v] < 0 ? -x[v] : x[v];
    x[v] = c * (x[v] * (ax == 1.0 ? splat(INFINITY) : p[v]));
  }
}

}  // namespace

// out[j] = c erfinv(u[j]) for j < count (out may be u), as rng's erfinv program computes it.
extern "C" void SvmattnNormals(const double* u, uint64_t count, double c, double* out) {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);                          // flush-to-zero and denormals-are-zero, as XLA:CPU
#endif
  for (uint64_t b0 = 0; b0 < count; b0 += kBlockValues) {
    const int nb = count - b0 < static_cast<uint64_t>(kBlockValues) ? static_cast<int>(count - b0) : kBlockValues;
    vd x[kVectors], m[kVectors], l[kVectors];
    std::memset(x, 0, sizeof x);
    std::memcpy(x, u + b0, nb * sizeof(double));
    for (int v = 0; v < kVectors; ++v) m[v] = x[v] * -x[v];
    log1p_small(m, l);
    const double* ms = reinterpret_cast<const double*>(m);
    double* ls = reinterpret_cast<double*>(l);
    int at[kBlockValues], k = 0;                       // the C library's log where XLA's log1p calls it
    for (int v = 0; v < kVectors; ++v) {               // (listed first, without a branch per value; the
      const auto small = (m[v] < 0 ? -m[v] : m[v]) < kLogSmall;   // zeros past nb are never listed)
      for (int j = 0; j < kLanes; ++j) at[k] = v * kLanes + j, k += small[j] == 0;
    }
    for (int i = 0; i < k; ++i) ls[at[i]] = std::log(ms[at[i]] + 1.0);
    erfinv_from_log(x, l, c);
    std::memcpy(out + b0, x, nb * sizeof(double));
  }
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(saved);
#endif
}
