"""Typed settings: each experiment declares its fields once; configs, flags and checks follow.

    FIELDS = (fields.Int("n", 6, "Sequences per data set.", lower=1),
              fields.Float("lr", 0.1, "Step size.", check=allowed.positive),
              fields.List("params", ("W", "KQ"), "Parameterizations."))
    settings = fields.Settings(FIELDS, rules=(fields.Rule(("query_pos", "T"), lambda v: ...),))
    config = settings.config("local_convergence")   # an ml_collections ConfigDict of the defaults
    settings.validate(config)                       # ConfigError naming the first bad value

A field's default, help, bounds and check are the only ones: the experiment's binary defines its
absl flags from them (``config.flags_front``) and ``svmattn run --config`` checks a config file
with them (``config.config_file``). A problem is one sentence, "must be ..." for a field or a
whole sentence for a rule.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from ml_collections import config_dict


class ConfigError(ValueError):
  """A setting that cannot be used, with the reason (one line)."""


class Values(dict):
  """An experiment's validated settings, read by attribute (``fl.lr``); every declared field is
  present, so a read needs no default. A name the experiment does not declare is an AttributeError
  naming it. It stays a dict (``fl["lr"]``, ``dict(fl)``, JSON) for the code that stores settings."""

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(f"no setting {name!r} (the settings are {', '.join(sorted(self))})") from None

  def replace(self, **changes) -> "Values":
    """A copy with ``changes``."""
    return Values({**self, **changes})


Check = Callable[[Any], "str | None"]    # value -> None if fine, else what it must be ("must be ...")


@dataclasses.dataclass(frozen=True)
class Field:
  name: str
  default: Any
  help: str
  kind: str                          # int, float, str, bool, enum, list
  item: type = str                   # a list's entries
  choices: tuple = ()                # enum
  lower: float | None = None
  upper: float | None = None
  check: Check | None = None         # any further condition on the value
  operational: bool = False          # does not change the results (left out of a run's identity)
  sweepable: bool = True

  def problem(self, value) -> str | None:
    """None if ``value`` is allowed, else "must be ..."."""
    if value is None:
      return None if self.default is None else "must be set"
    if self.kind == "enum" and value not in self.choices:
      return f"must be one of {', '.join(map(str, self.choices))}"
    if self.kind in ("int", "float"):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or (
          self.kind == "int" and not float(value).is_integer()):
        return f"must be {'an integer' if self.kind == 'int' else 'a number'}"
      if not math.isfinite(value):
        return "must be a finite number"
      if self.lower is not None and value < self.lower:
        return f"must be >= {self.lower:g}" + (f" and <= {self.upper:g}" if self.upper is not None else "")
      if self.upper is not None and value > self.upper:
        return f"must be <= {self.upper:g}" + (f" and >= {self.lower:g}" if self.lower is not None else "")
    if self.kind == "bool" and not isinstance(value, bool):
      return "must be true or false"
    if self.kind == "list":
      try:
        values = [self.item(v) for v in value] if not isinstance(value, str) else None
      except (TypeError, ValueError):
        values = None
      if values is None:
        return f"must be a list of {self.item.__name__} values"
      own = None if self.check is None else self.check(value)     # (its own words first, e.g. "distinct")
      if own:
        return own
      repeated = sorted({str(v) for v in values if values.count(v) > 1})
      if repeated:
        return f"repeats {', '.join(repeated)}: list each value once"
    return None if self.check is None else self.check(value)

  def coerce(self, value):
    """``value`` as this field holds it (a list's entries as ``item``, as a tuple)."""
    if value is None:
      return None
    if self.kind == "list":
      return tuple(self.item(v) for v in value)
    if self.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
      return float(value)
    return value


def Int(name, default, help, lower=None, upper=None, **kw) -> Field:
  return Field(name, default, help, "int", lower=lower, upper=upper, **kw)


def Float(name, default, help, lower=None, upper=None, **kw) -> Field:
  return Field(name, default, help, "float", lower=lower, upper=upper, **kw)


def Str(name, default, help, **kw) -> Field:
  return Field(name, default, help, "str", **kw)


def Bool(name, default, help, **kw) -> Field:
  return Field(name, default, help, "bool", **kw)


def Enum(name, default, choices, help, **kw) -> Field:
  return Field(name, default, help, "enum", choices=tuple(choices), **kw)


def List(name, default, help, item=str, **kw) -> Field:
  return Field(name, None if default is None else tuple(default), help, "list", item=item, **kw)


@dataclasses.dataclass(frozen=True)
class Rule:
  """A condition on several fields: ``check({name: value}) -> None or a whole sentence``."""
  names: tuple[str, ...]
  check: Callable[[dict], "str | None"]


_PLACEHOLDER = {"int": int, "float": float, "str": str, "bool": bool, "enum": str, "list": tuple}


@dataclasses.dataclass(frozen=True)
class Settings:
  """An experiment's fields and rules (fields later in the tuple replace earlier ones of the same name)."""
  fields: tuple[Field, ...]
  rules: tuple[Rule, ...] = ()

  def __post_init__(self):
    by_name = {}
    for f in self.fields:
      by_name[f.name] = f
    object.__setattr__(self, "fields", tuple(by_name.values()))

  def __add__(self, other: "Settings") -> "Settings":
    return Settings(self.fields + other.fields, self.rules + other.rules)

  def field(self, name: str) -> Field:
    for f in self.fields:
      if f.name == name:
        return f
    raise KeyError(name)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(f.name for f in self.fields)

  def defaults(self) -> dict:
    return {f.name: f.default for f in self.fields}

  def config(self, experiment: str, **overrides) -> config_dict.ConfigDict:
    """A ConfigDict of the defaults (typed: a later value of another type is refused), with
    ``experiment``, an empty ``sweep`` and ``overrides``."""
    c = config_dict.ConfigDict()
    c.experiment = experiment
    for f in self.fields:
      setattr(c, f.name, config_dict.placeholder(_PLACEHOLDER[f.kind]) if f.default is None else f.default)
    c.sweep = config_dict.ConfigDict()
    for k, v in overrides.items():
      setattr(c, k, v)
    return c

  def values(self, config) -> dict:
    """{field: value} of a config (or dict), every field present (missing ones at their defaults),
    coerced; unknown names are a ConfigError."""
    given = dict(config.items()) if not isinstance(config, dict) else dict(config)
    given.pop("experiment", None)
    given.pop("sweep", None)
    unknown = sorted(set(given) - set(self.names))
    if unknown:
      raise ConfigError(f"config.{unknown[0]}: no such setting of this experiment"
                        + _suggest(unknown[0], self.names))
    out = {}
    for f in self.fields:
      out[f.name] = given.get(f.name, f.default)
    return out

  def problems(self, values: dict, prefix: str = "config.") -> list[str]:
    """Every problem of ``values`` (fields first, then rules), one sentence each."""
    out = []
    for f in self.fields:
      p = f.problem(values.get(f.name))
      if p:
        out.append(f"{prefix}{f.name}={_show(values.get(f.name))}: {p}")
    if not out:
      coerced = {f.name: f.coerce(values.get(f.name)) for f in self.fields}
      for r in self.rules:
        p = r.check(coerced)
        if p:
          out.append(p)
    return out

  def validate(self, config) -> Values:
    """The config's values (lists as lists, what a study's ``build`` takes), or ConfigError naming
    the first problem."""
    values = self.values(config)
    problems = self.problems(values)
    if problems:
      raise ConfigError(problems[0])
    return Values({k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in ((f.name, f.coerce(values[f.name])) for f in self.fields)})


def _show(value) -> str:
  if isinstance(value, (list, tuple)):
    return ",".join(map(str, value))
  return str(value)


def _suggest(name: str, names) -> str:
  import difflib
  close = difflib.get_close_matches(name, names, n=1)
  return f" (did you mean {close[0]}?)" if close else ""
