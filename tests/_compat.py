"""Compatibility shims shared by the tests."""

import jax

try:  # jax >= 0.8: a public context manager
    enable_x64 = jax.enable_x64
except AttributeError:  # jax 0.7.0, the supported lower end, has it in jax.experimental
    from jax.experimental import enable_x64

__all__ = ["enable_x64"]
