"""A clear error for a keyword that is neither the function's option nor the model's.

The guides' draw methods and the evaluation functions pass their unknown keyword
arguments on to the model (its data, as in training), as NumPyro's do. A misspelt or
borrowed option (``num_samples`` where the function's is ``num_draws`` or
``sample_shape``; the package's functions differ, as NumPyro's ``Predictive`` and
``sample_posterior`` do) then reached the model, and the user saw the model's own
``TypeError`` from deep inside a trace. Here it is caught at the call, with the option
that was probably meant. A model whose signature takes ``**kwargs``, or cannot be read
(a handler-wrapped model), is not checked.
"""

from __future__ import annotations

import difflib
import inspect
import re

# the number of draws, as the package's functions (and NumPyro's) name it
_COUNT = re.compile(r"^(num|n)_?(draw|sample)s?$|^sample_?shape$|^size$")
_COUNT_OPTIONS = ("num_draws", "num_samples", "sample_shape")
_KEY = re.compile(r"^(key|seed|rng|prng_?key|random_?key)$")


def _meant(name, options, model_names):
    if _COUNT.match(name):
        return [o for o in _COUNT_OPTIONS if o in options and o != name]
    if _KEY.match(name) and "rng_key" in options:
        return ["rng_key"]
    return difflib.get_close_matches(name, options + model_names, n=1)


def _named(fn):
    params = inspect.signature(fn).parameters.values()
    return [
        p.name for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ], any(p.kind is p.VAR_KEYWORD for p in params)


def model_of(guide):
    """The user's model of a guide (UHAGuide keeps it beside the decentred one)."""
    return getattr(guide, "_user_model", None) or getattr(guide, "model", None)


def check_model_keywords(model, kwargs, fn):
    """Raise ``TypeError`` for a keyword of ``kwargs`` that ``model`` does not take,
    naming ``fn`` (the public function called) and the option probably meant."""
    if not kwargs or model is None:
        return
    try:
        model_names, model_takes_any = _named(model)
    except (TypeError, ValueError):  # no signature to read
        return
    if model_takes_any:
        return
    unknown = [k for k in kwargs if k not in model_names]
    if not unknown:
        return
    fn_names = _named(fn)[0]
    options = [n for n in fn_names if n not in ("self", "guide", "rng_key", "params")]
    options += ["rng_key"] if "rng_key" in fn_names else []
    where = getattr(fn, "__qualname__", getattr(fn, "__name__", "the function"))
    model_name = getattr(model, "__name__", type(model).__name__)
    name = unknown[0]
    meant = _meant(name, options, model_names)
    hint = f" Did you mean {meant[0]}=?" if meant else ""
    raise TypeError(
        f"{where}() got the keyword argument {name!r}, which is neither one of its options "
        f"({', '.join(options)}) nor an argument of the model {model_name}"
        f"({', '.join(model_names)}); unknown keywords are passed to the model.{hint}"
    )


def did_you_mean_site(name, sites) -> str:
    """A hint for a site ``name`` that the model does not have: the sites that end in it
    after a scope's divider (``m/theta`` for ``theta`` under ``numpyro.handlers.scope``),
    else the closest spelling; empty if none is near."""
    scoped = [s for s in sites if len(s) > len(name) and s.endswith(name)
              and not s[-len(name) - 1].isalnum() and s[-len(name) - 1] != "_"]
    meant = scoped or difflib.get_close_matches(name, list(sites), n=1)
    return f" Did you mean {' or '.join(repr(s) for s in meant)}?" if meant else ""
