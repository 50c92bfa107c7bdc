// Regularization paths of attention on the CPU (svmattn/train/regpath_native.py loads it;
// docs/science.md section 4): the solver of svmattn/train/regpath.py, for the linear head, the
// single-query model and the global paths, with its gradients and Hessian-vector products written
// out by hand.
//
// For every radius R of the grid, accelerated projected gradient (FISTA with the gradient-mapping
// restart) on the ball c(params) <= R, in chunks of `refresh` steps, each with the step 1 / lambda,
// lambda = max(the power iteration's |largest Hessian eigenvalue|, ||grad|| / radius, tiny), the
// power iteration's vector carried from chunk to chunk and radius to radius; one chunk more than
// the steps need, whose estimate gives the loss and gradient at the solution. The warm start
// extrapolates from the last two solutions while the bound is active at both; with a candidate,
// every radius is also solved from the start along it, and the lower loss kept (by more than 1e-12
// relative). The same directions, steps, restarts and selections as the XLA solver; the rounding
// is this source's (and lanes.h's): one data set per lane, every lane the same operations in the
// same order, so a data set's path does not depend on the batch or the lanes beside it.
//
// params: W (d, d), or K and Q (d, m) one after the other (P values). The objective of one data set
// (models.attention.make_loss with the linear head, ridge 0, numerics "exact"):
//   q_i = W z_i (K Q^T z_i), l_it = x_it^T q_i, s_i = softmax(l_i), h_it = v^T x_it, ref_i the first
//   argmax of s_i, f_i = h_ref + sum_t s_it (h_it - h_ref), L = mean_i loss(Y_i f_i).
// Its gradient: a_i = Y_i loss'(Y_i f_i) / n, g_it = s_it a_i (h_it - h_ref - sd_i) with sd_i = f_i - h_ref,
// r_i = X_i^T g_i, dL/dW = sum_i r_i z_i^T; dL/dK = dL/dW Q, dL/dQ = dL/dW^T K. The Hessian-vector
// products differentiate those lines once more, forward (dl, ds, df, da, dg, dr).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lanes.h"

namespace {

struct Shape {
  int64_t n, T, d, m;
  bool kq;
  int64_t loss;
  int64_t P() const { return kq ? 2 * d * m : d * d; }
};

// loss''(u) of the named losses
inline vd loss_second(int64_t loss, vd u) {
  if (loss == kLogistic) return 1.0 / ((1.0 + vexp(u)) * (1.0 + vexp(-u)));
  if (loss == kExponential) return vexp(-u);
  return splat(0.0);
}

// loss(u), lane by lane with the C library (once per chunk): logistic max(0, -u) + log1p(exp(-|u|))
// (jnp.logaddexp(0, -u)), exponential exp(-u), correlation -u
inline vd loss_value(int64_t loss, vd u) {
  vd out;
  for (int j = 0; j < L; ++j) {
    double x = u[j];
    if (loss == kLogistic)
      out[j] = std::fmax(0.0, -x) + std::log1p(std::exp(-std::fabs(x)));
    else if (loss == kExponential)
      out[j] = std::exp(-x);
    else
      out[j] = -x;
  }
  return out;
}

inline vd select(vl c, vd a, vd b) { return c ? a : b; }

// ||x|| scaled by max |x| first (gradients at large R are ~1e-170: their squares would underflow), through
// the reciprocal of max |x|: exact to rounding for max |x| below 4.5e307, where 1 / max |x| is normal
// (the parameters and gradients of a path stay far below that)
vd norm(const vd* x, int64_t size) {
  vd top = splat(0.0);
  for (int64_t i = 0; i < size; ++i) top = vmax(vabs(x[i]), top);
  vd inv = 1.0 / (top > 0 ? top : splat(1.0));
  vd sq = splat(0.0);
  for (int64_t i = 0; i < size; ++i) {
    vd u = x[i] * inv;
    sq = fmadd(u, u, sq);
  }
  return top * vsqrt(sq);
}

// <A, B> / (||A|| ||B||), 0 where either is 0
vd cosine(const vd* a, const vd* b, int64_t size) {
  vd na = norm(a, size), nb = norm(b, size);
  vd ia = 1.0 / (na > 0 ? na : splat(1.0)), ib = 1.0 / (nb > 0 ? nb : splat(1.0));
  vd s = splat(0.0);
  for (int64_t i = 0; i < size; ++i) s = fmadd(a[i] * ia, b[i] * ib, s);
  return (na > 0) & (nb > 0) ? s : splat(0.0);
}

class Paths {
 public:
  explicit Paths(const Shape& s) : s_(s) {
    const int64_t n = s.n, T = s.T, d = s.d, m = s.m, P = s.P();
    X_.resize(n * T * d), Z_.resize(n * d), Y_.resize(n), v_.resize(d), h_.resize(n * T);
    p_.resize(n * m), q_.resize(n * d), sm_.resize(n * T), hd_.resize(n * T), sd_.resize(n), a_.resize(n),
        c2_.resize(n), r_.resize(n * d), kr_.resize(n * m);
    dp_.resize(n * m), dq_.resize(n * d), dl_.resize(n * T), dr_.resize(n * d), dt_.resize(n * m), tmp_.resize(P);
    g_.resize(P), hu_.resize(P), y_.resize(P), step_.resize(P);
  }

  // lane j <- data set j0 + j (the last one on unused lanes); h = X v
  void load(const double* X, const double* Z, const double* Y, const double* v, int64_t j0, int used) {
    const int64_t n = s_.n, T = s_.T, d = s_.d;
    gather(X, n * T * d, j0, used, X_.data());
    gather(Z, n * d, j0, used, Z_.data());
    gather(Y, n, j0, used, Y_.data());
    gather(v, d, j0, used, v_.data());
    matvec(h_.data(), X_.data(), d, 1, v_.data(), 1, n * T, d);
  }

  static void gather(const double* src, int64_t count, int64_t j0, int used, vd* dst) {
    for (int j = 0; j < L; ++j) {
      const double* p = src + (j0 + (j < used ? j : used - 1)) * count;
      for (int64_t i = 0; i < count; ++i) dst[i][j] = p[i];
    }
  }

  static void scatter(const vd* src, int64_t count, double* dst, int64_t stride, int64_t j0, int used) {
    for (int j = 0; j < used; ++j)
      for (int64_t i = 0; i < count; ++i) dst[(j0 + j) * stride + i] = src[i][j];
  }

  // The gradient at x into g_; with `full`, also the loss at x (returned; else 0) and the second
  // derivatives that the Hessian-vector products at x reuse
  vd gradient(const vd* x, bool full) {
    const int64_t n = s_.n, T = s_.T, d = s_.d, m = s_.m;
    const double inv_n = 1.0 / static_cast<double>(n);
    if (s_.kq) {
      const vd *K = x, *Q = x + d * m;
      matmul(p_.data(), m, 1, Z_.data(), d, 1, Q, m, 1, n, m, d);          // p_i = Q^T z_i
      matmul(q_.data(), d, 1, p_.data(), m, 1, K, 1, m, n, d, m);          // q_i = K p_i
    } else {
      matmul(q_.data(), d, 1, Z_.data(), d, 1, x, 1, d, n, d, d);          // q_i = W z_i
    }
    vd value = splat(0.0);
    for (int64_t i = 0; i < n; ++i) {
      vd* s = &sm_[i * T];
      matvec(s, &X_[i * T * d], d, 1, &q_[i * d], 1, T, d);               // logits
      vd mx = splat(-INFINITY), sum = splat(0.0);
      for (int64_t t = 0; t < T; ++t) mx = vmax(s[t], mx);
      for (int64_t t = 0; t < T; ++t) s[t] = vexp_nonpositive(s[t] - mx), sum += s[t];
      vd inv = 1.0 / sum, best = splat(-INFINITY), href = splat(0.0);
      for (int64_t t = 0; t < T; ++t) {                                    // s, and h at the first argmax
        s[t] = s[t] * inv;
        vl better = s[t] > best;
        best = select(better, s[t], best);
        href = select(better, h_[i * T + t], href);
      }
      vd sd = splat(0.0);
      for (int64_t t = 0; t < T; ++t) {
        hd_[i * T + t] = h_[i * T + t] - href;
        sd = fmadd(s[t], hd_[i * T + t], sd);
      }
      vd u = Y_[i] * (href + sd);
      sd_[i] = sd;
      a_[i] = Y_[i] * loss_derivative(s_.loss, u) * inv_n;
      if (full) {
        value += loss_value(s_.loss, u);
        c2_[i] = Y_[i] * Y_[i] * loss_second(s_.loss, u) * inv_n;
      }
      vd* g = &dl_[i * T];                                                 // (scratch: dL/dlogits)
      for (int64_t t = 0; t < T; ++t) g[t] = s[t] * fmadd(a_[i], hd_[i * T + t], -(a_[i] * sd));
      matvec(&r_[i * d], &X_[i * T * d], 1, d, g, 1, d, T);               // r_i = X_i^T dL/dlogits
    }
    outer(g_.data(), x);
    return value / static_cast<double>(n);
  }

  // The Hessian of the loss at the point of the last gradient() times u, into hu_
  void hessian_times(const vd* x, const vd* u) {
    const int64_t n = s_.n, T = s_.T, d = s_.d, m = s_.m;
    if (s_.kq) {
      const vd *K = x, *dK = u, *dQ = u + d * m;
      matmul(dp_.data(), m, 1, Z_.data(), d, 1, dQ, m, 1, n, m, d);       // dp_i = dQ^T z_i
      matmul(dq_.data(), d, 1, p_.data(), m, 1, dK, 1, m, n, d, m);       // dq_i = dK p_i + K dp_i
      matmul(dr_.data(), d, 1, dp_.data(), m, 1, K, 1, m, n, d, m);
      for (int64_t i = 0; i < n * d; ++i) dq_[i] += dr_[i];
    } else {
      matmul(dq_.data(), d, 1, Z_.data(), d, 1, u, 1, d, n, d, d);        // dq_i = U z_i
    }
    for (int64_t i = 0; i < n; ++i) {
      const vd* s = &sm_[i * T];
      const vd* hd = &hd_[i * T];
      vd* dl = &dl_[i * T];
      matvec(dl, &X_[i * T * d], d, 1, &dq_[i * d], 1, T, d);             // dlogits
      vd mean = splat(0.0);
      for (int64_t t = 0; t < T; ++t) mean = fmadd(s[t], dl[t], mean);
      vd df = splat(0.0);
      for (int64_t t = 0; t < T; ++t) {
        dl[t] = s[t] * (dl[t] - mean);                                     // ds
        df = fmadd(dl[t], hd[t], df);
      }
      vd a = a_[i], da = c2_[i] * df, adf = a * df;
      for (int64_t t = 0; t < T; ++t) {                                    // d(dL/dlogits)
        vd w = hd[t] - sd_[i];
        dl[t] = fmadd(dl[t] * a, w, s[t] * fmadd(da, w, -adf));
      }
      matvec(&dr_[i * d], &X_[i * T * d], 1, d, dl, 1, d, T);             // dr_i = X_i^T d(dL/dlogits)
    }
    if (!s_.kq) {
      matmul(hu_.data(), d, 1, dr_.data(), 1, d, Z_.data(), d, 1, d, d, n);   // sum_i dr_i z_i^T
      return;
    }
    const vd *K = x, *dK = u;
    vd *hK = hu_.data(), *hQ = hu_.data() + d * m;
    matmul(hK, m, 1, dr_.data(), 1, d, p_.data(), m, 1, d, m, n);        // sum_i dr_i p_i^T + r_i dp_i^T
    matmul(tmp_.data(), m, 1, r_.data(), 1, d, dp_.data(), m, 1, d, m, n);
    for (int64_t i = 0; i < d * m; ++i) hK[i] += tmp_[i];
    matmul(dt_.data(), m, 1, r_.data(), d, 1, dK, m, 1, n, m, d);        // t_i = dK^T r_i + K^T dr_i
    matmul(kr_.data(), m, 1, dr_.data(), d, 1, K, m, 1, n, m, d);
    for (int64_t i = 0; i < n * m; ++i) dt_[i] += kr_[i];
    matmul(hQ, m, 1, Z_.data(), 1, d, dt_.data(), m, 1, d, m, n);        // sum_i z_i t_i^T
  }

  // g_ from the rows r_i: sum_i r_i z_i^T, or (sum_i r_i p_i^T, sum_i z_i (K^T r_i)^T)
  void outer(vd* g, const vd* x) {
    const int64_t n = s_.n, d = s_.d, m = s_.m;
    if (!s_.kq) {
      matmul(g, d, 1, r_.data(), 1, d, Z_.data(), d, 1, d, d, n);
      return;
    }
    matmul(g, m, 1, r_.data(), 1, d, p_.data(), m, 1, d, m, n);
    matmul(kr_.data(), m, 1, r_.data(), d, 1, x, m, 1, n, m, d);          // K^T r_i
    matmul(g + d * m, m, 1, Z_.data(), 1, d, kr_.data(), m, 1, d, m, n);
  }

  vd constraint(const vd* x) const {
    const int64_t P = s_.P();
    vd sq = splat(0.0);
    for (int64_t i = 0; i < P; ++i) sq = fmadd(x[i], x[i], sq);
    return s_.kq ? 0.5 * sq : vsqrt(sq);
  }

  double radius(double R) const { return s_.kq ? std::sqrt(2.0 * R) : R; }

  void project(vd* x, double rad) {
    const int64_t P = s_.P();
    vd nrm = norm(x, P);
    vd factor = nrm > rad ? rad / (nrm > 0 ? nrm : splat(1.0)) : splat(1.0);
    for (int64_t i = 0; i < P; ++i) x[i] = factor * x[i];
  }

  struct Options {
    int64_t refresh, power_iters;
  };

  // iters accelerated projected-gradient steps at radius R from x (in place); v the power
  // iteration's vector (in place). Returns the loss at the solution, its gradient in g_.
  vd solve(double R, vd* x, vd* v, int64_t iters, const Options& o) {
    const int64_t P = s_.P();
    const double rad = radius(R);
    project(x, rad);
    std::vector<vd> prev(x, x + P);
    vd t = splat(1.0), value = splat(0.0);
    const int64_t chunks = (iters + o.refresh - 1) / o.refresh;
    for (int64_t k = 0; k <= chunks; ++k) {
      value = gradient(x, true);                                           // the step: 1 / lambda
      vd lam = splat(0.0);
      for (int64_t it = 0; it < o.power_iters; ++it) {
        hessian_times(x, v);
        lam = norm(hu_.data(), P);
        vd inv = 1.0 / (lam > 0 ? lam : splat(1.0));
        for (int64_t i = 0; i < P; ++i) v[i] = select(lam > 0, hu_[i] * inv, v[i]);
      }
      vd est = lam;                                                        // (a NaN estimate stays NaN, as in XLA)
      lam = vmax(vmax(lam, norm(g_.data(), P) / rad), splat(2.2250738585072014e-308));
      lam = est != est ? est : lam;
      const vd tau = 1.0 / lam;
      int64_t steps = iters - k * o.refresh;
      steps = steps < 0 ? 0 : (steps > o.refresh ? o.refresh : steps);
      for (int64_t it = 0; it < steps; ++it) {
        vd t_next = 0.5 * (1.0 + vsqrt(1.0 + 4.0 * t * t));
        vd beta = (t - 1.0) / t_next;
        for (int64_t i = 0; i < P; ++i) y_[i] = fmadd(beta, x[i] - prev[i], x[i]);
        gradient(y_.data(), false);
        for (int64_t i = 0; i < P; ++i) step_[i] = fmadd(-tau, g_[i], y_[i]);   // x_new
        project(step_.data(), rad);
        vd gm = splat(0.0);                                                // restart where the step goes
        for (int64_t i = 0; i < P; ++i) gm = fmadd(y_[i] - step_[i], step_[i] - x[i], gm);   // against the momentum
        vl restart = gm > 0;
        t = select(restart, splat(1.0), t_next);
        for (int64_t i = 0; i < P; ++i) {
          prev[i] = select(restart, step_[i], x[i]);
          x[i] = step_[i];
        }
      }
    }
    return value;
  }

  const Shape& shape() const { return s_; }
  std::vector<vd> g_;

 private:
  Shape s_;
  std::vector<vd> X_, Z_, Y_, v_, h_, p_, q_, sm_, hd_, sd_, a_, c2_, r_, kr_, dp_, dq_, dl_, dr_, dt_, tmp_, hu_, y_,
      step_;
};

struct Outputs {
  double *W, *loss, *constraint, *kkt, *grad_norm, *took, *gain, *last;
};

// One block of up to L data sets (j0 ..., `used` of them): the whole path over the grid
void path_block(Paths& pb, const double* X, const double* Z, const double* Y, const double* v, const double* x0,
                const double* along, const double* v0, const double* R, int64_t G, int64_t iters,
                int64_t first_iters, const Paths::Options& o, int64_t j0, int used, const Outputs& out) {
  const Shape& s = pb.shape();
  const int64_t P = s.P(), d = s.d, m = s.m;
  pb.load(X, Z, Y, v, j0, used);
  std::vector<vd> start(P), x(P), xp(P), base(P), v_run(P), a(P), va(P), b(P), vb(P), ga(P), W(d * d);
  Paths::gather(x0, P, j0, used, start.data());
  if (along != nullptr) Paths::gather(along, P, j0, used, base.data());
  for (int64_t i = 0; i < P; ++i) v_run[i] = splat(v0[i]);
  x = start, xp = start;
  vd R_prev = splat(R[0]), R_prev2 = splat(R[0]);
  const double tol = 1.0 - 1e-9;
  for (int64_t k = 0; k < G; ++k) {
    const double Rs = R[k];
    const int64_t n_it = k == 0 ? first_iters : iters;
    if (k == 0) {
      a = start;
    } else {   // the warm start: extrapolated while the bound is active at the last two solutions
      vl two = (R_prev > R_prev2) & (pb.constraint(x.data()) >= R_prev * tol) & (pb.constraint(xp.data()) >= R_prev2 * tol);
      vd step = two ? (Rs - R_prev) / (two ? R_prev - R_prev2 : splat(1.0)) : splat(0.0);
      vl on_boundary = pb.constraint(x.data()) >= R_prev * tol;
      vd rad_prev = s.kq ? vsqrt(2.0 * R_prev) : R_prev;
      vd grow = on_boundary ? pb.radius(Rs) / rad_prev : splat(1.0);
      for (int64_t i = 0; i < P; ++i) a[i] = select(two, fmadd(step, x[i] - xp[i], x[i]), grow * x[i]);
    }
    va = v_run;
    vd loss = pb.solve(Rs, a.data(), va.data(), n_it, o);
    ga = pb.g_;
    vd gain = splat(0.0);
    vl took = gain > 1.0;                                                  // (all false)
    if (along != nullptr) {                                                // the start along the candidate
      const double scale = s.kq ? std::sqrt(Rs) : Rs;
      for (int64_t i = 0; i < P; ++i) b[i] = scale * base[i];
      vb = v_run;
      vd loss_b = pb.solve(Rs, b.data(), vb.data(), n_it, o);
      gain = (loss - loss_b) / vabs(loss);
      took = gain > 1e-12;
      loss = select(took, loss_b, loss);
      for (int64_t i = 0; i < P; ++i) {
        a[i] = select(took, b[i], a[i]);
        va[i] = select(took, vb[i], va[i]);
        ga[i] = select(took, pb.g_[i], ga[i]);
      }
    }
    // diagnostics
    vd gn = norm(ga.data(), P), xn = norm(a.data(), P);
    vd kkt = (gn > 0) & (xn > 0) ? -cosine(ga.data(), a.data(), P) : splat(NAN);
    if (s.kq) {
      const vd *K = a.data(), *Q = a.data() + d * m;
      matmul(W.data(), d, 1, K, m, 1, Q, 1, m, d, d, m);                  // K Q^T
    } else {
      W.assign(a.begin(), a.end());
    }
    vd cons = pb.constraint(a.data());
    Paths::scatter(W.data(), d * d, out.W + k * d * d, G * d * d, j0, used);
    vd tk = took ? splat(1.0) : splat(0.0);
    const vd* fields[] = {&loss, &cons, &kkt, &gn, &tk, &gain};
    double* dst[] = {out.loss, out.constraint, out.kkt, out.grad_norm, out.took, out.gain};
    for (int f = 0; f < 6; ++f) Paths::scatter(fields[f], 1, dst[f] + k, G, j0, used);
    // carry: after the first radius or a switch of branch, no extrapolation across branches
    vl restart = took | (k == 0 ? ~vl{} : vl{});
    for (int64_t i = 0; i < P; ++i) xp[i] = select(restart, a[i], x[i]);
    R_prev2 = select(restart, splat(Rs), R_prev);
    R_prev = splat(Rs);
    x = a;
    v_run = va;
  }
  Paths::scatter(x.data(), P, out.last, P, j0, used);
}

}  // namespace

// The paths of B data sets (X (B,n,T,d), Z (B,n,d), Y (B,n), v (B,d), the starts x0 (B,P), the
// candidate directions along (B,P) scaled to radius 1 (R U / ||U|| for W, sqrt(R) times the
// balanced factors for (K,Q)) or null, the power iteration's first vector v0 (P)) on the grid R (G).
// Outputs: W (B,G,d,d), loss, constraint, kkt_cos, grad_norm, took (1.0 or 0.0), gain (B,G), the
// parameters at the last radius (B,P). Returns 0, or 2 where memory ran out.
extern "C" int SvmattnRegPath(int64_t B, int64_t n, int64_t T, int64_t d, int64_t m, int64_t kq, int64_t loss,
                              const double* X, const double* Z, const double* Y, const double* v, const double* x0,
                              const double* along, const double* v0, int64_t G, const double* R, int64_t iters,
                              int64_t first_iters, int64_t refresh, int64_t power_iters, double* W, double* loss_out,
                              double* constraint, double* kkt, double* grad_norm, double* took, double* gain,
                              double* last) {
  try {
    FlushDenormals flush;
    Shape s{n, T, d, m, kq != 0, loss};
    Paths pb(s);
    const Outputs out{W, loss_out, constraint, kkt, grad_norm, took, gain, last};
    const Paths::Options o{refresh, power_iters};
    for (int64_t j0 = 0; j0 < B; j0 += L) {
      const int used = static_cast<int>(B - j0 < L ? B - j0 : L);
      path_block(pb, X, Z, Y, v, x0, along, v0, R, G, iters, first_iters, o, j0, used, out);
    }
    return 0;
  } catch (...) {
    return 2;
  }
}
