// The GD kernel of the closed-form case on the CPU, as an XLA FFI custom call
// (svmattn/train/native_kernel.py builds and registers it; docs/science.md section 20).
//
// It runs a training chunk of normalized GD or GD on W or (K, Q) for a block of data sets, the
// block axis last in every array (X (n,T,d,b), Z (n,d,b), Y (n,b), the head v (d,b), W (d,d,b),
// K and Q (d,m,b)), with the gradient of models.attention._linear_head_grad (docs/science.md
// section 4): `snapshots` times `every` steps then an observation of the parameters (W, the
// predictions f, the mean largest attention, the ridge sum), optionally an observation of the
// starting parameters first, and the final attention. LANES data sets are computed at once, one per lane of a vector of doubles; every
// lane runs the same scalar operations in the same order and no operation mixes lanes, so a data
// set's trajectory does not depend on the block, its position there or the lanes beside it.
// No fast-math, and no contraction (-ffp-contract=off): the fused multiply-adds are the source's
// own (fmadd), so the rounding is fixed by this source and lanes.h alone, whatever the compiler or processor.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include "xla/ffi/api/ffi.h"

#define SVMATTN_LANE_PAIRS  // (8 lanes with AVX2 too: every vector comparison and select below is lanes.h's)
#include "lanes.h"

namespace ffi = xla::ffi;

namespace {

// An array of a block's data sets as the kernel reads or writes it: element i of data set j at
// p[i * elem + j * set], and observation a's elements a * obs further. The data sets last
// ((..., b), as XLA passes them): elem = b, set = 1. One data set after another ((b, ...), as
// the engine holds them): elem = 1, set = the row's length; no transposes around the call.
template <class P>
struct View {
  P* p;
  int64_t elem, set, obs;
};
using In = View<const double>;
using Out = View<double>;

// the data sets last: (count, b), or (S, count, b) per observation
inline In last(const double* p, int64_t b) { return In{p, b, 1, 0}; }
inline Out last(double* p, int64_t count, int64_t b) { return Out{p, b, 1, count * b}; }

// The normalized step p <- p - lr g / ||g||_F, with ||g||_F through u = g / max|g| and no step where g
// is 0 (optim.optimizers.normalize_by_leaf_norm): p + c g with c = -lr / max|g| / ||u|| (a product of
// reciprocals, normalized_coefficient) in one pass (g is left as it was)
vd normalized_coefficient(const vd* g, int64_t size, double lr) {
  vd pk[8] = {}, sq[4] = {};                              // independent chains (a max in any order;
                                                          // magnitude or vabs: a zero or NaN never wins)
  int64_t i = 0;
  for (; i + 8 <= size; i += 8)
    for (int j = 0; j < 8; ++j) pk[j] = vmax(magnitude(g[i + j]), pk[j]);
  for (; i < size; ++i) pk[0] = vmax(magnitude(g[i]), pk[0]);
  for (int j = 0; j < 4; ++j) pk[j] = vmax(pk[j], pk[j + 4]);
  vd peak = vmax(vmax(pk[0], pk[1]), vmax(pk[2], pk[3]));
  const vl some = gt(peak, 0.0);                          // (g is not 0)
  vd inv = 1.0 / sel(some, peak, splat(1.0));
  for (i = 0; i + 4 <= size; i += 4)
    for (int j = 0; j < 4; ++j) {
      vd u = g[i + j] * inv;
      sq[j] = fmadd(u, u, sq[j]);
    }
  for (; i < size; ++i) {
    vd u = g[i] * inv;
    sq[0] = fmadd(u, u, sq[0]);
  }
  vd norm = vsqrt((sq[0] + sq[1]) + (sq[2] + sq[3]));
  vd ninv = 1.0 / sel(gt(norm, 0.0), norm, splat(1.0));
  return splat(-lr) * sel(some, inv * ninv, splat(0.0));   // -lr / ||g||_F, and -0 where g is 0
}

void normalized_step(vd* p, const vd* g, int64_t size, double lr) {
  vd c = normalized_coefficient(g, size, lr);
  for (int64_t i = 0; i < size; ++i) p[i] = fmadd(c, g[i], p[i]);
}

// ||g||_F + eps with eps the float64 machine epsilon, the sum of squares in index order, as the
// authors' code normalizes (optim.optimizers.normalize_plus_eps): no rescaling, so a gradient below
// about 1e-154 squares to zero, and below eps the step shrinks (a frozen run)
vd norm_plus_eps(const vd* g, int64_t size) {
  vd sq = splat(0.0);
  for (int64_t i = 0; i < size; ++i) sq = fmadd(g[i], g[i], sq);
  return vsqrt(sq) + 2.220446049250313e-16;
}

// g / (||g||_F + eps) (norm_plus_eps)
void normalize_plus_eps(vd* g, int64_t size) {
  vd den = norm_plus_eps(g, size);
  for (int64_t i = 0; i < size; ++i) g[i] = g[i] / den;
}

struct Sizes {
  int64_t n, T, d, m, b;
};

struct Options {
  double lr, ridge;
  int64_t every, snapshots, loss;
  bool normalized, start;
  bool authors;  // the authors' numerics (ReLU head): pooled token X^T s, g / (||g||_F + eps)
  double head_lam;  // the lambda head's lam
  // Causal attention (0: none): the sequences are the queries of a seq2seq data set, K per sequence
  // of tokens (sequence i is query k = i mod K), and query k sees the tokens t <= k only: the others'
  // softmax weight is exactly 0 (models.attention.seq2seq_logits, -inf logits).
  int64_t causal = 0;
};

// The heads: linear h(r) = v^T r (head data v (d)), ReLU h(r) = 1^T ReLU(V^T r) (V (d,d)), lambda
// h(r) = v^T r - lam ||r||^2 (v (d)); the last two on the pooled token r.
enum Head { kLinear = 0, kRelu = 1, kLambda = 2 };

// out[k] = sum over t < T, in the order of t, of (rows[t * d + k] - ref[k]) * s[t], for k0 <= k < k0 + N:
// matvec's chains over the differences row_t - ref, formed where they are read instead of stored
template <int N>
__attribute__((always_inline)) inline void diff_tile_k(vd* out, const vd* rows, const vd* ref, const vd* s, int64_t T,
                                                       int64_t d, int64_t k0) {
  vd c[N], r[N];
  for (int j = 0; j < N; ++j) c[j] = vd{}, r[j] = ref[k0 + j];
  for (int64_t t = 0; t < T; ++t) {
    vd st = s[t];
    for (int j = 0; j < N; ++j) c[j] = fmadd(rows[t * d + k0 + j] - r[j], st, c[j]);
  }
  for (int j = 0; j < N; ++j) out[k0 + j] = c[j];
}

inline void diff_sum_over_t(vd* out, const vd* rows, const vd* ref, const vd* s, int64_t T, int64_t d) {
  int64_t k = 0;
  for (; k + kWidestTile <= d; k += kWidestTile) diff_tile_k<kWidestTile>(out, rows, ref, s, T, d, k);
  if (k + 4 <= d) diff_tile_k<4>(out, rows, ref, s, T, d, k), k += 4;
  if (k + 2 <= d) diff_tile_k<2>(out, rows, ref, s, T, d, k), k += 2;
  if (k < d) diff_tile_k<1>(out, rows, ref, s, T, d, k);
}

// g[t] = sum over k < d, in the order of k, of (rows[t * d + k] - ref[k]) * p[k], for t0 <= t < t0 + N
template <int N>
__attribute__((always_inline)) inline void diff_tile_t(vd* g, const vd* rows, const vd* ref, const vd* p, int64_t d,
                                                       int64_t t0) {
  vd c[N];
  for (int j = 0; j < N; ++j) c[j] = vd{};
  for (int64_t k = 0; k < d; ++k) {
    vd rk = ref[k], pk = p[k];
    for (int j = 0; j < N; ++j) c[j] = fmadd(rows[(t0 + j) * d + k] - rk, pk, c[j]);
  }
  for (int j = 0; j < N; ++j) g[t0 + j] = c[j];
}

inline void diff_sum_over_k(vd* g, const vd* rows, const vd* ref, const vd* p, int64_t T, int64_t d) {
  int64_t t = 0;
  for (; t + kWidestTile <= T; t += kWidestTile) diff_tile_t<kWidestTile>(g, rows, ref, p, d, t);
  if (t + 4 <= T) diff_tile_t<4>(g, rows, ref, p, d, t), t += 4;
  if (t + 2 <= T) diff_tile_t<2>(g, rows, ref, p, d, t), t += 2;
  if (t < T) diff_tile_t<1>(g, rows, ref, p, d, t);
}

class Group {
 public:
  Group(const Sizes& s, bool kq, Head head = kLinear, bool authors = false, double head_lam = 0.0,
        bool anchored = false, int64_t causal = 0)
      : s_(s), kq_(kq), relu_(head == kRelu), pooled_(head != kLinear), authors_(authors), lam_(head_lam),
        causal_(causal),
        factored_(kq && 5 * s.n * s.m < 3 * s.d * s.m + 2 * s.n * s.d), anchored_(anchored) {
    X_.resize(s.n * s.T * s.d);
    Z_.resize(s.n * s.d);
    Y_.resize(s.n);
    h_.resize(s.n * s.T);
    v_.resize(s.d);
    W_.resize(s.d * s.d);
    G_.resize(s.d * s.d);
    q_.resize(s.n * s.d);
    e_.resize(s.n * s.T);
    seq_.resize(4 * s.n);                                                // per sequence: 4 values (exp_logits, pool, ...)
    if (pooled_) {
      if (relu_) V_.resize(s.d * s.d), PX_.resize(s.n * s.T * s.d);
      u_.resize(s.n * s.d);
      r_.resize(s.n * s.d);
      g_.resize(s.n * s.T);
    }
    R_.resize(s.n * s.d);
    if (anchored_) {
      A_.resize(s.d * s.n);
      W0_.resize(s.d * s.d);
      q0_.resize(s.n * s.d);
      C_.resize(s.n * s.n);
      Rz_.resize(s.n * s.n);
      Hm_.resize(s.d * s.n);
    }
    if (kq) {
      P_.resize(s.n * s.m);
      RK_.resize(s.n * s.m);
      K_.resize(s.d * s.m);
      Q_.resize(s.d * s.m);
      gK_.resize(s.d * s.m);
      gQ_.resize(s.d * s.m);
    }
  }

  // lane j of dst[i] = element i of data set j0 + j (the last used data set on unused lanes)
  static void gather(const In& src, int64_t count, int64_t j0, int used, vd* dst) {
    const double* set[L];
    for (int j = 0; j < L; ++j) set[j] = src.p + (j0 + (j < used ? j : used - 1)) * src.set;
    for (int64_t i = 0; i < count; ++i)
      for (int j = 0; j < L; ++j) dst[i][j] = set[j][i * src.elem];
  }

  // element i of data set j0 + j of observation at = lane j of src[i], for the used lanes (in the
  // order of memory: the lanes innermost where the data sets are last)
  static void scatter(const vd* src, int64_t count, const Out& dst, int64_t at, int64_t j0, int used) {
    double* out = dst.p + at * dst.obs + j0 * dst.set;
    if (dst.set == 1) {
      for (int64_t i = 0; i < count; ++i)
        for (int j = 0; j < used; ++j) out[i * dst.elem + j] = src[i][j];
      return;
    }
    for (int j = 0; j < used; ++j)
      for (int64_t i = 0; i < count; ++i) out[j * dst.set + i * dst.elem] = src[i][j];
  }

  // head: v (d) with the linear head, whose h = X v (n,T) is computed here once (each h_it a chain
  // of fused multiply-adds over k in index order); V (d,d) with the ReLU head; v (d) with the lambda head
  void load(const In& X, const In& Z, const In& Y, const In& head, int64_t j0, int used) {
    const Sizes& s = s_;
    gather(X, s.n * s.T * s.d, j0, used, X_.data());
    gather(Z, s.n * s.d, j0, used, Z_.data());
    gather(Y, s.n, j0, used, Y_.data());
    if (relu_) {
      gather(head, s.d * s.d, j0, used, V_.data());
      for (int64_t i = 0; i < s.n * s.T; ++i)                             // P_it = V^T x_it, once per call
        matvec(&PX_[i * s.d], V_.data(), 1, s.d, &X_[i * s.d], 1, s.d, s.d);
    } else {
      gather(head, s.d, j0, used, v_.data());
      if (!pooled_) matvec(h_.data(), X_.data(), s.d, 1, v_.data(), 1, s.n * s.T, s.d);
    }
  }

  // q_ (n,d): the queries q_i = W z_i from W_, in units of log2 (to_log2_units)
  void queries() {
    const int64_t n = s_.n, d = s_.d;
    matmul(q_.data(), d, 1, Z_.data(), d, 1, W_.data(), 1, d, n, d, d);   // q_i = W z_i
    to_log2_units(q_.data(), n * d);
  }

  // q <- log2(e) q (numerics version 21): the queries in q_ carry the factor log2(e), so the logits
  // X_i q_i are in units of log2 and the softmax's numerators are 2^(logit - max) (vexp2_nonpositive),
  // whose reduction takes no multiply: n d products a step instead of three a numerator. The anchored
  // step folds the factor into W0 z_i and C once per call (begin_call) and takes none a step.
  static void to_log2_units(vd* q, int64_t count) {
    for (int64_t i = 0; i < count; ++i) q[i] = q[i] * kLog2e;
  }

  // e_ (n,T) = 2^(logit_it - max_t logit_it), the logits X_i q_i in units of log2 (q_i = log2(e) W z_i,
  // to_log2_units), that is exp of the logits' differences in natural units; q_ computed from W_
  // here unless have_q (the anchored step's and (K, Q)'s compute q_ themselves); seq_[n + i] = sum_t e_it
  // (the softmax's numerator and denominator). For the pooled heads (the linear head's softmax,
  // causal too, is attend_linear's).
  void exp_logits(bool have_q = false) {
    const int64_t n = s_.n, T = s_.T, d = s_.d;
    vd* mx = &seq_[0];
    vd* sum = &seq_[n];
    if (!have_q) queries();
    for (int64_t i = 0; i < n; ++i)                                       // logits X_i q_i
      matvec(&e_[i * T], &X_[i * T * d], d, 1, &q_[i * d], 1, T, d);
    for (int64_t i = 0; i < n; ++i) mx[i] = splat(-INFINITY), sum[i] = splat(0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < n; ++i) mx[i] = vmax(e_[i * T + t], mx[i]);
    for (int64_t t = 0; t < T; ++t)                                       // softmax
      for (int64_t i = 0; i < n; ++i) {
        e_[i * T + t] = vexp2_nonpositive(e_[i * T + t] - mx[i]);
        sum[i] += e_[i * T + t];
      }
  }

  // fn(i0, std::integral_constant<int, P>) for the sequences i0..i0+P-1, every sequence once, three
  // at a time: each sequence's stages are a chain of dependent operations, and three interleaved keep
  // the core busy while their tokens X_i stay in the level-1 cache (8% faster at E2's sizes than
  // every stage over all n sequences, or one sequence at a time; the same values)
  template <class Fn>
  void by_threes(Fn fn) {
    const int64_t n = s_.n;
    int64_t i = 0;
    for (; i + 3 <= n; i += 3) fn(i, std::integral_constant<int, 3>{});
    if (i + 2 <= n) fn(i, std::integral_constant<int, 2>{}), i += 2;
    if (i < n) fn(i, std::integral_constant<int, 1>{});
  }

  // The linear head's forward pass for the P sequences i0..i0+P-1 from their queries q_i: the
  // logits X_i q_i, the attention s into e_ (causal: over the tokens query i sees, 0 for the others),
  // its largest entry into seq_[2n + i], h at the most-attended token into h_ref[p] and
  // sum_t s_it (h_it - h_ref) into sd[p] (the prediction f_i = h_ref + sd). The attention of
  // sequence i0 + p goes to row p of `rows` (T each) where given: a step's chunks share rows 0..2
  // of e_, whose values no one reads after the step (a smaller footprint in the level-1 cache).
  template <int P>
  void attend_linear(int64_t i0, vd* h_ref, vd* sd, vd* rows = nullptr) {
    const int64_t n = s_.n, T = s_.T, d = s_.d;
    vd* e[P];
    const vd* h[P];
    vd mx[P], sum[P], best[P];
    int64_t seen[P];                                                      // causal: tokens 0..k of query k
    for (int p = 0; p < P; ++p) {
      const int64_t i = i0 + p;
      e[p] = rows ? &rows[p * T] : &e_[i * T], h[p] = &h_[i * T];
      matvec(e[p], &X_[i * T * d], d, 1, &q_[i * d], 1, T, d);           // logits X_i q_i
      seen[p] = causal_ > 0 ? i % causal_ + 1 : T;
      mx[p] = splat(-INFINITY), sum[p] = splat(0.0);
    }
    for (int p = 0; p < P; ++p)
      for (int64_t t = 0; t < seen[p]; ++t) mx[p] = vmax(e[p][t], mx[p]);
    for (int64_t t = 0; t < T; ++t)                                       // softmax
      for (int p = 0; p < P; ++p) {
        if (t >= seen[p]) {
          e[p][t] = splat(0.0);
          continue;
        }
        e[p][t] = vexp2_nonpositive(e[p][t] - mx[p]);
        sum[p] += e[p][t];
      }
    for (int p = 0; p < P; ++p) sum[p] = 1.0 / sum[p], best[p] = splat(-INFINITY), h_ref[p] = splat(0.0);
    for (int64_t t = 0; t < T; ++t)                                       // s, and h at the first argmax
      for (int p = 0; p < P; ++p) {
        vd st = e[p][t] * sum[p];
        e[p][t] = st;
        vl better = gt(st, best[p]);
        best[p] = sel(better, st, best[p]);
        h_ref[p] = sel(better, h[p][t], h_ref[p]);
      }
    for (int p = 0; p < P; ++p) sd[p] = splat(0.0), seq_[2 * n + i0 + p] = best[p];
    for (int64_t t = 0; t < T; ++t)
      for (int p = 0; p < P; ++p) sd[p] = fmadd(e[p][t], h[p][t] - h_ref[p], sd[p]);
  }

  // The linear head's forward pass at the current W_ (its queries q_ = W z_i computed here): the
  // attention s in e_ (n,T), its largest entry of every sequence in seq_[2n + i] and the
  // predictions f_i = h_ref + sum_t s_it (h_it - h_ref) in f[i].
  void forward_linear(vd* f) {
    queries();
    by_threes([&](int64_t i0, auto chunk) {
      constexpr int P = decltype(chunk)::value;
      vd h_ref[P], sd[P];
      attend_linear<P>(i0, h_ref, sd);
      for (int p = 0; p < P; ++p) f[i0 + p] = h_ref[p] + sd[p];
    });
  }

  // dL/dW into G_ at the current W_ (docs/science.md section 4): the rows r_i = X_i^T dL/dlogits_i
  // into R_, and G = sum_i r_i z_i^T into G_ unless rows_only (then q_ holds the queries already:
  // (K, Q)'s step through Q^T z_i, and the anchored W step). Per sequence, after attend_linear:
  // a_i = dL/df_i = Y_i l'(Y_i f_i) / n, dL/dlogits and r_i.
  void gradient(int64_t loss, bool rows_only = false) {
    const int64_t n = s_.n, T = s_.T, d = s_.d;
    const double inv_n = 1.0 / static_cast<double>(n);
    if (!rows_only) queries();
    by_threes([&](int64_t i0, auto chunk) {
      constexpr int P = decltype(chunk)::value;
      vd h_ref[P], sd[P], a[P];
      attend_linear<P>(i0, h_ref, sd, e_.data());                        // (dL/dlogits in rows 0..P-1 of e_)
      for (int p = 0; p < P; ++p)                                         // a_i = dL/df_i
        a[p] = Y_[i0 + p] * loss_derivative(loss, Y_[i0 + p] * (h_ref[p] + sd[p])) * inv_n;
      for (int64_t t = 0; t < T; ++t)                                     // dL/dlogits
        for (int p = 0; p < P; ++p) {
          vd* e = &e_[p * T];
          e[t] = e[t] * fmadd(a[p], h_[(i0 + p) * T + t] - h_ref[p], -(a[p] * sd[p]));
        }
      for (int p = 0; p < P; ++p)                                         // r_i = X_i^T dL/dlogits
        matvec(&R_[(i0 + p) * d], &X_[(i0 + p) * T * d], 1, d, &e_[p * T], 1, d, T);
    });
    if (!rows_only) matmul(G_.data(), d, 1, R_.data(), 1, d, Z_.data(), d, 1, d, d, n);   // G = sum_i r_i z_i^T
  }

  // dL/dW into G_ at the current W_ with a head on the pooled token
  // r_i = x_ref + sum_t s_it (x_it - x_ref), ref the most-attended token (models.attention.pooled_token,
  // docs/science.md section 1), as reverse-mode differentiation of that objective computes it; with
  // the ReLU head h(r) = 1^T ReLU(V^T r):
  //   p = V^T r_i, f_i = sum_j max(p_j, 0), a_i = Y_i l'(Y_i f_i) / n,
  //   u = V (a_i [p > 0]), g_t = (x_t - x_ref)^T u, dL/dlogit_t = s_t (g_t - sum_u s_u g_u).
  // With the lambda head h(r) = v^T r - lam r^T r: f_i = v^T r_i - lam r_i^T r_i and u = a_i (v - 2 lam r_i).
  // V_ holds the ReLU head (d x d) and PX_ its P_t = V^T x_t, v_ the lambda head's v.
  // A pooled head's prediction for sequence i after exp_logits() and the reciprocals of the sums
  // (seq_[n + i]): s_i into e_, its largest entry into seq_[2n + i], the row of its first argmax
  // into r_[i d..] (``pool``); with the ReLU head p = V^T r_i (pooled from the P_t) into p (d) and
  // f_i = sum_j max(p_j, 0); with the lambda head the pooled token into r (d) and
  // f_i = v^T r - lam r^T r.
  vd pooled_prediction(int64_t i, vd* r, vd* p) {
    const int64_t T = s_.T, d = s_.d;
    if (relu_) {                                                          // p = V^T r_i through P_t = V^T x_t
      pool(i, &PX_[i * T * d], p);
      vd f = splat(0.0);
      for (int64_t j = 0; j < d; ++j) f += vmax(p[j], splat(0.0));
      return f;
    }
    pool(i, &X_[i * T * d], r);                                           // lambda: v^T r - lam r^T r
    vd vr = splat(0.0), rr = splat(0.0);
    for (int64_t k = 0; k < d; ++k) vr = fmadd(v_[k], r[k], vr);
    for (int64_t k = 0; k < d; ++k) rr = fmadd(r[k], r[k], rr);
    return vr - splat(lam_) * rr;
  }

  // Sequence i's attention s_i into e_ (from exp_logits' e_ and the reciprocals of the sums in
  // seq_[n + i]), its largest entry into seq_[2n + i], and the pooled row of ``rows`` (T x d: the
  // tokens x_t, or with the ReLU head their P_t = V^T x_t, PX_, once per call since V and X do not
  // change; numerics version 19) into out (d): ref + sum_t s_t (row_t - ref) with ref the row of the
  // first argmax (into r_[i d..], for the gradient); sum_t s_t row_t with the authors' pooling.
  // With P_t the ReLU head's p = V^T r_i, and its gradient's g_t = (x_t - x_ref)^T u =
  // (P_t - P_ref)^T (a [p > 0]) needs no V either: 2 T d fused multiply-adds a sequence instead of
  // 2 T d + 2 d^2. The differences row_t - ref are formed where they are read (diff_sum_over_t, _k).
  void pool(int64_t i, const vd* rows, vd* out) {
    const int64_t n = s_.n, T = s_.T, d = s_.d;
    vd* sum = &seq_[n];
    vd* best = &seq_[2 * n];
    vd* ref = &r_[i * d];
    vl at = vl{} - 1;                                                     // the first argmax (-1: none)
    for (int64_t t = 0; t < T; ++t) {                                     // s, and the first argmax
      vd st = e_[i * T + t] * sum[i];
      e_[i * T + t] = st;
      vl better = gt(st, best[i]);
      best[i] = sel(better, st, best[i]);
      at = sel(better, vl{} + t, at);
    }
    for (int64_t k = 0; k < d; ++k) {                                     // its row (0 where there is none)
      vd r = splat(0.0);
      for (int64_t t = 0; t < T; ++t) r = sel(eq(at, vl{} + t), rows[t * d + k], r);
      ref[k] = r;
    }
    if (authors_) {                                                       // rows^T s as written
      matvec(out, rows, 1, d, &e_[i * T], 1, d, T);
      return;
    }
    diff_sum_over_t(out, rows, ref, &e_[i * T], T, d);                    // sum_t s_t (row_t - ref)
    for (int64_t k = 0; k < d; ++k) out[k] = ref[k] + out[k];
  }

  // Every stage over all n sequences before the next (unlike by_threes, here): a sequence's stages
  // are a chain (its prediction, dL/df through an exp and a division, g, dL/dlogits), and its
  // sequences' chains overlap in the core only when they sit side by side (one sequence after the
  // other: 12% slower at E5's sizes). The same operations on every value.
  void gradient_pooled(int64_t loss, bool rows_only = false) {
    const int64_t n = s_.n, T = s_.T, d = s_.d;
    const double inv_n = 1.0 / static_cast<double>(n);
    vd* sum = &seq_[n];
    vd* best = &seq_[2 * n];
    vd* a = &seq_[3 * n];
    exp_logits(rows_only);
    for (int64_t i = 0; i < n; ++i) sum[i] = 1.0 / sum[i], best[i] = splat(-INFINITY);
    for (int64_t i = 0; i < n; ++i) a[i] = pooled_prediction(i, &q_[i * d], &u_[i * d]);   // f_i
    for (int64_t i = 0; i < n; ++i) a[i] = Y_[i] * loss_derivative(loss, Y_[i] * a[i]) * inv_n;
    for (int64_t i = 0; i < n; ++i) {
      vd* g = &g_[i * T];
      if (relu_) {
        vd* p = &u_[i * d];
        for (int64_t j = 0; j < d; ++j) p[j] = sel(gt(p[j], 0.0), a[i], splat(0.0));   // a [p > 0]
        if (authors_) matvec(g, &PX_[i * T * d], d, 1, p, 1, T, d);      // g_t = P_t^T (a [p > 0])
        else diff_sum_over_k(g, &PX_[i * T * d], &r_[i * d], p, T, d);   // g_t = (P_t - P_ref)^T (a [p > 0])
      } else {                                                            // lambda: u = a (v - 2 lam r)
        vd* r = &q_[i * d];                                               // (q_i is no longer needed)
        for (int64_t k = 0; k < d; ++k) r[k] = a[i] * fmadd(splat(-2.0 * lam_), r[k], v_[k]);
        if (authors_) matvec(g, &X_[i * T * d], d, 1, r, 1, T, d);        // g_t = x_t^T u
        else diff_sum_over_k(g, &X_[i * T * d], &r_[i * d], r, T, d);    // g_t = (x_t - x_ref)^T u
      }
    }
    for (int64_t i = 0; i < n; ++i) {                                     // dL/dlogits
      const vd* g = &g_[i * T];
      vd sg = splat(0.0);
      for (int64_t t = 0; t < T; ++t) sg = fmadd(e_[i * T + t], g[t], sg);
      for (int64_t t = 0; t < T; ++t) e_[i * T + t] = e_[i * T + t] * (g[t] - sg);
    }
    for (int64_t i = 0; i < n; ++i)                                       // r_i = X_i^T dL/dlogits
      matvec(&R_[i * d], &X_[i * T * d], 1, d, &e_[i * T], 1, d, T);
    if (!rows_only) matmul(G_.data(), d, 1, R_.data(), 1, d, Z_.data(), d, 1, d, d, n);   // G = sum_i r_i z_i^T
  }

  // The anchored W step (numerics version 14; ``anchored_``). Every gradient of W is
  // G = sum_i r_i z_i^T = R^T Z (R (n,d) the rows r_i), so within a call W stays
  // W = W0 + A Z^T, W0 the W the call began with and A (d,n) the sum of the steps' -c R^T:
  //   q_i = W z_i = W0 z_i + A (Z z_i)         (W0 z_i once per call, C = Z Z^T once per call)
  //   ||G||_F = ||Rz R||_F                      (Z^T = Q Rz, Householder, once per call)
  //   A <- A + c R^T                            (c = -lr / ||G||_F, -lr (GD), or the authors' form)
  // and W itself is formed only where it is observed (W0 + A Z^T) and at the call's end. Each call
  // starts from W alone, so a trajectory depends on where its calls begin: the chunk boundaries of
  // its schedule (train.loop.schedule), the same in a resumed run and in a replay (which keeps the
  // run's chunks, train.loop.TrainConfig.chunk_every). Used for W without ridge where it takes fewer
  // fused multiply-adds per step than the direct step (a choice made by the sizes alone).
  void begin_call() {
    if (!anchored_) return;
    const int64_t n = s_.n, d = s_.d;
    for (int64_t i = 0; i < d * d; ++i) W0_[i] = W_[i];
    for (int64_t i = 0; i < d * n; ++i) A_[i] = splat(0.0);
    matmul(q0_.data(), d, 1, Z_.data(), d, 1, W0_.data(), 1, d, n, d, d);   // W0 z_i, as exp_logits
    matmul(C_.data(), n, 1, Z_.data(), d, 1, Z_.data(), 1, d, n, n, d);     // C_ij = z_i . z_j
    to_log2_units(q0_.data(), n * d);                                     // (the queries in units of log2)
    to_log2_units(C_.data(), n * n);
    factor_queries();
    moved_ = false;
  }

  // Rz (n,n, upper triangular): Z^T = Q Rz with Q^T Q = I (Householder reflections of the columns of
  // Z^T, each norm through max|x| as normalized_step's), so ||R^T Z||_F = ||Rz R||_F for any R (n,d),
  // with the backward error of the direct product (a zero column gives a zero row).
  void factor_queries() {
    const int64_t n = s_.n, d = s_.d;
    vd* M = Hm_.data();                                                   // Z^T (d,n), reflected in place
    for (int64_t k = 0; k < d; ++k)
      for (int64_t j = 0; j < n; ++j) M[k * n + j] = Z_[j * d + k];
    for (int64_t i = 0; i < n * n; ++i) Rz_[i] = splat(0.0);
    for (int64_t j = 0; j < n && j < d; ++j) {
      vd peak = splat(0.0), sq = splat(0.0);
      for (int64_t k = j; k < d; ++k) peak = vmax(vabs(M[k * n + j]), peak);
      vd inv = 1.0 / sel(gt(peak, 0.0), peak, splat(1.0));
      for (int64_t k = j; k < d; ++k) {
        vd u = M[k * n + j] * inv;
        sq = fmadd(u, u, sq);
      }
      vd norm = peak * vsqrt(sq);                                         // ||x||, x = M[j.., j]
      vd x0 = M[j * n + j];
      vd alpha = sel(lt(x0, 0.0), norm, -norm);                           // H x = alpha e_1
      M[j * n + j] = x0 - alpha;                                          // v = x - alpha e_1
      vd vtv = 2.0 * norm * (norm + vabs(x0));                            // ||v||^2
      const vl reflect = gt(vtv, 0.0);
      vd two_over = sel(reflect, 2.0 / sel(reflect, vtv, splat(1.0)), splat(0.0));
      for (int64_t c = j + 1; c < n; ++c) {                               // H = I - 2 v v^T / ||v||^2
        vd dot = splat(0.0);
        for (int64_t k = j; k < d; ++k) dot = fmadd(M[k * n + j], M[k * n + c], dot);
        vd f = -(dot * two_over);
        for (int64_t k = j; k < d; ++k) M[k * n + c] = fmadd(f, M[k * n + j], M[k * n + c]);
        Rz_[j * n + c] = M[j * n + c];
      }
      Rz_[j * n + j] = alpha;
    }
  }

  void anchored_step(const Options& o) {
    const int64_t n = s_.n, d = s_.d;
    matmul(q_.data(), d, 1, C_.data(), n, 1, A_.data(), 1, n, n, d, n,     // q_i = W0 z_i + A (Z z_i), the
           q0_.data());                                                   // second a chain in the order of j
    if (pooled_) gradient_pooled(o.loss, true);
    else gradient(o.loss, true);                                          // the rows r_i into R_
    vd c = splat(-o.lr);
    if (o.normalized) {
      vd* P = q_.data();                                                  // P = Rz R (n,d) over the queries (the
      for (int64_t j = 0; j < n; ++j)                                     // next step forms them anew from A):
        matvec(&P[j * d], &R_[j * d], 1, d, &Rz_[j * n + j], 1, d, n - j);   // P_jk a chain over i = j..n-1 in order
      c = o.authors ? splat(-o.lr) / norm_plus_eps(P, n * d)              // -lr / (||G||_F + eps)
                    : normalized_coefficient(P, n * d, o.lr);             // -lr / ||G||_F (-0 where G is 0)
    }
    for (int64_t k = 0; k < d; ++k)                                       // A <- A + c R^T
      for (int64_t i = 0; i < n; ++i) A_[k * n + i] = fmadd(c, R_[i * d + k], A_[k * n + i]);
    moved_ = true;
  }

  // W = W0 + A Z^T into W_ (each entry W0 plus one chain over the sequences in order)
  void anchored_w() {
    if (!anchored_ || !moved_) return;
    const int64_t n = s_.n, d = s_.d;
    matmul(G_.data(), d, 1, A_.data(), n, 1, Z_.data(), d, 1, d, d, n);
    for (int64_t i = 0; i < d * d; ++i) W_[i] = W0_[i] + G_[i];
  }

  void kq_to_w() {                                                       // W = K Q^T
    const int64_t d = s_.d, m = s_.m;
    matmul(W_.data(), d, 1, K_.data(), m, 1, Q_.data(), 1, m, d, d, m);
  }

  // The observation of the current parameters (train.loop's Trainer.observe): W_ (K Q^T for
  // (K, Q)), the attention s in e_, the predictions f (n), the mean over the sequences of the
  // largest attention, and the ridge sum ||W||^2 (||K||^2 + ||Q||^2), every sum in index order.
  void observe(vd* f, vd* max_prob, vd* ridge_sum) {
    const int64_t n = s_.n, d = s_.d, m = s_.m;
    if (kq_) kq_to_w();
    anchored_w();
    if (pooled_) {
      exp_logits();
      for (int64_t i = 0; i < n; ++i) seq_[n + i] = 1.0 / seq_[n + i], seq_[2 * n + i] = splat(-INFINITY);
      for (int64_t i = 0; i < n; ++i) f[i] = pooled_prediction(i, &q_[i * d], &u_[i * d]);
    } else {
      forward_linear(f);
    }
    const int64_t T = s_.T;
    vd mp = splat(0.0);
    for (int64_t i = 0; i < n; ++i) {                                     // (the max is NaN where s is, as in XLA)
      vd best = seq_[2 * n + i];
      for (int64_t t = 0; t < T; ++t) best = sel(isnan(e_[i * T + t]), e_[i * T + t], best);
      mp += best;
    }
    *max_prob = mp / static_cast<double>(n);
    vd rs = splat(0.0);
    if (kq_) {
      for (int64_t i = 0; i < d * m; ++i) rs = fmadd(K_[i], K_[i], rs);
      for (int64_t i = 0; i < d * m; ++i) rs = fmadd(Q_[i], Q_[i], rs);
    } else {
      for (int64_t i = 0; i < d * d; ++i) rs = fmadd(W_[i], W_[i], rs);
    }
    *ridge_sum = rs;
  }

  void step(const Options& o) {
    const int64_t n = s_.n, d = s_.d, m = s_.m;
    if (anchored_) return anchored_step(o);
    if (!kq_) {
      if (pooled_) gradient_pooled(o.loss);
      else gradient(o.loss);
      update(W_.data(), G_.data(), d * d, o);
      return;
    }
    if (factored_) {
      // (K, Q) through P_i = Q^T z_i (numerics version 10): q_i = K P_i, dK = G Q = sum_i r_i P_i^T and
      // dQ = G^T K = sum_i z_i (K^T r_i), with neither W = K Q^T nor G formed
      matmul(P_.data(), m, 1, Z_.data(), d, 1, Q_.data(), m, 1, n, m, d);   // P_i = Q^T z_i
      matmul(q_.data(), d, 1, P_.data(), m, 1, K_.data(), 1, m, n, d, m);   // q_i = K P_i
      to_log2_units(q_.data(), n * d);
      gradient(o.loss, true);
      matmul(gK_.data(), m, 1, R_.data(), 1, d, P_.data(), m, 1, d, m, n);  // dK = sum_i r_i P_i^T
      matmul(RK_.data(), m, 1, R_.data(), d, 1, K_.data(), m, 1, n, m, d);  // K^T r_i
      matmul(gQ_.data(), m, 1, Z_.data(), 1, d, RK_.data(), m, 1, d, m, n); // dQ = sum_i z_i (K^T r_i)^T
    } else {
      kq_to_w();
      gradient(o.loss);
      matmul(gK_.data(), m, 1, G_.data(), d, 1, Q_.data(), m, 1, d, m, d);  // dK = G Q
      matmul(gQ_.data(), m, 1, G_.data(), 1, d, K_.data(), m, 1, d, m, d);  // dQ = G^T K
    }
    update(K_.data(), gK_.data(), d * m, o);
    update(Q_.data(), gQ_.data(), d * m, o);
  }

  static void update(vd* p, vd* g, int64_t size, const Options& o) {
    if (o.ridge != 0.0)
      for (int64_t i = 0; i < size; ++i) g[i] = fmadd(splat(2.0 * o.ridge), p[i], g[i]);
    if (o.normalized && !o.authors) return normalized_step(p, g, size, o.lr);
    if (o.normalized) normalize_plus_eps(g, size);
    for (int64_t i = 0; i < size; ++i) p[i] = fmadd(splat(-o.lr), g[i], p[i]);
  }

  std::vector<vd> X_, Z_, Y_, h_, v_, W_, G_, q_, e_, R_, seq_, V_, PX_, u_, r_, g_, K_, Q_, gK_, gQ_, P_, RK_;
  std::vector<vd> A_, W0_, q0_, C_, Rz_, Hm_;                           // the anchored step's

 private:
  Sizes s_;
  bool kq_, relu_, pooled_, authors_;
  double lam_;
  int64_t causal_;      // Options::causal
  // (K, Q)'s step through Q^T z_i (numerics version 10) where it takes fewer fused multiply-adds, a
  // choice made by the sizes alone (so the same for every data set of a configuration): 5 n d m against
  // 3 d^2 m + 2 n d^2 (n < d at m = d). Each step starts from K and Q alone, so a trajectory does not
  // depend on its observations or on where a call began. (A step of W that carried the queries W z_i
  // from step to step, forming W only at the observations, was tried and dropped: it made a run depend
  // on its snapshot schedule, and a replay, which observes every step, must equal its batch bit for bit.
  // The anchored W step below carries nothing from an observation or from one call to the next, and a
  // replay keeps its run's calls.)
  bool factored_;
  bool anchored_;       // W's anchored step (anchored_w_step, which the caller decides: never for (K, Q))
  bool moved_ = false;   // a step since begin_call (W_ is then formed from W0 + A Z^T where observed)
};

// The anchored W step (Group::begin_call, numerics version 14) for W without ridge, with the linear
// and ReLU heads (not the lambda head, whose normalized GD turns rounding differences into different
// directions: docs/science.md section 20), n < d, where it takes fewer fused multiply-adds per step
// than the direct step's 2 n d^2 + 2 d^2 (W z_i, sum_i r_i z_i^T, the norm and the update): n^2 d
// (A (Z z_i)), n (n + 1) d / 2 (Rz R), and n d each for its squares, the update and adding W0 z_i. A
// choice made by the sizes and options alone, the same for every data set of a configuration.
bool anchored_w_step(const Sizes& s, bool kq, Head head, const Options& o) {
  const int64_t n = s.n, d = s.d;
  return !kq && head != kLambda && o.ridge == 0.0 && n < d &&
         n * n * d + n * (n + 1) * d / 2 + 3 * n * d < 2 * n * d * d + 2 * d * d;
}

Options options(double lr, double ridge, int64_t every, int64_t snapshots, int64_t start, int64_t loss,
                int64_t normalized, int64_t authors, double head_lam = 0.0) {
  return Options{lr, ridge, every, snapshots, loss, normalized != 0, start != 0, authors != 0, head_lam};
}

ffi::Error check(const Sizes& s, const Options& o) {
  if (s.n < 1 || s.T < 1 || s.d < 1 || s.m < 1 || s.b < 1 || o.every < 0 || o.snapshots < 0 || o.loss < 0 ||
      o.loss > 2)
    return ffi::Error::InvalidArgument("svmattn gd_block: bad sizes, steps, snapshots or loss");
  if (o.causal < 0 || (o.causal > 0 && (o.causal > s.T || s.n % o.causal != 0)))
    return ffi::Error::InvalidArgument("svmattn gd_block: causal K must divide n and be at most T");
  return ffi::Error::Success();
}

Sizes sizes_of(ffi::Buffer<ffi::F64>& X, int64_t m) {
  auto dims = X.dimensions();
  return Sizes{dims[0], dims[1], dims[2], m, dims[3]};
}

// What a chunk writes besides the parameters: per observation (the start's when o.start, then one
// per snapshot) W (d,d), the predictions f (n), the mean largest attention and the ridge sum; the
// final attention s (n,T). (The data sets last: W (S,d,d,b), f (S,n,b), (S,b), (S,b), s (n,T,b).)
struct Observations {
  Out W, f, max_prob, ridge_sum, s;
};

Observations observations_last(const Sizes& s, double* W, double* f, double* max_prob, double* ridge_sum,
                               double* att) {
  return Observations{last(W, s.d * s.d, s.b), last(f, s.n, s.b), last(max_prob, 1, s.b), last(ridge_sum, 1, s.b),
                      last(att, s.n * s.T, s.b)};
}

ffi::Error check_observations(const Sizes& s, const Options& o, ffi::ResultBuffer<ffi::F64>& W,
                              ffi::ResultBuffer<ffi::F64>& f, ffi::ResultBuffer<ffi::F64>& mp,
                              ffi::ResultBuffer<ffi::F64>& rs, ffi::ResultBuffer<ffi::F64>& att) {
  const int64_t S = o.snapshots + (o.start ? 1 : 0);
  if (W->element_count() != S * s.d * s.d * s.b || f->element_count() != S * s.n * s.b ||
      mp->element_count() != S * s.b || rs->element_count() != S * s.b || att->element_count() != s.n * s.T * s.b)
    return ffi::Error::InvalidArgument("svmattn gd_block: observation buffers of the wrong size");
  return ffi::Error::Success();
}

// A chunk for every group of (up to) L data sets of the block: `load` copies a group's data and
// parameters into the Group, `store` writes its parameters back; the observations go to `obs`.
template <class Load, class Store>
ffi::Error run_block(const Sizes& s, bool kq, Head head, const Options& o, Load load, Store store,
                     const Observations& obs) {
  FlushDenormals flush;
  Group g(s, kq, head, o.authors, o.head_lam, anchored_w_step(s, kq, head, o), o.causal);
  std::vector<vd> f(s.n);
  const int64_t dd = s.d * s.d, b = s.b;
  for (int64_t j0 = 0; j0 < b; j0 += L) {
    int used = static_cast<int>(b - j0 < L ? b - j0 : L);
    load(g, j0, used);
    g.begin_call();
    int64_t at = 0;                                                       // the next observation
    auto observe = [&]() {
      vd mp, rs;
      g.observe(f.data(), &mp, &rs);
      Group::scatter(g.W_.data(), dd, obs.W, at, j0, used);
      Group::scatter(f.data(), s.n, obs.f, at, j0, used);
      Group::scatter(&mp, 1, obs.max_prob, at, j0, used);
      Group::scatter(&rs, 1, obs.ridge_sum, at, j0, used);
      ++at;
    };
    if (o.start) observe();
    for (int64_t k = 0; k < o.snapshots; ++k) {
      for (int64_t t = 0; t < o.every; ++t) g.step(o);
      observe();
    }
    if (at == 0) {                                                        // (nothing observed: the attention)
      vd mp, rs;
      g.observe(f.data(), &mp, &rs);
    }
    Group::scatter(g.e_.data(), s.n * s.T, obs.s, 0, j0, used);            // the final attention
    store(g, j0, used);
  }
  return ffi::Error::Success();
}

// W (d,d,b) with the linear or lambda head (head: v, (d,b)) or the ReLU head (head: V, (d,d,b))
ffi::Error gd_block_w(Head kind, ffi::Buffer<ffi::F64> W, ffi::Buffer<ffi::F64> X, ffi::Buffer<ffi::F64> Z,
                      ffi::Buffer<ffi::F64> Y, ffi::Buffer<ffi::F64> head, ffi::ResultBuffer<ffi::F64> W_out,
                      ffi::ResultBuffer<ffi::F64> W_obs, ffi::ResultBuffer<ffi::F64> f,
                      ffi::ResultBuffer<ffi::F64> max_prob, ffi::ResultBuffer<ffi::F64> ridge_sum,
                      ffi::ResultBuffer<ffi::F64> attention, const Options& o) {
  if (X.dimensions().size() != 4) return ffi::Error::InvalidArgument("svmattn gd_block: X must be (n,T,d,b)");
  Sizes s = sizes_of(X, 1);
  if (auto err = check(s, o); err.failure()) return err;
  if (o.authors && kind != kRelu)
    return ffi::Error::InvalidArgument("svmattn gd_block: the authors' numerics need the ReLU head");
  if (auto err = check_observations(s, o, W_obs, f, max_prob, ridge_sum, attention); err.failure()) return err;
  return run_block(
      s, false, kind, o,
      [&](Group& g, int64_t j0, int used) {
        g.load(last(X.typed_data(), s.b), last(Z.typed_data(), s.b), last(Y.typed_data(), s.b),
               last(head.typed_data(), s.b), j0, used);
        Group::gather(last(W.typed_data(), s.b), s.d * s.d, j0, used, g.W_.data());
      },
      [&](Group& g, int64_t j0, int used) {
        Group::scatter(g.W_.data(), s.d * s.d, last(W_out->typed_data(), 0, s.b), 0, j0, used);
      },
      observations_last(s, W_obs->typed_data(), f->typed_data(), max_prob->typed_data(), ridge_sum->typed_data(),
                        attention->typed_data()));
}

#define SVMATTN_F64 ffi::Buffer<ffi::F64>
#define SVMATTN_OUT ffi::ResultBuffer<ffi::F64>
#define SVMATTN_OBS_PARAMS SVMATTN_OUT W_obs, SVMATTN_OUT f, SVMATTN_OUT mp, SVMATTN_OUT rs, SVMATTN_OUT att
#define SVMATTN_ATTR_PARAMS \
  double lr, double ridge, int64_t every, int64_t snapshots, int64_t start, int64_t loss, int64_t normalized, \
      int64_t authors, double head_lam
#define SVMATTN_OPTIONS options(lr, ridge, every, snapshots, start, loss, normalized, authors, head_lam)

ffi::Error GdBlockW(SVMATTN_F64 W, SVMATTN_F64 X, SVMATTN_F64 Z, SVMATTN_F64 Y, SVMATTN_F64 v, SVMATTN_OUT W_out,
                    SVMATTN_OBS_PARAMS, SVMATTN_ATTR_PARAMS) {
  return gd_block_w(kLinear, W, X, Z, Y, v, W_out, W_obs, f, mp, rs, att, SVMATTN_OPTIONS);
}

ffi::Error GdBlockWLambda(SVMATTN_F64 W, SVMATTN_F64 X, SVMATTN_F64 Z, SVMATTN_F64 Y, SVMATTN_F64 v,
                          SVMATTN_OUT W_out, SVMATTN_OBS_PARAMS, SVMATTN_ATTR_PARAMS) {
  return gd_block_w(kLambda, W, X, Z, Y, v, W_out, W_obs, f, mp, rs, att, SVMATTN_OPTIONS);
}

ffi::Error GdBlockWRelu(SVMATTN_F64 W, SVMATTN_F64 X, SVMATTN_F64 Z, SVMATTN_F64 Y, SVMATTN_F64 V,
                        SVMATTN_OUT W_out, SVMATTN_OBS_PARAMS, SVMATTN_ATTR_PARAMS) {
  return gd_block_w(kRelu, W, X, Z, Y, V, W_out, W_obs, f, mp, rs, att, SVMATTN_OPTIONS);
}

ffi::Error GdBlockKQ(SVMATTN_F64 K, SVMATTN_F64 Q, SVMATTN_F64 X, SVMATTN_F64 Z, SVMATTN_F64 Y, SVMATTN_F64 v,
                     SVMATTN_OUT K_out, SVMATTN_OUT Q_out, SVMATTN_OBS_PARAMS, SVMATTN_ATTR_PARAMS) {
  if (X.dimensions().size() != 4 || K.dimensions().size() != 3)
    return ffi::Error::InvalidArgument("svmattn gd_block: X must be (n,T,d,b), K and Q (d,m,b)");
  Sizes s = sizes_of(X, K.dimensions()[1]);
  Options o = SVMATTN_OPTIONS;
  if (auto err = check(s, o); err.failure()) return err;
  if (o.authors) return ffi::Error::InvalidArgument("svmattn gd_block: the authors' numerics need the ReLU head");
  if (auto err = check_observations(s, o, W_obs, f, mp, rs, att); err.failure()) return err;
  return run_block(
      s, true, kLinear, o,
      [&](Group& g, int64_t j0, int used) {
        g.load(last(X.typed_data(), s.b), last(Z.typed_data(), s.b), last(Y.typed_data(), s.b),
               last(v.typed_data(), s.b), j0, used);
        Group::gather(last(K.typed_data(), s.b), s.d * s.m, j0, used, g.K_.data());
        Group::gather(last(Q.typed_data(), s.b), s.d * s.m, j0, used, g.Q_.data());
      },
      [&](Group& g, int64_t j0, int used) {
        Group::scatter(g.K_.data(), s.d * s.m, last(K_out->typed_data(), 0, s.b), 0, j0, used);
        Group::scatter(g.Q_.data(), s.d * s.m, last(Q_out->typed_data(), 0, s.b), 0, j0, used);
      },
      observations_last(s, W_obs->typed_data(), f->typed_data(), mp->typed_data(), rs->typed_data(),
                        att->typed_data()));
}

}  // namespace

// The same chunks without XLA, for train.native_kernel (NumPy arrays through ctypes): 0 on success,
// 1 for bad sizes or options, 2 when it could not allocate its buffers. counts: every, snapshots,
// start, loss, normalized, authors (the authors' numerics: the ReLU head only), causal (Options::causal:
// 0, or K queries per token sequence, the linear head only).
// kind 0: W with the linear head (head: v (d)), 1: W with the ReLU head (head: V (d,d)), 2: (K, Q)
// with the linear head (K and Q (d,m)), 3: W with the lambda head (head: v (d)) of lam head_lam.
// in: the parameters (W, or K and Q), X (n,T,d), Z (n,d), Y (n), head; out: the parameters, then
// per observation W (d,d), f (n), the mean largest attention and the ridge sum (one each), and the
// final attention (n,T). Every array has three strides, in doubles (View: element, data set,
// observation), in in_strides and out_strides in that order; with (K, Q) the parameters are two
// arrays, with W one (in[1] and out[1] are then not read).
extern "C" int SvmattnGdChunk(int64_t kind, const int64_t* sizes, double lr, double ridge, double head_lam,
                              const int64_t* counts, const double* const* in, const int64_t* in_strides,
                              double* const* out, const int64_t* out_strides) {
  if (kind < 0 || kind > 3) return 1;
  const bool kq = kind == 2;
  const Head head_kind = kind == 1 ? kRelu : kind == 3 ? kLambda : kLinear;
  Sizes s{sizes[0], sizes[1], sizes[2], kq ? sizes[3] : 1, sizes[4]};
  Options o = options(lr, ridge, counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], head_lam);
  o.causal = counts[6];
  if (o.authors && head_kind != kRelu) return 1;
  if (o.causal != 0 && head_kind != kLinear) return 1;
  if (check(s, o).failure()) return 1;
  const int64_t pk = kq ? s.d * s.m : s.d * s.d;
  auto ins = [&](int a) { return In{in[a], in_strides[3 * a], in_strides[3 * a + 1], in_strides[3 * a + 2]}; };
  auto outs = [&](int a) { return Out{out[a], out_strides[3 * a], out_strides[3 * a + 1], out_strides[3 * a + 2]}; };
  try {                                                                   // (no exception crosses into C)
  ffi::Error err = run_block(
      s, kq, head_kind, o,
      [&](Group& g, int64_t j0, int used) {
        g.load(ins(2), ins(3), ins(4), ins(5), j0, used);
        Group::gather(ins(0), pk, j0, used, kq ? g.K_.data() : g.W_.data());
        if (kq) Group::gather(ins(1), pk, j0, used, g.Q_.data());
      },
      [&](Group& g, int64_t j0, int used) {
        Group::scatter(kq ? g.K_.data() : g.W_.data(), pk, outs(0), 0, j0, used);
        if (kq) Group::scatter(g.Q_.data(), pk, outs(1), 0, j0, used);
      },
      Observations{outs(2), outs(3), outs(4), outs(5), outs(6)});
  return err.failure() ? 1 : 0;
  } catch (...) {                                                         // (out of memory)
    return 2;
  }
}

#define SVMATTN_ATTRS                                                                                      \
  .Attr<double>("lr").Attr<double>("ridge").Attr<int64_t>("every").Attr<int64_t>("snapshots").Attr<int64_t>( \
      "start").Attr<int64_t>("loss").Attr<int64_t>("normalized").Attr<int64_t>("authors").Attr<double>("head_lam")
#define SVMATTN_OBS_RETS .Ret<SVMATTN_F64>().Ret<SVMATTN_F64>().Ret<SVMATTN_F64>().Ret<SVMATTN_F64>().Ret<SVMATTN_F64>()
// (W, X, Z, Y, v or V) -> (W, W per observation, f, max prob, ridge sum, final attention)
#define SVMATTN_W_BINDING                                                                                  \
  ffi::Ffi::Bind().Arg<SVMATTN_F64>().Arg<SVMATTN_F64>().Arg<SVMATTN_F64>().Arg<SVMATTN_F64>().Arg<SVMATTN_F64>() \
      .Ret<SVMATTN_F64>() SVMATTN_OBS_RETS SVMATTN_ATTRS

XLA_FFI_DEFINE_HANDLER_SYMBOL(SvmattnGdBlockW, GdBlockW, SVMATTN_W_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(SvmattnGdBlockWRelu, GdBlockWRelu, SVMATTN_W_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(SvmattnGdBlockWLambda, GdBlockWLambda, SVMATTN_W_BINDING);
// (K, Q, X, Z, Y, v) -> (K, Q, W per observation, f, max prob, ridge sum, final attention)
XLA_FFI_DEFINE_HANDLER_SYMBOL(SvmattnGdBlockKQ, GdBlockKQ,
                              ffi::Ffi::Bind()
                                  .Arg<SVMATTN_F64>()
                                  .Arg<SVMATTN_F64>()
                                  .Arg<SVMATTN_F64>()
                                  .Arg<SVMATTN_F64>()
                                  .Arg<SVMATTN_F64>()
                                  .Arg<SVMATTN_F64>()
                                  .Ret<SVMATTN_F64>()
                                  .Ret<SVMATTN_F64>() SVMATTN_OBS_RETS SVMATTN_ATTRS);
