// The structured interior point of svmattn/svm/nuclear_ipm.py for one problem, on the host
// (svmattn/svm/nuclear_ipm_native.py builds and calls it; docs/science.md section 9).
//
//   minimize ||W||_*  s.t.  a_j^T W b_j >= 1   (j = 1..N; W p x q)
//
// as the SDP pair of nuclear_ipm.py, k = p + q:
//   (P) minimize tr X  s.t. <G_j, X> - x_j = 1, X PSD (k x k), x >= 0
//   (D) maximize sum_j y_j  s.t. S = I - sum_j y_j G_j PSD, s = y >= 0
// with G_j = u_j v_j^T + v_j u_j^T, u_j = [a_j; 0], v_j = [0; b_j]. Mehrotra's predictor-corrector
// with the HKM direction, the same iteration, tolerances and stopping rule as the Python one; its
// linear algebra is written here (Cholesky factors and their inverses, LU with partial pivoting
// for the N x N Newton system, the smallest eigenvalue of a symmetric matrix by Householder
// tridiagonalization and bisection on Sturm counts), so a problem costs no per-matrix call
// overhead. Scalar IEEE operations in a fixed order (no fast-math, no contraction): a problem's
// result is the same bits on every x86-64 processor, whatever else is solved beside it.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

typedef std::vector<double> Vec;

// a (r x c, row-major) times b (c x s) into out (r x s)
void matmul(const double* a, const double* b, double* out, int64_t r, int64_t c, int64_t s) {
  for (int64_t i = 0; i < r * s; ++i) out[i] = 0.0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t l = 0; l < c; ++l) {
      const double f = a[i * c + l];
      for (int64_t j = 0; j < s; ++j) out[i * s + j] += f * b[l * s + j];
    }
}

// M <- (M + M^T) / 2 (k x k)
void sym(double* M, int64_t k) {
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = i + 1; j < k; ++j) {
      const double v = 0.5 * (M[i * k + j] + M[j * k + i]);
      M[i * k + j] = v;
      M[j * k + i] = v;
    }
}

// The lower Cholesky factor of the symmetric M (k x k) into L; false where M is not positive
// definite (a pivot <= 0 or not finite).
bool cholesky(const double* M, double* L, int64_t k) {
  for (int64_t i = 0; i < k * k; ++i) L[i] = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    double s = M[j * k + j];
    for (int64_t l = 0; l < j; ++l) s -= L[j * k + l] * L[j * k + l];
    if (!(s > 0.0) || !std::isfinite(s)) return false;
    const double djj = std::sqrt(s);
    L[j * k + j] = djj;
    for (int64_t i = j + 1; i < k; ++i) {
      double t = M[i * k + j];
      for (int64_t l = 0; l < j; ++l) t -= L[i * k + l] * L[j * k + l];
      L[i * k + j] = t / djj;
    }
  }
  return true;
}

// The inverse of the lower-triangular L (k x k) into Li (lower triangular)
void lower_inverse(const double* L, double* Li, int64_t k) {
  for (int64_t i = 0; i < k * k; ++i) Li[i] = 0.0;
  for (int64_t c = 0; c < k; ++c) {             // column c of L^-1: forward substitution on e_c
    Li[c * k + c] = 1.0 / L[c * k + c];
    for (int64_t i = c + 1; i < k; ++i) {
      double t = 0.0;
      for (int64_t l = c; l < i; ++l) t += L[i * k + l] * Li[l * k + c];
      Li[i * k + c] = -t / L[i * k + i];
    }
  }
}

// M = P L U (N x N) by partial pivoting, in place: U on and above the diagonal, L's multipliers
// below it (0 where a row needed no elimination), the rows swapped as they went (step c swapped row
// c with row piv[c]); false where a pivot is 0. lu_apply then solves with it: the same operations
// in the same order as eliminating the right-hand side alongside, so the same bits, and one
// factorization serves the predictor's and the corrector's solves.
bool lu_factor(double* M, int64_t* piv, int64_t N) {
  for (int64_t c = 0; c < N; ++c) {
    int64_t best = c;
    for (int64_t r = c + 1; r < N; ++r)
      if (std::fabs(M[r * N + c]) > std::fabs(M[best * N + c])) best = r;
    piv[c] = best;
    if (!(M[best * N + c] != 0.0)) return false;
    if (best != c)
      for (int64_t j = 0; j < N; ++j) std::swap(M[c * N + j], M[best * N + j]);
    const double inv = 1.0 / M[c * N + c];
    for (int64_t r = c + 1; r < N; ++r) {
      const double f = M[r * N + c] * inv;
      M[r * N + c] = f;
      if (f == 0.0) continue;
      for (int64_t j = c + 1; j < N; ++j) M[r * N + j] -= f * M[c * N + j];
    }
  }
  return true;
}

// x = M^-1 x with lu_factor's LU and piv: the row swaps, L's elimination in the order of the
// columns, then back substitution; false where the result is not finite
bool lu_apply(const double* LU, const int64_t* piv, double* x, int64_t N) {
  for (int64_t c = 0; c < N; ++c)
    if (piv[c] != c) std::swap(x[c], x[piv[c]]);
  for (int64_t c = 0; c < N; ++c) {
    const double xc = x[c];
    for (int64_t r = c + 1; r < N; ++r) {
      const double f = LU[r * N + c];
      if (f == 0.0) continue;
      x[r] -= f * xc;
    }
  }
  for (int64_t r = N - 1; r >= 0; --r) {
    double t = x[r];
    for (int64_t j = r + 1; j < N; ++j) t -= LU[r * N + j] * x[j];
    x[r] = t / LU[r * N + r];
    if (!std::isfinite(x[r])) return false;
  }
  return true;
}

// The smallest eigenvalue of the symmetric A (k x k, overwritten): Householder reduction to a
// tridiagonal matrix, then bisection on its Sturm counts to an absolute accuracy of a few
// machine epsilons times its norm (LAPACK's eigvalsh reaches the same order); ``floor`` itself
// where no eigenvalue is below it (the caller needs no more). NaN where A is not finite.
double min_eigenvalue(double* A, int64_t k, Vec& v, Vec& w, double floor) {
  for (int64_t i = 0; i < k * k; ++i)
    if (!std::isfinite(A[i])) return std::numeric_limits<double>::quiet_NaN();
  for (int64_t c = 0; c + 2 < k; ++c) {
    const int64_t m = k - c - 1;                    // the trailing block's size
    double scale = 0.0;
    for (int64_t i = 0; i < m; ++i) scale = std::fmax(scale, std::fabs(A[(c + 1 + i) * k + c]));
    if (scale == 0.0) continue;
    double nrm2 = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      v[i] = A[(c + 1 + i) * k + c] / scale;
      nrm2 += v[i] * v[i];
    }
    const double nrm = std::sqrt(nrm2);
    const double alpha = v[0] > 0 ? -nrm : nrm;     // H x = alpha scale e_1
    v[0] -= alpha;
    double vtv = 0.0;
    for (int64_t i = 0; i < m; ++i) vtv += v[i] * v[i];
    if (!(vtv > 0.0)) continue;
    const double beta = 2.0 / vtv;
    for (int64_t i = 0; i < m; ++i) w[i] = 0.0;     // w = beta A22 v (A22 symmetric: by its rows)
    for (int64_t j = 0; j < m; ++j) {
      const double f = v[j];
      for (int64_t i = 0; i < m; ++i) w[i] += f * A[(c + 1 + j) * k + c + 1 + i];
    }
    for (int64_t i = 0; i < m; ++i) w[i] = beta * w[i];
    double vw = 0.0;
    for (int64_t i = 0; i < m; ++i) vw += v[i] * w[i];
    const double K = 0.5 * beta * vw;
    for (int64_t i = 0; i < m; ++i) w[i] -= K * v[i];   // A22 <- A22 - v w^T - w v^T
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) A[(c + 1 + i) * k + c + 1 + j] -= v[i] * w[j] + w[i] * v[j];
    A[(c + 1) * k + c] = alpha * scale;
    A[c * k + c + 1] = alpha * scale;
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, top = 0.0;
  for (int64_t i = 0; i < k; ++i) {               // Gershgorin's interval
    const double e0 = i > 0 ? std::fabs(A[i * k + i - 1]) : 0.0;
    const double e1 = i + 1 < k ? std::fabs(A[(i + 1) * k + i]) : 0.0;
    lo = std::fmin(lo, A[i * k + i] - e0 - e1);
    hi = std::fmax(hi, A[i * k + i] + e0 + e1);
    top = std::fmax(top, std::fmax(std::fabs(A[i * k + i] - e0 - e1), std::fabs(A[i * k + i] + e0 + e1)));
  }
  if (top == 0.0) return std::fmax(0.0, floor);
  hi += 4.0 * std::numeric_limits<double>::epsilon() * top;     // (so that every eigenvalue is below hi)
  const double eps = std::numeric_limits<double>::epsilon();
  const double pivmin = std::numeric_limits<double>::min() * std::fmax(1.0, top * top);
  auto below = [&](double x) {                    // how many eigenvalues are < x (Sturm count)
    int64_t count = 0;
    double d = A[0] - x;
    if (std::fabs(d) < pivmin) d = -pivmin;
    if (d < 0) ++count;
    for (int64_t i = 1; i < k; ++i) {
      const double e = A[i * k + i - 1];
      d = A[i * k + i] - x - e * e / d;
      if (std::fabs(d) < pivmin) d = -pivmin;
      if (d < 0) ++count;
    }
    return count;
  };
  if (below(floor) == 0) return floor;
  hi = std::fmin(hi, floor);
  const double tol = 2.0 * eps * top;
  for (int it = 0; it < 200 && hi - lo > tol; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    if (below(mid) >= 1) hi = mid;
    else lo = mid;
  }
  return 0.5 * (lo + hi);
}

struct Problem {
  int64_t N, p, q, k;
  const double* a;   // (p, N): column j is a_j
  const double* b;   // (q, N): column j is b_j
};

// t = M12 b (p x N): the off-diagonal block of M (k x k) times the b's
void m12_b(const Problem& P, const double* M, Vec& t) {
  const int64_t N = P.N, p = P.p, q = P.q, k = P.k;
  for (int64_t i = 0; i < p * N; ++i) t[i] = 0.0;     // t = M12 b (p x N)
  for (int64_t i = 0; i < p; ++i)
    for (int64_t l = 0; l < q; ++l) {
      const double f = M[i * k + p + l];
      for (int64_t j = 0; j < N; ++j) t[i * N + j] += f * P.b[l * N + j];
    }
}

// out_j = <G_j, M> = 2 a_j^T M12 b_j for the symmetric M (k x k)
void gop(const Problem& P, const double* M, double* out, Vec& t) {
  const int64_t N = P.N, p = P.p;
  m12_b(P, M, t);
  for (int64_t j = 0; j < N; ++j) out[j] = 0.0;
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < N; ++j) out[j] += P.a[i * N + j] * t[i * N + j];
  for (int64_t j = 0; j < N; ++j) out[j] = 2.0 * out[j];
}

// M = sum_j v_j G_j (k x k): zero diagonal blocks, M12 = sum_j v_j a_j b_j^T and M21 = M12^T
// (bT: b transposed, (N, q))
void gsum(const Problem& P, const double* v, double* M, const double* bT, Vec& t) {
  const int64_t N = P.N, p = P.p, q = P.q, k = P.k;
  for (int64_t i = 0; i < k * k; ++i) M[i] = 0.0;
  for (int64_t i = 0; i < p * q; ++i) t[i] = 0.0;
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const double f = P.a[i * N + j] * v[j];
      for (int64_t l = 0; l < q; ++l) t[i * q + l] += f * bT[j * q + l];
    }
  for (int64_t i = 0; i < p; ++i)
    for (int64_t l = 0; l < q; ++l) {
      M[i * k + p + l] = t[i * q + l];
      M[(p + l) * k + i] = t[i * q + l];
    }
}

// U^T Mblock U for columns U (r x N, the a's or the b's) and the r x r block of M at (o, o): (N x N)
void congruence(const double* U, const double* M, int64_t k, int64_t o, int64_t r, int64_t N, double* out,
                Vec& t) {
  for (int64_t i = 0; i < r * N; ++i) t[i] = 0.0;     // t = Mblock U (r x N)
  for (int64_t i = 0; i < r; ++i)
    for (int64_t l = 0; l < r; ++l) {
      const double f = M[(o + i) * k + o + l];
      for (int64_t j = 0; j < N; ++j) t[i * N + j] += f * U[l * N + j];
    }
  for (int64_t i = 0; i < N * N; ++i) out[i] = 0.0;
  for (int64_t l = 0; l < r; ++l)
    for (int64_t j = 0; j < N; ++j) {
      const double f = U[l * N + j];
      for (int64_t i = 0; i < N; ++i) out[j * N + i] += f * t[l * N + i];
    }
}

// out (N x N): out_ji = a_j^T M12 b_i
void cross(const Problem& P, const double* M, double* out, Vec& t) {
  const int64_t N = P.N, p = P.p;
  m12_b(P, M, t);
  for (int64_t i = 0; i < N * N; ++i) out[i] = 0.0;
  for (int64_t l = 0; l < p; ++l)
    for (int64_t j = 0; j < N; ++j) {
      const double f = P.a[l * N + j];
      for (int64_t i = 0; i < N; ++i) out[j * N + i] += f * t[l * N + i];
    }
}

// The largest alpha with M + alpha dM PSD given Li = L^-1 (M = L L^T, Li lower triangular), or
// ``cap`` where that alpha is at least cap (the caller takes no step longer than cap): the
// eigenvalue's bisection only runs where the step is shorter
double max_step(const double* Li, const double* dM, int64_t k, Vec& t1, Vec& t2, Vec& v, Vec& w, double cap) {
  for (int64_t i = 0; i < k * k; ++i) t1[i] = 0.0, t2[i] = 0.0;
  for (int64_t i = 0; i < k; ++i)                     // t1 = Li dM
    for (int64_t l = 0; l <= i; ++l) {
      const double f = Li[i * k + l];
      for (int64_t j = 0; j < k; ++j) t1[i * k + j] += f * dM[l * k + j];
    }
  double* LiT = v.data() + k;                         // (k x k scratch after the first k)
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) LiT[j * k + i] = Li[i * k + j];
  for (int64_t i = 0; i < k; ++i)                     // t2 = t1 Li^T (Li^T upper triangular)
    for (int64_t l = 0; l < k; ++l) {
      const double f = t1[i * k + l];
      for (int64_t j = l; j < k; ++j) t2[i * k + j] += f * LiT[l * k + j];
    }
  sym(t2.data(), k);
  const double floor = -1.0 / cap;
  const double lam = min_eigenvalue(t2.data(), k, v, w, floor);
  if (std::isnan(lam)) return lam;
  return lam >= floor ? cap : -1.0 / lam;
}

double vec_step(const double* v, const double* dv, int64_t N) {
  double out = std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < N; ++j)
    if (dv[j] < 0) out = std::fmin(out, -v[j] / dv[j]);
  return out;
}

double frob2(const double* M, int64_t size) {
  double s = 0.0;
  for (int64_t i = 0; i < size; ++i) s += M[i] * M[i];
  return s;
}

bool all_finite(const double* M, int64_t size) {
  for (int64_t i = 0; i < size; ++i)
    if (!std::isfinite(M[i])) return false;
  return true;
}

}  // namespace

// Solves one problem: a (p, N) and b (q, N) hold the rank-one factors a_j, b_j as columns. On
// success (return 0) w (p*q, row-major) is the solution, y (N) the multipliers and *iterations
// the iteration at which the stopping rule held. Otherwise the caller solves the problem another
// way: 1, not converged in max_iter iterations or a step limit not computed; 2, X or S without a
// Cholesky factor; 3, a residual or an inverse factor not finite; 4 and 5, a singular Newton
// system in the predictor or the corrector.
extern "C" int SvmattnNucIpm(int64_t N, int64_t p, int64_t q, const double* a, const double* b, int64_t max_iter,
                             double tol_gap, double tol_feas, double step, double* w, double* y_out,
                             int64_t* iterations) {
  const int64_t k = p + q, kk = k * k, NN = N * N;
  const Problem P{N, p, q, k, a, b};
  Vec X(kk, 0.0), S(kk, 0.0), x(N, 1.0), s(N, 1.0), y(N, 0.0);
  for (int64_t i = 0; i < k; ++i) X[i * k + i] = S[i * k + i] = 1.0;
  Vec Lx(kk), Ls(kk), Lxi(kk), Lsi(kk), Y(kk), Rd(kk), G(kk), XRdY(kk), R(kk), dX(kk), dS(kk), cX(kk), t1(kk),
      t2(kk), Rm(kk);
  Vec rp(N), rl(N), xs(N), rhs(N), dx(N), dy(N), ds(N), comp(N), g(N), dxp(N);
  Vec H(NN), M(NN), C1(NN), C2(NN), tp(std::max(std::max(p, q) * N, p * q)), ev(k + k * k), ew(k);
  Vec bT(N * q), LU(NN);
  std::vector<int64_t> piv(N);
  bool factored = false;          // LU = M's factors this iteration (lu_factor)
  for (int64_t l = 0; l < q; ++l)
    for (int64_t j = 0; j < N; ++j) bT[j * q + l] = b[l * N + j];

  // The HKM direction for sigma_mu, with the corrector's terms corr_mat (k x k) and corr_vec (N)
  // where given: dX = sym(R - X dS Y), R = sigma_mu Y - X - corr_mat; dS = Rd - sum_i dy_i G_i.
  auto direction = [&](double sigma_mu, const double* corr_mat, const double* corr_vec) -> bool {
    for (int64_t i = 0; i < kk; ++i) R[i] = sigma_mu * Y[i] - X[i] - (corr_mat ? corr_mat[i] : 0.0);
    for (int64_t j = 0; j < N; ++j) comp[j] = sigma_mu - x[j] * s[j] - (corr_vec ? corr_vec[j] : 0.0);
    for (int64_t i = 0; i < kk; ++i) Rm[i] = R[i] - XRdY[i];
    sym(Rm.data(), k);
    gop(P, Rm.data(), g.data(), tp);
    for (int64_t j = 0; j < N; ++j) rhs[j] = rp[j] - g[j] + comp[j] / s[j] - xs[j] * rl[j];
    for (int64_t j = 0; j < N; ++j) dy[j] = rhs[j];
    if (!factored || !lu_apply(LU.data(), piv.data(), dy.data(), N)) return false;
    gsum(P, dy.data(), G.data(), bT.data(), tp);
    for (int64_t i = 0; i < kk; ++i) dS[i] = Rd[i] - G[i];
    matmul(X.data(), dS.data(), t1.data(), k, k, k);    // X dS Y
    matmul(t1.data(), Y.data(), t2.data(), k, k, k);
    for (int64_t i = 0; i < kk; ++i) dX[i] = R[i] - t2[i];
    sym(dX.data(), k);
    for (int64_t j = 0; j < N; ++j) ds[j] = rl[j] + dy[j];
    for (int64_t j = 0; j < N; ++j) dx[j] = comp[j] / s[j] - xs[j] * ds[j];
    return true;
  };

  for (int64_t it = 0; it < max_iter; ++it) {
    gop(P, X.data(), g.data(), tp);
    for (int64_t j = 0; j < N; ++j) rp[j] = 1.0 - (g[j] - x[j]);
    gsum(P, y.data(), G.data(), bT.data(), tp);
    for (int64_t i = 0; i < kk; ++i) Rd[i] = ((i % (k + 1)) == 0 ? 1.0 : 0.0) - G[i] - S[i];
    for (int64_t j = 0; j < N; ++j) rl[j] = y[j] - s[j];
    double gap = 0.0, pobj = 0.0, dobj = 0.0;
    for (int64_t i = 0; i < kk; ++i) gap += X[i] * S[i];
    for (int64_t j = 0; j < N; ++j) gap += x[j] * s[j];
    for (int64_t i = 0; i < k; ++i) pobj += X[i * k + i];
    for (int64_t j = 0; j < N; ++j) dobj += y[j];
    const double mu = gap / static_cast<double>(k + N);
    const double rp_norm = std::sqrt(frob2(rp.data(), N)), rl_norm = std::sqrt(frob2(rl.data(), N));
    const double rd_norm = std::sqrt(frob2(Rd.data(), kk));
    if (gap / (1.0 + std::fabs(pobj) + std::fabs(dobj)) < tol_gap
        && rp_norm / (1.0 + std::sqrt(static_cast<double>(N))) < tol_feas
        && (rd_norm + rl_norm) / (1.0 + std::sqrt(static_cast<double>(k))) < tol_feas) {
      for (int64_t i = 0; i < p; ++i)
        for (int64_t l = 0; l < q; ++l) w[i * q + l] = 2.0 * X[i * k + p + l];
      for (int64_t j = 0; j < N; ++j) y_out[j] = y[j];
      *iterations = it;
      return 0;
    }
    if (!cholesky(X.data(), Lx.data(), k) || !cholesky(S.data(), Ls.data(), k)) return 2;
    lower_inverse(Lx.data(), Lxi.data(), k);
    lower_inverse(Ls.data(), Lsi.data(), k);
    for (int64_t i = 0; i < kk; ++i) Y[i] = 0.0;          // Y = S^-1 = Lsi^T Lsi
    for (int64_t l = 0; l < k; ++l)
      for (int64_t i = 0; i <= l; ++i) {
        const double f = Lsi[l * k + i];
        for (int64_t j = 0; j <= l; ++j) Y[i * k + j] += f * Lsi[l * k + j];
      }
    if (!std::isfinite(gap) || !all_finite(rp.data(), N) || !all_finite(Rd.data(), kk)
        || !all_finite(Lxi.data(), kk) || !all_finite(Lsi.data(), kk))
      return 3;
    // H_ji = tr(G_j X G_i Y): (a_i^T X12 b_j)(a_j^T Y12 b_i) twice (transposed) and the products of
    // the diagonal blocks' congruences
    cross(P, X.data(), C1.data(), tp);
    cross(P, Y.data(), C2.data(), tp);
    for (int64_t j = 0; j < N; ++j)
      for (int64_t i = 0; i < N; ++i) H[j * N + i] = C1[i * N + j] * C2[j * N + i];
    for (int64_t j = 0; j < N; ++j)
      for (int64_t i = 0; i < N; ++i) M[j * N + i] = H[j * N + i] + H[i * N + j];
    congruence(b, X.data(), k, p, q, N, C1.data(), tp);   // b^T X22 b
    congruence(a, Y.data(), k, 0, p, N, C2.data(), tp);   // a^T Y11 a
    for (int64_t i = 0; i < NN; ++i) M[i] += C1[i] * C2[i];
    congruence(a, X.data(), k, 0, p, N, C1.data(), tp);   // a^T X11 a
    congruence(b, Y.data(), k, p, q, N, C2.data(), tp);   // b^T Y22 b
    for (int64_t i = 0; i < NN; ++i) M[i] += C1[i] * C2[i];
    for (int64_t j = 0; j < N; ++j) xs[j] = x[j] / s[j];
    for (int64_t j = 0; j < N; ++j) M[j * N + j] += xs[j];
    matmul(X.data(), Rd.data(), t1.data(), k, k, k);      // X Rd Y
    matmul(t1.data(), Y.data(), XRdY.data(), k, k, k);
    for (int64_t i = 0; i < NN; ++i) LU[i] = M[i];
    factored = lu_factor(LU.data(), piv.data(), N);       // (a zero pivot fails the predictor's solve)

    // predictor
    if (!direction(0.0, nullptr, nullptr)) return 4;
    // (steps of 1 at most: where the cone allows 1 or more, its exact limit does not matter)
    double ap = std::fmin(1.0, std::fmin(max_step(Lxi.data(), dX.data(), k, t1, t2, ev, ew, 1.0),
                                         vec_step(x.data(), dx.data(), N)));
    double ad = std::fmin(1.0, std::fmin(max_step(Lsi.data(), dS.data(), k, t1, t2, ev, ew, 1.0),
                                         vec_step(s.data(), ds.data(), N)));
    if (std::isnan(ap) || std::isnan(ad)) return 1;
    double gap_aff = 0.0;
    for (int64_t i = 0; i < kk; ++i) gap_aff += (X[i] + ap * dX[i]) * (S[i] + ad * dS[i]);
    for (int64_t j = 0; j < N; ++j) gap_aff += (x[j] + ap * dx[j]) * (s[j] + ad * ds[j]);
    const double ratio = gap_aff / gap, sigma = ratio * ratio * ratio;
    // corrector: the second-order terms of the predictor's direction
    matmul(dX.data(), dS.data(), t1.data(), k, k, k);     // dX dS Y
    matmul(t1.data(), Y.data(), cX.data(), k, k, k);
    for (int64_t j = 0; j < N; ++j) dxp[j] = dx[j] * ds[j];
    if (!direction(sigma * mu, cX.data(), dxp.data())) return 5;
    // (step times the limit, 1 at most: a limit of 1 / step or more gives 1)
    ap = std::fmin(1.0, step * std::fmin(max_step(Lxi.data(), dX.data(), k, t1, t2, ev, ew, 1.0 / step),
                                         vec_step(x.data(), dx.data(), N)));
    ad = std::fmin(1.0, step * std::fmin(max_step(Lsi.data(), dS.data(), k, t1, t2, ev, ew, 1.0 / step),
                                         vec_step(s.data(), ds.data(), N)));
    if (std::isnan(ap) || std::isnan(ad)) return 1;
    for (int64_t i = 0; i < kk; ++i) X[i] = X[i] + ap * dX[i];
    sym(X.data(), k);
    for (int64_t j = 0; j < N; ++j) x[j] = x[j] + ap * dx[j];
    for (int64_t i = 0; i < kk; ++i) S[i] = S[i] + ad * dS[i];
    sym(S.data(), k);
    for (int64_t j = 0; j < N; ++j) y[j] = y[j] + ad * dy[j];
    for (int64_t j = 0; j < N; ++j) s[j] = s[j] + ad * ds[j];
  }
  return 1;
}
