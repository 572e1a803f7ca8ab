"""BFS-PO: Best-First Search Policy Optimization (reference implementation)."""

__version__ = "0.1.0"
