r"""E1: the 2-D picture of global convergence (SCIENCE.md section 8, the paper's Figure 1).

n=2 sequences of T=3 tokens in d=2, labels Y=+1; tokens 0.3 N(0,1) shifted by
(-1,0) for sequence 1 and (+1,0) for sequence 2 (``two_clusters``); queries z_i and
head v unit Gaussian. Normalized GD (lr 0.1, 2000 steps) from W(0)=0, and for
(K,Q) from Q(0)=0, K(0)=0.1 N(0,1) (init scheme "zero"). Writes to --out:
  results.npz   data (X, Y, Z, v), optimal tokens, SVM solutions, W(k) and K(k)Q(k)^T
                at every snapshot, final correlations
  summary.json  final correlations with the SVMs of the optimal tokens, checks, timings
  paths.png     tokens (stars: optimal tokens), the normalized paths W(k) z_i / ||W(k)||_F,
                the rays W^mm z_i (solid) and W^mm_* z_i (dashed); left W, right (K,Q)

    python -m experiments.paths_2d --out=results/e1
    python -m experiments.paths_2d --out=/tmp/e1 --steps=500      # quick
"""
from __future__ import annotations


from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import common
from svmattn.data import datasets as data_lib
from svmattn.models import heads
from svmattn.analysis import metrics
from svmattn.io import plots
from svmattn.io import progress as progress_lib
from svmattn.io import results
from svmattn.svm import att_svm as svm_lib
from svmattn.train import loop as train_lib

FLAGS = flags.FLAGS
common.define_common_flags(runs=16)
flags.DEFINE_integer("n", 2, "Sequences per data set (cluster centres spread evenly over [-1, 1] x {0}).")
flags.DEFINE_integer("T", 3, "Tokens per sequence.")
flags.DEFINE_integer("d", 2, "Embedding dimension (the picture needs d = 2).")
flags.DEFINE_integer("steps", 2000, "Normalized GD steps.")
flags.DEFINE_float("lr", 0.1, "Learning rate (step size eta).")
flags.DEFINE_integer("snapshot_every", 1, "Record W every this many steps (the drawn path).")
flags.DEFINE_integer("draw_run", -1, "Index (into the data sets) of the data set drawn in paths.png; -1: the "
                     "first whose picture can separate the predictions (see pick_drawn), else data set 0.")

NOISE = 0.3      # token noise scale
SHIFT = 1.0      # |cluster centre|
NORM_NAME = {"fro": "Frobenius", "nuc": "nuclear"}
OWN_NORM = common.own_norms()


def two_clusters(key: jax.Array, spec: data_lib.DataSpec, head: heads.Head, dtype=jnp.float64) -> data_lib.Dataset:
  """E1 generator for one data set: x_it = 0.3 N(0, I_d) + c_i with cluster centres
  c_i = (-1 + 2 i / (n - 1), 0, ..., 0) ((-1,0) and (+1,0) for n=2; c = 0 for n=1);
  z_i and v unit Gaussian; Y = +1. X (n,T,d), Y (n,), Z (n,d), v from ``head.init``."""
  kx, kz, kv = jax.random.split(key, 3)
  n, d = spec.n, spec.d
  centre = jnp.linspace(-SHIFT, SHIFT, n, dtype=dtype) if n > 1 else jnp.zeros((1,), dtype)
  shift = jnp.zeros((n, 1, d), dtype).at[:, 0, 0].set(centre)
  X = NOISE * data_lib.normal(kx, (n, spec.T, d), dtype) + shift
  Z = data_lib.normal(kz, (n, d), dtype)
  Z = Z / jnp.linalg.norm(Z, axis=-1, keepdims=True)
  return data_lib.Dataset(X, jnp.ones((n,), dtype), Z, head.init(kv, d, dtype))


def main(argv):
  del argv
  timer = common.Timer()
  spec = data_lib.DataSpec(FLAGS.n, FLAGS.T, FLAGS.d, labels="positive").validate()
  with timer("data"):
    if FLAGS.data:
      data, runs = common.load_or_generate(spec)
    else:
      if FLAGS.runs < 1:
        raise app.UsageError(f"--runs must be >= 1, got {FLAGS.runs}")
      runs = np.arange(FLAGS.runs)
      data = data_lib.generate(spec, FLAGS.seed, runs, heads.LINEAR, sampler=two_clusters,
                               dtype=common.dtype())
  B, n, T, d = data.X.shape
  if not -1 <= FLAGS.draw_run < B:
    raise app.UsageError(f"--draw_run must be -1 (auto) or in [0, {B}), got {FLAGS.draw_run}")
  logging.info("E1: %d data sets, n=%d T=%d d=%d, %d steps", B, n, T, d, FLAGS.steps)
  gamma = np.asarray(jax.vmap(lambda v, X, Y: heads.token_scores(heads.LINEAR, v, X, Y))(
      data.v, data.X, data.Y), np.float64)
  opt = metrics.optimal_tokens(gamma)

  trajectories = {}
  for p in ("W", "KQ"):
    config = train_lib.TrainConfig(param=p, lr=FLAGS.lr, steps=FLAGS.steps, snapshot_every=FLAGS.snapshot_every,
                                   chunk_steps=max(FLAGS.snapshot_every, 500), init="zero")
    with timer(f"train_{p}"):
      with progress_lib.Progress(f"train {p}", FLAGS.steps, "steps", enabled=FLAGS.progress) as bar:
        trajectories[p] = train_lib.train(config, data, train_lib.init_keys(FLAGS.seed, runs), bar.update)

  with timer("svm"):
    X, Z = np.asarray(data.X, np.float64), np.asarray(data.Z, np.float64)
    svms = {norm: svm_lib.stack([svm_lib.att_svm(X[b], Z[b], opt[b], norm) for b in range(B)], d)
            for norm in svm_lib.NORMS}

  drawn = FLAGS.draw_run if FLAGS.draw_run >= 0 else pick_drawn(Z, svms["fro"]["W"], svms["nuc"]["W"])
  arrays = {"runs": runs, "X": X, "Y": np.asarray(data.Y), "Z": Z, "v": np.asarray(data.v), "optimal_tokens": opt,
            "token_scores": gamma, "steps": trajectories["W"].steps}
  summary = {"experiment": "E1 2-D paths", "flags": common.flag_values(), "data_sets": B,
             "shape": {"n": n, "T": T, "d": d}, "drawn_data_set": int(drawn), "final_corr": {}, "selected_opt": {},
             "svm_status": {norm: {s: int(np.sum(svms[norm]["status"] == s)) for s in svm_lib.STATUSES}
                            for norm in svm_lib.NORMS}}
  for norm in svm_lib.NORMS:
    arrays[f"svm_{norm}"] = svms[norm]["W"]
    arrays[f"svm_{norm}_status"] = svms[norm]["status"]
  for p, tr in trajectories.items():
    arrays[f"W_{p}"] = tr.W
    arrays[f"selected_{p}"] = tr.selected
    arrays[f"loss_{p}"] = tr.loss
    summary["selected_opt"][p] = float(np.mean(np.all(tr.selected == opt, axis=1)))
    for norm in svm_lib.NORMS:
      final = metrics.corr(tr.W_final, svms[norm]["W"])
      arrays[f"corr_{p}_{norm}"] = final
      ok = np.isfinite(final)
      summary["final_corr"][f"{p}_vs_{norm}"] = {
          "mean": float(np.mean(final[ok])) if ok.any() else None,
          "min": float(np.min(final[ok])) if ok.any() else None, "solved": int(ok.sum())}
  summary["checks"] = make_checks(arrays, opt)

  with timer("write"):
    results.write_npz(f"{FLAGS.out}/results.npz", arrays)
    if d == 2:
      draw(arrays, drawn, FLAGS.out)
    else:
      logging.warning("d=%d: paths.png needs d = 2 and is not drawn", d)
  summary["timings_s"] = {"compile": {p: tr.compile_seconds for p, tr in trajectories.items()},
                          **timer.seconds, "total": timer.total()}
  summary["environment"] = common.environment()
  results.write_json(f"{FLAGS.out}/summary.json", summary)
  report(summary)


def pick_drawn(Z: np.ndarray, fro: np.ndarray, nuc: np.ndarray, max_cos: float = 0.5,
               max_corr: float = 0.98) -> int:
  """The first data set whose picture separates the predictions: queries far apart in
  direction (max_{i<j} |cos(z_i, z_j)| <= max_cos; when z_1 ~ z_2 the rays W z_i
  coincide) and Frobenius and nuclear SVMs of distinct directions (corr <= max_corr;
  otherwise solid and dashed rays coincide, e.g. for a rank-one W^mm). Z (B,n,d),
  fro / nuc (B,d,d) (NaN where unsolved). 0 if no data set qualifies. The rule looks
  at the data and the SVMs only, never at the trained paths."""
  Zn = Z / np.linalg.norm(Z, axis=-1, keepdims=True)
  n = Z.shape[1]
  distinct = metrics.corr(fro, nuc) <= max_corr          # NaN (unsolved) -> False
  for b in range(len(Z)):
    cos = np.abs(Zn[b] @ Zn[b].T)[np.triu_indices(n, 1)]
    if distinct[b] and (cos.size == 0 or np.max(cos) <= max_cos):
      return b
  return 0


def make_checks(arrays, opt):
  """Final-direction correlations with the SVMs of the optimal tokens, and global selection."""
  checks = []
  for p, what in (("W", "W"), ("KQ", "K Q^T")):
    norm = OWN_NORM[p]
    corr = arrays[f"corr_{p}_{norm}"]
    ok = np.isfinite(corr)
    value = float(np.min(corr[ok])) if ok.all() else float("nan")
    checks.append({"name": f"min over data sets of corr(final {what}, {NORM_NAME[norm]} W^mm(opt))",
                   "value": value, "expected": ">= 0.99 (converges to the SVM direction)",
                   "ok": bool(ok.all() and value >= 0.99)})
    share = float(np.mean(np.all(arrays[f"selected_{p}"] == opt, axis=1)))
    checks.append({"name": f"{p}: share of data sets whose final attention selects the optimal tokens",
                   "value": share, "expected": "1 (global convergence from W(0)=0 / Q(0)=0)",
                   "ok": bool(share == 1.0)})
  return checks


def draw(arrays, b, out):
  """Tokens, normalized paths W(k) z_i / ||W(k)||_F and the SVM rays, W left, (K,Q) right."""
  X, Z, opt = arrays["X"][b], arrays["Z"][b], arrays["optimal_tokens"][b]
  n = X.shape[0]
  seq_colors = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange"]
  token_colors = ["c", "y", "lightgreen", "plum", "wheat"]
  markers = ["d", "o", "s", "^", "v"]
  fig, axes = plots.figure(ncols=2, width=5.2, height=5.0)
  lim = 1.15 * max(1.0, float(np.max(np.abs(X))))
  for ax, p, title in zip(axes, ("W", "KQ"), ("W-parameterization", "(K,Q)-parameterization")):
    for i in range(n):
      c, mk = seq_colors[i % 5], markers[i % 5]
      for t in range(X.shape[1]):
        star = t == opt[i]
        ax.scatter(X[i, t, 0], X[i, t, 1], marker="*" if star else mk, s=260 if star else 90,
                   color=token_colors[i % 5], edgecolors="black", linewidths=1.2, zorder=3)
      for norm, style in (("fro", "-"), ("nuc", "--")):
        Wm = arrays[f"svm_{norm}"][b]
        if np.all(np.isfinite(Wm)):
          ray = Wm @ Z[i]
          ray = 2 * lim * ray / max(np.linalg.norm(ray), 1e-300)
          ax.plot([0, ray[0]], [0, ray[1]], color=c, linestyle=style, lw=1.5, zorder=1)
      Ws = arrays[f"W_{p}"][b]                                   # (S, d, d)
      norms = np.linalg.norm(Ws, axis=(1, 2))
      keep = norms > 0
      path = np.einsum("sde,e->sd", Ws[keep], Z[i]) / norms[keep, None]
      ax.plot(path[:, 0], path[:, 1], color=c, lw=2.5, alpha=0.8, zorder=2)
      ax.scatter(path[-1, 0], path[-1, 1], color=c, marker="x", s=60, zorder=4)
    ax.axhline(0, color="0.85", lw=0.8, zorder=0)
    ax.axvline(0, color="0.85", lw=0.8, zorder=0)
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title=title, xlabel="coordinate 1",
           ylabel="coordinate 2")
  handles = [plots.plt.Line2D([], [], color=seq_colors[i % 5], lw=2.5, label=rf"$W(k)z_{i + 1}/\|W(k)\|_F$")
             for i in range(n)]
  handles += [plots.plt.Line2D([], [], color="k", lw=1.5, label=r"ray $W^{mm}z_i$ (Frobenius)"),
              plots.plt.Line2D([], [], color="k", lw=1.5, ls="--", label=r"ray $W^{mm}_\star z_i$ (nuclear)"),
              plots.plt.Line2D([], [], color="w", marker="*", markerfacecolor="0.6", markeredgecolor="k",
                               markersize=13, label="optimal token"),
              plots.plt.Line2D([], [], color="k", marker="x", lw=0, label="final step")]
  fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, -0.1))
  plots.save(fig, f"{out}/paths.png")


def report(summary):
  lines = [f"E1 2-D paths: {summary['data_sets']} data set(s)"]
  for key, v in summary["final_corr"].items():
    if v["mean"] is not None:
      lines.append(f"  final corr {key:<10} {v['mean']:.5f} (min {v['min']:.5f})")
  common.print_report(lines, summary)


if __name__ == "__main__":
  app.run(main)
