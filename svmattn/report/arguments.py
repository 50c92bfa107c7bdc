"""The arguments of the small commands (``svmattn plot``, ``svmattn table``): directories and
``--name=value`` options, each error one line that names the option.

    dirs, opts = arguments.parse(argv, {"x": None, "out": None}, switches=("curves",))
"""
from __future__ import annotations


class ArgumentError(ValueError):
  """A bad command line (one-line message)."""


def help_requested(argv: list[str], doc: str) -> bool:
  """Whether ``argv`` asks for help (-h, --help); if so, ``doc`` is printed."""
  if any(a in ("-h", "--help") for a in argv):
    print(doc.strip())
    return True
  return False


def parse(argv: list[str], options: dict, switches: tuple[str, ...] = ()) -> tuple[list, dict]:
  """(positional arguments, {option: value}): ``options`` maps each --name=VALUE option to its
  default, ``switches`` are --name / --noname booleans (default False)."""
  dirs, values = [], {**options, **dict.fromkeys(switches, False)}
  for a in argv:
    if not a.startswith("--"):
      if a.startswith("-"):
        raise ArgumentError(f"unknown option {a}")
      dirs.append(a)
      continue
    name, has_value, value = a[2:].partition("=")
    if name in switches and not has_value:
      values[name] = True
    elif name.startswith("no") and name[2:] in switches and not has_value:
      values[name[2:]] = False
    elif name in options:
      if not has_value or not value:
        raise ArgumentError(f"--{name} needs a value (--{name}=VALUE)")
      values[name] = value
    else:
      known = ", ".join(f"--{n}" for n in (*options, *switches))
      raise ArgumentError(f"unknown option --{name} (options: {known})")
  return dirs, values
