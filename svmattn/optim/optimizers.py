"""Optimizers as optax GradientTransformations.

  normalize_by_leaf_norm():  g_p -> g_p / ||g_p||_F for every parameter p
                             (0 where ||g_p|| = 0)
  normalized_gd(lr):         p <- p - lr * g_p / ||g_p||_F   (the paper's NGD)
  normalize_plus_eps(eps):   g_p -> g_p / (||g_p||_F + eps)   (the authors' code, eps = float64 epsilon)
  normalized_gd_eps(lr):     p <- p - lr * g_p / (||g_p||_F + eps)
  gd(lr):                    p <- p - lr * g_p
  get_optimizer(name, lr):   the above, the geometries of docs/science.md section 10 (steepest.py,
                             mirror.py), or any optax optimizer by name (adam, ...)

Names get_optimizer accepts:
  normalized_gd / ngd, gd          as above
  sd_l1, sd_linf, sd_l<p>          normalized steepest descent, entrywise l1 / l_inf / l_p (p > 1 real,
                                   e.g. sd_l3, sd_l1.5; sd_l2 is normalized_gd exactly)
  sd_spectral, sd_spectral_ns      spectral norm: polar factor by SVD / Muon's Newton-Schulz (5 steps)
  sd_nuc                           nuclear norm: top singular pair
  md_l<p>                          normalized l_p mirror descent, 1 < p < inf (e.g. md_l1.75, md_l3)
  muon                             optax.contrib.muon(lr) (Newton-Schulz on Nesterov momentum)
  polyak                           steepest.polyak(lr): Polyak step min(f / ||g||^2, lr), f_min = 0
                                   (update needs value=; the loop passes the objective)
  any optax name                   optax.<name>(lr) (adam, sgd, lion, ...)

Momentum, Signum, sign GD and step-size schedules (E16, docs/science.md section 15):
  <base>+mom<beta>                 heavy ball on the raw gradient, then the base's direction:
                                   m_t = beta m_{t-1} + (1 - beta) g_t (m_0 = 0; optax.ema, no debias),
                                   p <- p - lr_t D(m_t)
  <base>+nesterov<beta>            Nesterov: u_t = g_t + beta M_t, M_t = beta M_{t-1} + g_t
                                   (optax.trace(nesterov=True)), p <- p - lr_t D(u_t). In the EMA
                                   convention this is D((1 - beta) g_t + beta m_t) (Muon's lerp): the
                                   directions D are homogeneous of degree 0, so the factor (1 - beta)
                                   between the two conventions changes nothing.
      base: gd (D the identity: gd+mom<beta> is heavy ball with its step scaled by 1 - beta;
      not homogeneous, so gd+nesterov<beta> is (1 - beta) times smaller than the EMA form),
      normalized_gd / ngd / sd_l2 (D = G / ||G||_F), sd_l1, sd_linf, sd_l<p>, sd_spectral,
      sd_spectral_ns, sd_nuc, sign_gd; 0 <= beta < 1 (e.g. normalized_gd+mom0.9, sd_linf+nesterov0.9,
      sd_spectral+mom0.95 = Muon's update with an exact polar factor). The momentum sits BEFORE the
      normalization (Fan, Schmidt, Thrampoulidis 2025, arXiv 2502.04664, "momentum versions"), so the
      step length stays lr_t in the base's norm.
  signum<beta>                     Signum (sign descent with momentum): p <- p - lr_t sign(m_t), m_t
                                   the EMA above; the same transformation as sd_linf+mom<beta>.
  sign_gd                          plain sign GD p <- p - lr sign(g): sd_linf already is exactly this
                                   (the unit l_inf steepest direction of G is sign(G), no division by
                                   a norm or the dimension), so sign_gd is an alias of sd_linf.
  <name>@sqrt, <name>@inv          step size lr_t = lr / sqrt(t + 1) or lr / (t + 1), t = 0, 1, ... the
                                   optimizer's own step count (optax.scale_by_schedule's count in the
                                   optimizer state, so a run resumed from a checkpoint is exact);
                                   <name>@const is <name>. For the directions above and gd the last
                                   transformation is optax.scale_by_learning_rate(schedule); muon and
                                   optax names get the schedule as their learning_rate. Not for
                                   md_l<p> and polyak (their step is not lr times a direction).
  Constant step sizes and no suffix: every earlier name builds exactly its earlier transformation.
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import optax

from svmattn.optim import mirror
from svmattn.optim import steepest


def normalize_by_leaf_norm() -> optax.GradientTransformation:
  """Divide each parameter's update by its own Frobenius norm.

  Invariant to a positive rescaling of the loss (hence safe with loss scaling).
  """

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params

    def normalize(g):
      # g / ||g|| computed as u / ||u|| with u = g / max|g|: squaring a gradient of 1e-25
      # would underflow in float32 (and one of 1e-170 in float64) although g / ||g|| is fine.
      peak = jnp.max(jnp.abs(g))
      u = g / jnp.where(peak > 0, peak, 1)
      norm = jnp.sqrt(jnp.sum(u * u))
      return jnp.where(peak > 0, u / jnp.where(norm > 0, norm, 1), jnp.zeros_like(g))

    return jax.tree_util.tree_map(normalize, updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def normalized_gd(learning_rate: float) -> optax.GradientTransformation:
  """p <- p - lr * grad_p / ||grad_p||_F, each parameter by its own norm."""
  return optax.chain(normalize_by_leaf_norm(), optax.scale(-learning_rate))


# The epsilon of the authors' normalization: float64 machine epsilon (whatever the dtype).
AUTHORS_EPS = 2.220446049250313e-16


def normalize_plus_eps(eps: float = AUTHORS_EPS) -> optax.GradientTransformation:
  """Divide each parameter's update by its Frobenius norm plus ``eps``, as the authors' code
  does. Not normalized GD once ||g|| falls to ~eps: the step lr ||g|| / (||g|| + eps) then
  shrinks far below lr and training freezes."""

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map(lambda g: g / (jnp.sqrt(jnp.sum(g * g)) + eps), updates), state

  return optax.GradientTransformation(init_fn, update_fn)


def normalized_gd_eps(learning_rate: float, eps: float = AUTHORS_EPS) -> optax.GradientTransformation:
  """p <- p - lr * grad_p / (||grad_p||_F + eps): the authors' normalized GD."""
  return optax.chain(normalize_plus_eps(eps), optax.scale(-learning_rate))


def gd(learning_rate: float) -> optax.GradientTransformation:
  """Plain gradient descent p <- p - lr * grad_p."""
  return optax.sgd(learning_rate)


def muon(learning_rate: float) -> optax.GradientTransformation:
  """optax.contrib.muon with its defaults (Newton-Schulz on 2-D leaves, Adam on the others)."""
  from optax import contrib
  return contrib.muon(learning_rate)


OPTIMIZERS = {"normalized_gd": normalized_gd, "ngd": normalized_gd, "gd": gd,
              "sd_l1": lambda lr: steepest.steepest_descent(lr, "l1"),
              "sd_linf": lambda lr: steepest.steepest_descent(lr, "linf"),
              "sd_l2": normalized_gd,
              "sd_spectral": lambda lr: steepest.steepest_descent(lr, "spectral"),
              "sd_spectral_ns": lambda lr: steepest.steepest_descent(lr, "spectral_ns"),
              "sd_nuc": lambda lr: steepest.steepest_descent(lr, "nuclear"),
              "muon": muon,
              "polyak": steepest.polyak}

# Optimizers whose update needs the objective's value: update(grads, state, params, value=f).
NEEDS_VALUE = ("polyak",)

_LP_NAME = re.compile(r"(sd|md)_l(.+)")


# Steps that call LAPACK decompositions (SVD). XLA:CPU can deadlock when several CPU devices run
# them at once (seen: sd_spectral on 2 CPU devices hung in 1 of 3 trainings, never on one device),
# so ``train.loop.train`` runs these optimizers on one CPU device (the same results bit for bit).
DECOMPOSING = frozenset({"sd_spectral", "sd_nuc"})


def uses_decompositions(name: str) -> bool:
  """Whether the optimizer's step computes an SVD (see ``DECOMPOSING``); also for the
  momentum / schedule forms of those names (sd_spectral+mom0.9@sqrt)."""
  if name in DECOMPOSING:
    return True
  return _core_base(name) in DECOMPOSING


def needs_value(name: str) -> bool:
  """Whether ``get_optimizer(name, ...).update`` needs the keyword ``value`` (the objective)."""
  return name in NEEDS_VALUE


def _lp_optimizer(name: str, learning_rate: float):
  """sd_l<p> / md_l<p> with a real p (None if the name is not of that form)."""
  match = _LP_NAME.fullmatch(name)
  if match is None:
    return None
  kind, text = match.groups()
  try:
    p = float(text)
  except ValueError:
    raise ValueError(f"unknown optimizer {name!r}: {kind}_l<p> needs a number p > 1 (e.g. {kind}_l3, "
                     f"{kind}_l1.5){', sd_l1 or sd_linf' if kind == 'sd' else ''}") from None
  if math.isinf(p) and text.strip().lower() not in ("inf", "+inf", "infinity"):
    raise ValueError(f"unknown optimizer {name!r}: p={text} overflows to infinity; write a finite p > 1"
                     f"{' (or sd_linf for the l_inf norm)' if kind == 'sd' else ''}")
  if kind == "sd" and p in (1, math.inf):   # sd_l1.0, sd_linf spelled as a number
    return steepest.steepest_descent(learning_rate, "l1" if p == 1 else "linf")
  if not (1 < p < math.inf):
    raise ValueError(f"unknown optimizer {name!r}: {kind}_l<p> needs 1 < p < inf, got p={p}"
                     f"{' (or sd_l1, sd_linf)' if kind == 'sd' else ''}")
  if kind == "md":
    return mirror.lp_mirror_descent(learning_rate, p)
  if p == 2:
    return normalized_gd(learning_rate)
  return steepest.steepest_descent(learning_rate, "lp", p)


def get_optimizer(name: str, learning_rate: float, numerics: str = "exact") -> optax.GradientTransformation:
  """A name of the module docstring's list: normalized_gd (alias ngd), gd, sd_*, md_l<p>, muon,
  polyak, or the name of any optax optimizer (adam, sgd, lion, ...). Unknown names: ValueError.

  numerics="authors": normalized_gd divides by ||g|| + float64 epsilon (``normalized_gd_eps``)."""
  if numerics not in ("exact", "authors"):
    raise ValueError(f"numerics must be 'exact' or 'authors', got {numerics!r}")
  if _is_new_name(name):
    return _new_optimizer(name, learning_rate, numerics)
  if numerics == "authors" and name in ("normalized_gd", "ngd"):
    return normalized_gd_eps(learning_rate)
  if name in OPTIMIZERS:
    return OPTIMIZERS[name](learning_rate)
  opt = _lp_optimizer(name, learning_rate)
  if opt is not None:
    return opt
  factory = getattr(optax, name, None)
  if factory is None or not callable(factory) or name.startswith("_"):
    raise ValueError(f"unknown optimizer {name!r}; use one of {sorted(OPTIMIZERS)}, sd_l<p> or md_l<p> "
                     "(real p > 1, e.g. sd_l3, md_l1.75) or the name of an optax optimizer (e.g. adam); with "
                     "momentum <base>+mom<beta> / <base>+nesterov<beta>, signum<beta>, sign_gd, and a step-size "
                     "schedule suffix @sqrt / @inv (e.g. sd_linf+nesterov0.9@sqrt)")
  try:
    opt = factory(learning_rate)
  except TypeError as e:
    raise ValueError(f"optax.{name} cannot be built from a learning rate alone: {e}") from e
  if not isinstance(opt, optax.GradientTransformation):
    raise ValueError(f"optax.{name} is not an optimizer")
  return opt


# ----------------------------------------------------------------------------
# Momentum, Signum, sign GD and step-size schedules (module docstring)
# ----------------------------------------------------------------------------

def _float_count(t):
  """The int32 step count as the default float (float64 with x64 on, as svmattn sets it): int32 -> float32
  would round lr / sqrt(t + 1) to float32 before optax casts it to the parameters' dtype."""
  return jnp.asarray(t, jnp.result_type(float))


SCHEDULES = {"const": None,
             "sqrt": lambda t: 1 / jnp.sqrt(_float_count(t) + 1),
             "inv": lambda t: 1 / (_float_count(t) + 1)}


def without_const_schedule(name):
  """``name`` with a constant-schedule suffix removed: <name>@const is the unscheduled <name>
  (``_new_optimizer``), so code that dispatches on optimizer names treats both alike."""
  return name[:-len("@const")] if isinstance(name, str) and name.endswith("@const") else name


MOMENTUM_BASES = ("gd", "normalized_gd", "ngd", "sd_l1", "sd_linf", "sd_spectral", "sd_spectral_ns", "sd_nuc",
                  "sign_gd", "sd_l<p>")
_MOMENTUM_NAME = re.compile(r"(.+)\+(mom|nesterov)(.*)")
_SIGNUM_NAME = re.compile(r"signum(.*)")


def _is_new_name(name: str) -> bool:
  return "@" in name or "+" in name or name == "sign_gd" or name.startswith("signum")


def _core_base(name: str) -> str | None:
  """The base name of a momentum / schedule name (None if it is not one)."""
  if not isinstance(name, str) or not _is_new_name(name):
    return None
  core = name.split("@", 1)[0]
  match = _MOMENTUM_NAME.fullmatch(core)
  return match.group(1) if match else core


def _parse_beta(name: str, text: str, what: str) -> float:
  try:
    beta = float(text)
  except ValueError:
    beta = None
  if beta is None or not text or not (0 <= beta < 1):
    raise ValueError(f"unknown optimizer {name!r}: {what} needs a momentum 0 <= beta < 1 written after it "
                     f"(e.g. {what}0.9), got {text!r}")
  return beta


def _direction(base: str, numerics: str):
  """The steepest-direction transformation D of a momentum base (None if base is not one)."""
  if base == "gd":         # heavy ball: the momentum itself is the step direction
    return optax.identity()
  if base in ("normalized_gd", "ngd", "sd_l2"):
    return normalize_plus_eps() if numerics == "authors" and base != "sd_l2" else normalize_by_leaf_norm()
  named = {"sd_l1": "l1", "sd_linf": "linf", "sign_gd": "linf", "sd_spectral": "spectral",
           "sd_spectral_ns": "spectral_ns", "sd_nuc": "nuclear"}
  if base in named:
    return steepest.steepest_direction(named[base])
  match = _LP_NAME.fullmatch(base)
  if match is None or match.group(1) != "sd":
    return None
  try:
    p = float(match.group(2))
  except ValueError:
    return None
  if p == 1:
    return steepest.steepest_direction("l1")
  if p == math.inf:
    return steepest.steepest_direction("linf")
  if not (1 < p < math.inf):
    return None
  return normalize_by_leaf_norm() if p == 2 else steepest.steepest_direction("lp", p)


def _step(learning_rate: float, schedule):
  """The last transformation: scale(-lr) (constant) or scale_by_learning_rate(lr * schedule)."""
  if schedule is None:
    return optax.scale(-learning_rate)
  return optax.scale_by_learning_rate(lambda t: learning_rate * schedule(t))


def _new_optimizer(name: str, learning_rate: float, numerics: str) -> optax.GradientTransformation:
  """The momentum / Signum / sign_gd / schedule names of the module docstring."""
  core, sep, sched_name = name.partition("@")
  if sep:
    if sched_name not in SCHEDULES:
      raise ValueError(f"unknown optimizer {name!r}: unknown step-size schedule @{sched_name}; use "
                       f"{', '.join('@' + k for k in SCHEDULES)}")
    if "@" in sched_name or not core:
      raise ValueError(f"unknown optimizer {name!r}: write <optimizer>[@schedule]")
  schedule = SCHEDULES[sched_name] if sep else None
  match = _MOMENTUM_NAME.fullmatch(core)
  signum = _SIGNUM_NAME.fullmatch(core)
  if match is not None:
    base, kind, text = match.groups()
    beta = _parse_beta(name, text, "+" + kind)
    direction = _direction(base, numerics)
    if direction is None:
      raise ValueError(f"unknown optimizer {name!r}: momentum applies to {', '.join(MOMENTUM_BASES)} "
                       f"(p > 1 real, or sd_l1 / sd_linf), not {base!r}")
    accumulate = (optax.ema(beta, debias=False) if kind == "mom"
                  else optax.trace(decay=beta, nesterov=True))
    return optax.chain(accumulate, direction, _step(learning_rate, schedule))
  if signum is not None:
    beta = _parse_beta(name, signum.group(1), "signum")
    return optax.chain(optax.ema(beta, debias=False), steepest.steepest_direction("linf"),
                       _step(learning_rate, schedule))
  if "+" in core:
    raise ValueError(f"unknown optimizer {name!r}: write <base>+mom<beta> or <base>+nesterov<beta> "
                     "(e.g. normalized_gd+mom0.9, sd_linf+nesterov0.9)")
  if schedule is None:
    return get_optimizer("sd_linf" if core == "sign_gd" else core, learning_rate, numerics)
  if core in ("polyak",) or (_LP_NAME.fullmatch(core) and core.startswith("md_")):
    raise ValueError(f"unknown optimizer {name!r}: step-size schedules do not apply to {core} (its step "
                     "is not the learning rate times a direction)")
  direction = _direction(core, numerics)
  if direction is not None:
    return optax.chain(direction, _step(learning_rate, schedule))
  scheduled = lambda t: learning_rate * schedule(t)  # noqa: E731
  if core == "gd":
    return optax.sgd(scheduled)
  if core == "muon":
    from optax import contrib
    return contrib.muon(scheduled)
  get_optimizer(core, learning_rate, numerics)   # ValueError for unknown names
  factory = getattr(optax, core)
  try:
    opt = factory(scheduled)
  except (TypeError, ValueError) as e:
    raise ValueError(f"unknown optimizer {name!r}: optax.{core} does not take a schedule as its learning "
                     f"rate: {e}") from e
  return opt
