"""fleettune inference engine: GGUF models on NumPy, Vulkan and CUDA backends behind one op
contract, with validate and bench."""

__version__ = "0.1.0"
