"""`bfspo evaluate` and the metrics of the paper's tables (accuracy intervals, AES)."""
