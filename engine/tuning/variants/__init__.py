"""Kernel declarations, one module per backend. Importing one registers its kernels."""
