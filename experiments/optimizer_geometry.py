r"""E10: optimizer geometry: what attention converges to under each optimizer (docs/science.md section 10).

For every optimizer of --optimizers (steepest descent in a norm: sd_l1, sd_linf, sd_l<p>,
sd_spectral, sd_nuc; l_p mirror descent md_l<p>; normalized_gd; adam, muon, ...), trains W (and
(K,Q) with --params=W,KQ) on every data set (E2's sizes by default), takes the tokens it selected
and solves the Att-SVM in every norm of --norms at that selection, and writes to --out:
results.npz, summary.json, geometry.png and curves.png (svmattn.studies.optimizer_geometry,
svmattn.figures.optimizer_geometry).

    python -m experiments.optimizer_geometry --out=results/e10
    python -m experiments.optimizer_geometry --out=/tmp/e10 --optimizers=md_l1.75,md_l3 --norms=l1.75,fro,l3 --init=normal
"""
from svmattn.config import flags_front

flags_front.define("optimizer_geometry")

if __name__ == "__main__":
  flags_front.main("optimizer_geometry")
