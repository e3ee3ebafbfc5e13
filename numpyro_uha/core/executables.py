"""An on-disk cache of the warm start's compiled model-free steps.

The warm start's model-free steps (:func:`~numpyro_uha.core.warm_start.small_jit`) depend
only on q's dimension, dtype and the options, not on the model, yet a fresh process
compiles all of them again: about 40 small programs, 5 s of XLA's time on two CPU cores,
most of what ``UHAGuide``'s ``svi.init`` costs beyond ``AutoNormal``'s on a small model.
This cache keeps each compiled executable in a file, so a later process (a script run
again, another model of the same dimension) loads it in milliseconds instead of compiling
it. Only these steps are cached: the model's own programs compile as before.

**Key.** A file is named by the SHA-256 of the step's lowered program (its StableHLO text,
which holds its shapes, dtypes and static arguments), the XLA options it is compiled
with, the jax and jaxlib versions, the backend's platform and version, the device kind,
the host's CPU (its instruction-set flags: an executable compiled for one CPU must not run
on another) and ``XLA_FLAGS``. Any change to the step's code changes its program and so
its key; a stale file is never read, only left behind.

**Where.** ``$NUMPYRO_UHA_CACHE_DIR`` if set (an empty value turns the cache off), else
``$XDG_CACHE_HOME/numpyro_uha/executables`` (``~/.cache/numpyro_uha/executables``); or
:func:`set_cache_dir`. It is safe to delete at any time. The cache is used on the CPU
backend only (the only one it was tested on), in a single process (not under
``jax.distributed``), and stands aside when JAX's own persistent compilation cache is on
(``jax_compilation_cache_dir``), which then caches these steps as it caches every
program. A file that cannot be read, written or loaded is compiled instead: the cache
never fails a run and never changes a result (a loaded executable is the same machine
code as the compiled one).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path

import jax
from jax.experimental import serialize_executable

__all__ = ["cache_dir", "set_cache_dir", "stats"]

#: Counters for tests and benchmarks: executables compiled (and written), loaded from
#: disk, and cache files that could not be read or loaded.
stats = {"compiled": 0, "loaded": 0, "failed": 0}

_UNSET = object()
_dir_override = _UNSET
_lock = threading.Lock()
_fingerprint: str | None = None
_tables: list = []


def register(table: dict) -> dict:
    """Keep ``table`` (a step's executables in this process) for :func:`clear`."""
    _tables.append(table)
    return table


def clear() -> None:
    """Drop the executables this process holds (they load again from disk when next
    called): as :func:`jax.clear_caches` does for JAX's programs."""
    for table in _tables:
        table.clear()


def set_cache_dir(path) -> None:
    """Use ``path`` for the cache (``None``: turn it off) instead of the environment's
    choice (``NUMPYRO_UHA_CACHE_DIR``, else the user cache folder)."""
    global _dir_override
    _dir_override = None if path is None else Path(path)


def cache_dir() -> Path | None:
    """The folder the cache uses, or ``None`` when it is off."""
    if _dir_override is not _UNSET:
        return _dir_override
    env = os.environ.get("NUMPYRO_UHA_CACHE_DIR")
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.path.expanduser("~")
        if home.startswith("~"):  # no home folder known: no cache (not one in the cwd)
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "numpyro_uha" / "executables"


def active(platform: str) -> Path | None:
    """The cache folder to use for a step compiled for ``platform`` on JAX's default
    device, or ``None`` (off, another backend, JAX's own persistent cache on, or one of
    several processes of ``jax.distributed``, whose programs span them all)."""
    if platform != "cpu" or _jax_cache_on() or jax.process_count() > 1:
        return None
    return cache_dir()


def _jax_cache_on() -> bool:
    return bool(jax.config.jax_compilation_cache_dir)


def _cpu_identity() -> str:
    """The host CPU's instruction-set flags (Linux), else what ``platform`` says."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _environment() -> str:
    global _fingerprint
    if _fingerprint is None:
        import jaxlib

        device = jax.devices("cpu")[0]
        backend = device.client
        _fingerprint = "\n".join([
            f"jax {jax.__version__}", f"jaxlib {getattr(jaxlib, '__version__', '?')}",
            f"platform {backend.platform} {backend.platform_version}",
            f"device {device.device_kind}", f"cpu {_cpu_identity()}",
            f"XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}",
        ])
    return _fingerprint


def load_or_compile(jitted, args, folder: Path, compiler_options=None):
    """The executable of ``jitted`` (a ``jax.jit`` function) at ``args`` (static
    arguments included, as for a call), read from ``folder`` when a file holds it, else
    compiled and written there. Call the result with the non-static arguments."""
    lowered = jitted.lower(*args)
    key = hashlib.sha256(
        "\n".join([lowered.as_text(), repr(sorted((compiler_options or {}).items())),
                   _environment()]).encode()
    ).hexdigest()
    path = folder / f"{key}.xla"
    try:
        payload = path.read_bytes()
    except OSError:
        payload = None
    if payload is not None:
        try:
            executable = serialize_executable.deserialize_and_load(
                payload, lowered.in_tree, lowered.out_tree
            )
        except Exception:  # noqa: BLE001 - a damaged or foreign file: compile instead
            with _lock:
                stats["failed"] += 1
        else:
            with _lock:
                stats["loaded"] += 1
            return executable
    executable = lowered.compile()
    with _lock:
        stats["compiled"] += 1
    try:
        payload, _, _ = serialize_executable.serialize(executable)
        folder.mkdir(parents=True, exist_ok=True)
        # written whole or not at all: another process may read the name at any time
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".xla")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except Exception:  # noqa: BLE001 - a read-only or full disk: the run goes on uncached
        pass
    return executable
