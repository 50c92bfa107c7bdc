"""The experiments' figures: one module per experiment that draws its own, ``draw(arrays, summary,
out, flags, extras)`` (named in its ``registry.Experiment``)."""
