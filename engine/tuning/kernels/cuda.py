"""cuda backend kernel declarations (filled in by the cuda backend)."""
