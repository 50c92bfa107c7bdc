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
  const double split = 134217729.0;                          // 2^27 + 1
  auto two_square = [split](double x, double& p, double& e) {
    p = x * x;
    const double c = split * x;
    const double hi = c - (c - x);
    const double lo = x - hi;
    e = lo * lo - (((p - hi * hi) - lo * hi) - hi * lo);
  };
  for (uint64_t r = 0; r < rows; ++r) {
    const double* x = a + r * cols;
    double total, err;
    two_square(x[0], total, err);
    for (uint64_t k = 1; k < cols; ++k) {
      double h, q;
      two_square(x[k], h, q);
      const double t = total + h;
      const double z = t - total;
      const double s = (total - (t - z)) + (h - z);
      total = t;
      err = err + (s + q);
    }
    const double norm = std::sqrt(total + err);
    double* o = out + r * cols;
    for (uint64_t k = 0; k < cols; ++k) o[k] = x[k] / norm;
  }
}
