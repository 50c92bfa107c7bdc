"""Sweep values are parsed and checked by their field, inside a sweep as outside it.

The claims: a command-line sweep of a list field takes whole lists (semicolons between values,
commas between items), never characters; --config.LIST=A,B sets a list; a float for an int field,
a value repeated by value (4 and 4.0, 0.1 and 0.10) and a grid above ``MAX_CELLS`` are refused in
one line, the grid before any combination is validated; a config.sweep that is not a mapping is
one line, not a TypeError.
"""
import pytest

from svmattn import registry
from svmattn.config import config_file

E2 = registry.get("E2")
E6 = registry.get("E6")


def _error(fn, *args):
  with pytest.raises(SystemExit) as e:
    fn(*args)
  return str(e.value.code)


def test_a_list_field_sweeps_whole_lists():
  assert config_file.sweep_of(E6, {}, ["lams=0,15;1,5"]) == {"lams": [(0.0, 15.0), (1.0, 5.0)]}
  assert config_file.sweep_of(E6, {}, ["lams=[0,1]"]) == {"lams": [(0.0, 1.0)]}
  assert config_file.sweep_of(E2, {}, ["params=W;KQ"]) == {"params": [("W",), ("KQ",)]}


def test_scalar_fields_sweep_comma_separated_values():
  assert config_file.sweep_of(E2, {}, ["lr=0.01,1", "d=4,8"]) == {"lr": [0.01, 1.0], "d": [4, 8]}


def test_a_list_override_becomes_a_tuple_literal():
  got = config_file.list_overrides(E2, ["--config.params=W,KQ", "--config.lr=0.5", "--out=x"])
  assert got == ["--config.params=('W', 'KQ')", "--config.lr=0.5", "--out=x"]
  assert config_file.list_overrides(E2, ["--config.params=[KQ]"]) == ["--config.params=('KQ',)"]


@pytest.mark.parametrize("sweep,args,expect", [
    ({"seed": [1.0]}, [], "config.sweep.seed=1.0: must be an integer"),
    ({"d": [4, 4.0]}, [], "config.sweep.d=4.0: must be an integer"),
    ({"lr": [0.1, 0.10]}, [], "config.sweep.lr: repeats the value 0.1"),
    ({}, ["lr=0.1,0.10"], "config.sweep.lr: repeats the value 0.1"),
    ({"lams": [0, 15]}, [], "config.sweep.lams=0: must be a list of float values"),
    ({"lr": []}, [], "config.sweep.lr: needs a list of at least one value"),
    ({}, ["seed=1,1.5"], "--config.sweep.seed=1,1.5: invalid literal for int()"),
])
def test_bad_sweep_values_are_one_line(sweep, args, expect):
  assert expect in _error(config_file.sweep_of, E6 if "lams" in sweep else E2, sweep, args)


def test_a_grid_too_large_is_refused_before_validation(monkeypatch):
  checked = []
  monkeypatch.setattr(E2.settings.field("lr").__class__, "problem", lambda self, v: checked.append(v))
  lr = ",".join(str(0.001 * (i + 1)) for i in range(200))
  d = ",".join(str(i + 1) for i in range(60))
  message = _error(config_file.sweep_of, E2, {}, [f"lr={lr}", f"d={d}"])
  assert "200 x 60 = 12000 combinations, more than the 10000" in message
  assert checked == []


@pytest.mark.parametrize("sweep", [[1, 2], "lr", 3])
def test_a_sweep_that_is_not_a_mapping_is_one_line(sweep):
  config = {"experiment": "E2", "sweep": sweep}

  class Config(dict):
    pass
  message = _error(config_file.full_config, Config(config))
  assert message.startswith("error: config.sweep must map settings to lists of values")
