"""Find the shared libraries xtrain._C links against when they come from pip wheels
(OpenBLAS from scipy-openblas32; cuBLAS and NCCL from nvidia-cublas / nvidia-nccl-cu13), so
`import xtrain` works without LD_LIBRARY_PATH. The extension also carries an RPATH into
site-packages; loading them here first covers editable installs and unusual layouts."""
import ctypes
import glob
import importlib.util
import os


def _package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _preload(patterns):
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass  # a missing optional library shows up as a clear ImportError of _C instead


# OpenBLAS's idle threads spin for 2^28 cycles (~0.1 s) after each threaded GEMM before they sleep;
# on a small machine they then take the cores the CPU kernels' own threads need between GEMMs
# (docs/cpu.md: tiny preset on 2 cores, 8,811 -> 11,305 tok/s). 2^4 cycles: they sleep at once.
# OpenBLAS reads it when it loads (here), so it is set before; a value the user set is kept.
OPENBLAS_THREAD_TIMEOUT = "4"


def preload():
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
    blas = _package_dir("scipy_openblas32")
    if blas:
        _preload([os.path.join(blas, "lib", "libscipy_openblas*.so*")])
    for pkg, sub in (("nvidia.cu13", "lib"), ("nvidia.cublas", "lib"), ("nvidia.nccl", "lib")):
        root = _package_dir(pkg)
        if root:
            _preload([os.path.join(root, sub, "libcublasLt.so*"), os.path.join(root, sub, "libcublas.so*"),
                      os.path.join(root, sub, "libnccl.so*")])
