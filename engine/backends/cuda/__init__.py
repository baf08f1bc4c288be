"""The CUDA backend (CuPy + NVRTC kernels from shaders/cuda). CuPy is imported when a backend is
created, not here, so this package imports on any machine; creating one without CuPy or a GPU
raises BackendUnavailable."""

from engine.backends.cuda.backend import CudaBackend, CudaWeight

__all__ = ["CudaBackend", "CudaWeight"]
