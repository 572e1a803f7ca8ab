"""The method itself, as pure functions: the search tree and Algorithm 1, rewards (Eq. 3-4, 8),
advantages (Eq. 1, 9), the loss (Eq. 2, 10) and tree-packed log-probs."""
