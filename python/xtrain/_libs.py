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


def preload():
    blas = _package_dir("scipy_openblas32")
    if blas:
        _preload([os.path.join(blas, "lib", "libscipy_openblas*.so*")])
    for pkg, sub in (("nvidia.cu13", "lib"), ("nvidia.cublas", "lib"), ("nvidia.nccl", "lib")):
        root = _package_dir(pkg)
        if root:
            _preload([os.path.join(root, sub, "libcublasLt.so*"), os.path.join(root, sub, "libcublas.so*"),
                      os.path.join(root, sub, "libnccl.so*")])
