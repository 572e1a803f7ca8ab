"""BFS-PO inside other training frameworks. Above every layer of bfspo: it may import the method
(bfspo.algorithm), the tasks, the rollout and the training config, and nothing below imports it, so
`import bfspo` and `bfspo train` never need a framework's package (tests/test_trl_integration.py)."""
