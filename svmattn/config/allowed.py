"""What a setting allows: conditions on its value's value, shared by the experiments' fields (``config.fields.Field.check``).

Each returns None when the value is fine and "must be ..." when it is not.
"""
from __future__ import annotations

import math
import importlib.util
import os

from svmattn.io import plots
from svmattn.models import attention as model_lib
from svmattn.optim import optimizers

SEED_LIMIT = 2 ** 32   # data set r of seed s: fold_in(PRNGKey(s), r), the seed passed as uint32 (data.generate)


def positive(v):
  """A finite number > 0."""
  return None if v is None or (math.isfinite(v) and v > 0) else "must be a finite number > 0"


def at_least(minimum, what: str = ""):
  def check(v):
    return None if v is None or (math.isfinite(v) and v >= minimum) else f"must be {what or f'>= {minimum}'}"
  return check


def seed(v):
  return None if v is None or 0 <= v < SEED_LIMIT else f"must be an integer in [0, {SEED_LIMIT}) (2^32)"


def int_list(minimum: int = 1, allow_empty: bool = False):
  """Distinct integers >= minimum."""
  def check(values):
    try:
      ints = [int(v) for v in values]
    except (TypeError, ValueError):
      return f"must be a comma-separated list of distinct integers >= {minimum}"
    if (allow_empty or ints) and all(i >= minimum for i in ints) and len(set(ints)) == len(ints):
      return None
    return f"must be a comma-separated list of distinct integers >= {minimum}"
  return check


def float_list(minimum: float = 0.0, strict: bool = True):
  """A non-empty list of distinct finite numbers > (or >=) minimum."""
  def check(values):
    message = (f"must be a comma-separated list of distinct finite numbers {'>' if strict else '>='} {minimum}")
    try:
      xs = [float(v) for v in values]
    except (TypeError, ValueError):
      return message
    ok = (bool(xs) and all(math.isfinite(x) and (x > minimum if strict else x >= minimum) for x in xs)
          and len(set(xs)) == len(xs))
    return None if ok else message
  return check


def one_of(known, what: str):
  def check(values):
    values = [values] if isinstance(values, str) else list(values)
    return None if values and all(v in known for v in values) else f"must list {what} among {sorted(known)}"
  return check


def out_dir(path):
  """Why ``path`` cannot be a results directory (None if it can): an existing file, an empty
  name, or a place where nothing can be written (probed with a directory created and removed
  at once, so that root and read-only file systems are judged right)."""
  if path is None:
    return None
  if not str(path).strip():
    return "must name a directory"
  where = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(where) and not os.path.isdir(where):
    return f"{where} is an existing file, not a directory"
  parent = where
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f"{parent} is a file, so {where} cannot be a directory"
  import tempfile
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".svmattn-probe-", dir=parent))
  except OSError as e:
    return f"cannot write in {parent} ({e.strerror or e})"
  return None


def existing_file(path):
  return None if path is None or os.path.isfile(path) else "no such file"


def optimizer(value):
  """A name ``optim.optimizers.get_optimizer`` accepts (normalized_gd, gd, sd_*, momentum and
  schedule forms such as sd_linf+nesterov0.9@sqrt, an optax optimizer's name)."""
  try:
    optimizers.get_optimizer(value, 0.1)
  except ValueError as e:
    return " ".join(str(e).split())
  except (KeyError, TypeError, AttributeError):
    return "must be normalized_gd, gd or the name of an optax optimizer (e.g. adam, sgd)"
  return None


def own_norms() -> dict[str, str]:
  """{parameterization: the SVM norm it is biased toward} (models.attention.Parameterization.svm_norm)."""
  # (prompt attention's "p" goes with its own model: E11 only)
  return {name: p.svm_norm for name, p in model_lib.PARAMETERIZATIONS.items() if name != "p"}


def params(values):
  known = own_norms()
  return None if values and all(v in known for v in values) else f"must list parameterizations among {sorted(known)}"


def figure_formats(values):
  formats = [str(f).strip().lower() for f in values]
  if not formats or any(f not in plots.FORMATS for f in formats):
    return f"must list formats among {', '.join(plots.FORMATS)}, got {','.join(map(str, values))}"
  return None


def init(value):
  """An initialization scheme's name or an existing .npz file of starting parameters."""
  if value in model_lib.INIT_SCHEMES:
    return None
  if str(value).endswith(".npz"):
    return None if os.path.isfile(value) else f"names no such file ({value})"
  return f"must be one of {', '.join(model_lib.INIT_SCHEMES)} or a .npz file of starting parameters"


def shapes(values):
  """Entries "n:T" with n >= 1 and T >= 2."""
  for v in values:
    try:
      n, T = (int(x) for x in str(v).split(":"))
    except ValueError:
      return f"must be entries n:T such as 5:5, got {v!r}"
    if n < 1 or T < 2:
      return f"needs n >= 1 and T >= 2, got n={n} T={T}"
  return None


def metric_log(kind):
  """--log=wandb needs wandb installed (it is not a dependency)."""
  if kind == "wandb" and importlib.util.find_spec("wandb") is None:
    return "wandb is not installed (pip install wandb), or use --log=tensorboard"
  return None
