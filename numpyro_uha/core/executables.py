"""An on-disk cache of the warm start's compiled model-free steps.

The warm start's model-free steps (:func:`~numpyro_uha.core.warm_start.small_jit`) depend
only on q's dimension, dtype and the options, not on the model, yet a fresh process
compiles all of them again: about 40 small programs, 5 s of XLA's time on two CPU cores,
most of what ``UHAGuide``'s ``svi.init`` costs beyond ``AutoNormal``'s on a small model.
This cache keeps each compiled executable in a file, so a later process (a script run
again, another model of the same dimension) loads it in milliseconds instead of compiling
it. Only these steps are cached: the model's own programs compile as before.

**Key.** A file is named by the SHA-256 of what the step is: its function's module and
name, its static arguments, the tree, shapes, dtypes and weak types of its other
arguments, the SHA-256 of this package's Python sources (so any change to the step's
code, or to code it calls here, changes every key), and the JAX options that change what
tracing produces (``jax_enable_x64``, the PRNG implementation, the default matmul
precision, ...); with the XLA options it is compiled with, the jax and jaxlib versions,
the backend's platform and version, the device kind, the host's CPU (its instruction-set
flags: an executable compiled for one CPU must not run on another), ``XLA_FLAGS``, and
the versions of the packages whose code the steps trace (optax, NumPyro, NumPy,
ml_dtypes; a package patched in place without a new version is not seen). A stale file
is never read, only left behind. No step is traced or lowered to find its
file: a later process that loads every step traces none of them (lowering the 26 steps
of stochvol_scan's setup took about 2 s in the background thread, most of it Python
holding the interpreter lock against the main thread's setup). Where the package's
sources cannot be read, the step's lowered program (its StableHLO text) stands for the
description. A file holds the serialized executable and its argument and result trees.

**Where.** ``$NUMPYRO_UHA_CACHE_DIR`` if set (an empty value turns the cache off), else
``$XDG_CACHE_HOME/numpyro_uha/executables`` (``~/.cache/numpyro_uha/executables``); or
:func:`set_cache_dir`. It is safe to delete at any time. The cache is used on the CPU
backend only (the only one it was tested on), in a single process (not under
``jax.distributed``), and stands aside when JAX's own persistent compilation cache is on
(``jax_compilation_cache_dir``), which then caches these steps as it caches every
program. A file that cannot be read, written or loaded is compiled instead: the cache
never fails a run and never changes a result (a loaded executable is the same machine
code as the compiled one). Each file carries the SHA-256 of its contents, checked before
XLA reads them (a damaged executable can kill the process in native code, where no
``except`` reaches). XLA's C++ log is silenced while a file loads (see
``_QuietLoader``: on some CPUs the loader warns of SIGILL for every executable,
even one compiled on the same host).
"""

from __future__ import annotations

import hashlib
import os
import pickle
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


#: Packages whose code the steps run when traced (optax's Adam and L-BFGS, NumPyro's
#: transforms, NumPy's constants): their installed versions are in the key, so that
#: upgrading one compiles the steps anew instead of loading what the old one traced.
TRACED_PACKAGES = ("optax", "numpyro", "numpy", "ml_dtypes")


def _package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except Exception:  # noqa: BLE001 - not installed as a distribution: say so in the key
        return "unknown"


def _environment() -> str:
    global _fingerprint
    if _fingerprint is None:
        import jaxlib

        device = jax.devices("cpu")[0]
        backend = device.client
        _fingerprint = "\n".join([
            f"jax {jax.__version__}", f"jaxlib {getattr(jaxlib, '__version__', '?')}",
            *(f"{name} {_package_version(name)}" for name in TRACED_PACKAGES),
            f"platform {backend.platform} {backend.platform_version}",
            f"device {device.device_kind}", f"cpu {_cpu_identity()}",
            f"XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}",
        ])
    return _fingerprint


#: JAX options that change what a step's tracing produces from the same arguments (its
#: avals and static arguments are in ``call``): in :func:`load_or_compile`'s fast key.
_CONFIG_NAMES = (
    "jax_enable_x64", "jax_default_prng_impl", "jax_threefry_partitionable",
    "jax_default_matmul_precision", "jax_numpy_dtype_promotion", "jax_enable_checks",
    "jax_debug_nans", "jax_debug_infs",
)


def _config() -> str:
    return "\n".join(f"{name} {getattr(jax.config, name, None)!r}" for name in _CONFIG_NAMES)


_digest: list = []


def _source_digest() -> str | None:
    """SHA-256 of this package's Python sources (read once per process): a step's program
    is its code's, so a changed source file changes every fast key. ``None`` where they
    cannot be read (the lowered program's text keys the files then)."""
    if not _digest:
        root = Path(__file__).resolve().parent.parent
        try:
            h = hashlib.sha256()
            for path in sorted(root.rglob("*.py")):
                h.update(path.relative_to(root).as_posix().encode() + b"\0")
                h.update(path.read_bytes() + b"\0")
            _digest.append(h.hexdigest())
        except OSError:
            _digest.append(None)
    return _digest[0]


#: A file's first bytes: this tag, then the SHA-256 of the rest.
_MAGIC = b"numpyro-uha executable 2\n"


def _sealed(body: bytes) -> bytes:
    return _MAGIC + hashlib.sha256(body).digest() + body


def _checked(stored: bytes) -> bytes:
    """The body of a file written by :func:`_sealed`, after checking its SHA-256: a
    damaged executable handed to XLA can kill the process (an illegal instruction, an
    LLVM abort), which no ``except`` catches; a damaged file is compiled again instead."""
    start = len(_MAGIC) + 32
    if not stored.startswith(_MAGIC) or hashlib.sha256(stored[start:]).digest() != stored[
        len(_MAGIC):start
    ]:
        raise ValueError("not an executable this cache wrote, or damaged")
    return stored[start:]


_lapack_ready: list = []


def _ready_for_lapack() -> None:
    """Load LAPACK's kernels into jaxlib, as lowering a linear-algebra operation does:
    jaxlib loads them at the first such lowering, and an executable that calls them
    (a Cholesky factor, an inverse) loaded without any lowering in the process crashes
    the process. Once per process, by lowering a 1 × 1 Cholesky factor (public API)."""
    if not _lapack_ready:
        with _lock:
            if not _lapack_ready:
                jax.jit(jax.numpy.linalg.cholesky).lower(jax.ShapeDtypeStruct((1, 1), "float32"))
                _lapack_ready.append(True)


#: absl's severities, as JAX maps its ``jax_logging_level`` onto them.
_ABSL_LEVEL = {"DEBUG": 0, "INFO": 0, "WARN": 1, "WARNING": 1, "ERROR": 2, "CRITICAL": 3,
               "FATAL": 3}
_quiet = [0]


def _process_log_level() -> int:
    """The C++ log level the process runs at: JAX's ``jax_logging_level`` where set, else
    ``TF_CPP_MIN_LOG_LEVEL`` (which ``import jax`` sets to 1 where the user did not)."""
    level = jax.config.jax_logging_level
    if level not in (None, "NOTSET") and level in _ABSL_LEVEL:
        return _ABSL_LEVEL[level]
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"))
    except ValueError:
        return 1


class _QuietLoader:
    """Silence XLA's C++ log while a cached executable loads.

    XLA:CPU's loader compares the features the executable was compiled for with the
    host's, and on some CPUs (AMD Zen 4 with jaxlib 0.10) the compile side lists LLVM's
    tuning flags (``+prefer-no-gather``, ``+prefer-no-scatter``) that the host side never
    lists: every load logs two error lines ending "could lead to execution errors such as
    SIGILL" for an executable compiled on this very machine. A file of this cache is only
    ever read on a host with the same instruction-set flags (they are in its key), so
    those lines say nothing here; a load that does fail raises, and the step compiles
    instead. The log level is process-wide: it is raised to FATAL only while a load runs
    (milliseconds; counted, for loads in several threads at once) and put back to the
    process's level after."""

    def __enter__(self):
        with _lock:
            if _quiet[0] == 0:
                _set_log_level(3)
            _quiet[0] += 1

    def __exit__(self, *exc):
        with _lock:
            _quiet[0] -= 1
            if _quiet[0] == 0:
                _set_log_level(_process_log_level())
        return False


def _set_log_level(level: int) -> None:
    try:
        from jax._src.lib import utils

        utils.absl_set_min_log_level(level)
    except Exception:  # noqa: BLE001 - a jaxlib without it: the lines are only noise
        pass


def load_or_compile(jitted, args, folder: Path, compiler_options=None, call=None):
    """The executable of ``jitted`` (a ``jax.jit`` function) at ``args`` (static
    arguments included, as for a call), read from ``folder`` when a file holds it, else
    compiled and written there. Call the result with the non-static arguments.

    ``call``: a string that names the program without lowering it (the step's function,
    static arguments, argument tree and avals; see the module docstring), or ``None``:
    the key is the lowered program's text."""
    digest = _source_digest() if call is not None else None
    lowered = None
    if digest is not None:
        what = "\n".join([f"call {call}", f"source {digest}", _config()])
    else:
        lowered = jitted.lower(*args)
        what = lowered.as_text()
    key = hashlib.sha256(
        "\n".join([what, repr(sorted((compiler_options or {}).items())),
                   _environment()]).encode()
    ).hexdigest()
    path = folder / f"{key}.xla"
    try:
        stored = path.read_bytes()
    except OSError:
        stored = None
    if stored is not None:
        _ready_for_lapack()
        try:
            payload, in_tree, out_tree = pickle.loads(_checked(stored))
            with _QuietLoader():
                executable = serialize_executable.deserialize_and_load(
                    payload, in_tree, out_tree)
        except Exception:  # noqa: BLE001 - a damaged or foreign file: compile instead
            with _lock:
                stats["failed"] += 1
        else:
            with _lock:
                stats["loaded"] += 1
            return executable
    if lowered is None:
        lowered = jitted.lower(*args)
    executable = lowered.compile()
    with _lock:
        stats["compiled"] += 1
    try:
        payload = _sealed(pickle.dumps(serialize_executable.serialize(executable)))
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
